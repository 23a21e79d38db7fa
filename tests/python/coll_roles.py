"""Rank bodies of the collective tests (a module of its own so `accord.run`'s spawned children
can import it). Each rank derives every rank's input from its rank number, so it can compute
the numpy reference of every collective itself and assert on its own result."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

import accord

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64]
OPS = ["sum", "max", "min", "prod", "avg"]
COUNT = 12  # elements per block; a multiple of 2 and 3 so every world splits it evenly
TIMEOUT_S = 20.0


def inputs(rank: int, dtype: Any, count: int) -> np.ndarray:
    # Small integers (1..4) so sums and products are exact in every dtype, f16 included.
    values = np.random.default_rng(1000 + rank).integers(1, 5, count)
    if rank % 2:
        values = -values  # negative values too, for min/max and truncating integer avg
    return values.astype(dtype)


def reference(op: str, arrays: list[np.ndarray]) -> np.ndarray:
    stack = np.stack([a.astype(np.float64) for a in arrays])
    dtype = arrays[0].dtype
    if op == "sum":
        out = stack.sum(0)
    elif op == "prod":
        out = stack.prod(0)
    elif op == "min":
        out = stack.min(0)
    elif op == "max":
        out = stack.max(0)
    else:
        total = stack.sum(0)
        out = np.trunc(total / len(arrays)) if np.issubdtype(dtype, np.integer) else total / len(arrays)
    return out.astype(dtype)


def check(what: str, got: np.ndarray, want: np.ndarray) -> None:
    if np.issubdtype(want.dtype, np.floating):
        ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-3, atol=1e-3)
    else:
        ok = bool((got == want).all())
    assert ok and got.dtype == want.dtype, f"{what}: got {got}, want {want}"


def every_collective() -> int:
    """Runs every collective over every dtype (and op) and checks it; returns the count checked."""
    checked = 0
    with accord.Communicator(timeout=TIMEOUT_S) as comm:
        rank, n = comm.rank, comm.world_size
        assert (rank, n) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
        for dtype in DTYPES:
            name = np.dtype(dtype).name
            everyone = [inputs(r, dtype, COUNT) for r in range(n)]
            for op in OPS:
                a = everyone[rank].copy()
                comm.all_reduce(a, op)
                check(f"all_reduce {name} {op}", a, reference(op, everyone))
                a = everyone[rank].copy()
                comm.all_reduce(a, op, algo="direct")
                check(f"all_reduce direct {name} {op}", a, reference(op, everyone))
                root = (checked + 1) % n
                a = everyone[rank].copy()
                comm.reduce(a, root, op)
                check(f"reduce {name} {op}", a, reference(op, everyone) if rank == root else everyone[rank])
                out = np.zeros(COUNT // n, dtype)
                comm.reduce_scatter(everyone[rank], out, op)
                block = slice(rank * (COUNT // n), (rank + 1) * (COUNT // n))
                check(f"reduce_scatter {name} {op}", out, reference(op, everyone)[block])
                checked += 3
            for root in range(n):
                a = everyone[rank].copy() if rank == root else np.zeros(COUNT, dtype)
                comm.broadcast(a, root)
                check(f"broadcast {name} from {root}", a, everyone[root])
            out = np.zeros(COUNT * n, dtype)
            comm.all_gather(everyone[rank], out)
            check(f"all_gather {name}", out, np.concatenate(everyone))
            # In place (the input is this rank's block of the output), with every schedule.
            for algo in ("ring", "recursive_doubling", "bruck", "direct"):
                out = np.zeros(COUNT * n, dtype)
                mine = out[rank * COUNT : (rank + 1) * COUNT]
                mine[:] = everyone[rank]
                comm.all_gather(mine, out, algo=algo)
                check(f"all_gather in place {name} {algo}", out, np.concatenate(everyone))
            checked += 3
            out = np.zeros(COUNT, dtype)
            comm.all_to_all(everyone[rank], out)
            b = COUNT // n
            want = np.concatenate([everyone[j][rank * b : (rank + 1) * b] for j in range(n)])
            check(f"all_to_all {name}", out, want)
            # A ring shift with send/recv: even ranks send first, odd ones receive first.
            right, left = (rank + 1) % n, (rank - 1) % n
            got = np.zeros(COUNT, dtype)
            if rank % 2 == 0:
                comm.send(everyone[rank], right)
                comm.recv(got, left)
            else:
                comm.recv(got, left)
                comm.send(everyone[rank], right)
            check(f"send/recv {name}", got, everyone[left])
            checked += n + 3
        # Multi-dimensional arrays and an explicit algorithm choice.
        grid = np.full((3, 4), rank + 1, np.float32)
        comm.all_reduce(grid, "sum", algo="ring")
        check("all_reduce 2-d ring", grid, np.full((3, 4), n * (n + 1) / 2, np.float32))
        comm.barrier()
    assert comm.closed
    return checked + 1


def misuse() -> list[str]:
    """Every wrong call raises before anything is sent; the communicator still works after."""
    raised = []
    comm = accord.Communicator(timeout=TIMEOUT_S)
    n = comm.world_size
    good = np.ones(6, np.float32)
    read_only = np.ones(6, np.float32)
    read_only.setflags(write=False)
    wrong = [
        ("read-only", lambda: comm.all_reduce(read_only), accord.InvalidBufferError),
        ("strided", lambda: comm.all_reduce(np.ones(12, np.float32)[::2]), accord.InvalidBufferError),
        ("dtype", lambda: comm.all_reduce(np.ones(6, np.uint32)), accord.InvalidBufferError),
        ("objects", lambda: comm.all_reduce(np.array([1, "a"], dtype=object)), accord.InvalidBufferError),
        ("empty", lambda: comm.all_reduce(np.ones(0, np.float32)), accord.InvalidBufferError),
        ("list", lambda: comm.all_reduce([1.0, 2.0]), accord.InvalidBufferError),
        ("op", lambda: comm.all_reduce(good, "median"), accord.InvalidRequestError),
        ("algo", lambda: comm.all_reduce(good, algo="bogus"), accord.InvalidRequestError),
        ("root", lambda: comm.broadcast(good, n), accord.InvalidRequestError),
        ("peer", lambda: comm.send(good, comm.rank), accord.InvalidRequestError),
        ("gather size", lambda: comm.all_gather(good, np.zeros(6, np.float32)), accord.InvalidBufferError),
        ("gather dtype", lambda: comm.all_gather(good, np.zeros(6 * n, np.float64)), accord.InvalidBufferError),
        ("scatter size", lambda: comm.reduce_scatter(good, np.zeros(6, np.float32)), accord.InvalidBufferError),
        ("a2a size", lambda: comm.all_to_all(good, np.zeros(5, np.float32)), accord.InvalidBufferError),
        ("a2a blocks", lambda: comm.all_to_all(np.ones(7, np.float32), np.zeros(7, np.float32)), accord.InvalidBufferError),
        # The other byte order: its elements would be summed as other numbers.
        ("byte order", lambda: comm.all_reduce(np.ones(6, np.dtype(np.float32).newbyteorder("S"))), accord.InvalidBufferError),
    ]
    for name, call, cls in wrong:
        try:
            call()
        except cls as e:
            assert str(e), name
            raised.append(name)
    # Nothing was sent: the next collective matches on every rank.
    a = np.full(6, comm.rank, np.int64)
    comm.all_reduce(a)
    assert (a == sum(range(n))).all()
    comm.close()
    comm.close()  # idempotent
    try:
        comm.barrier()
    except accord.ShutdownError:
        raised.append("closed")
    return raised


def explicit_arguments(port: int) -> tuple[int, int]:
    """The torchrun variables are absent; the constructor's arguments describe the job."""
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        os.environ.pop(name, None)
    with accord.Communicator(rank, n, "127.0.0.1", port, timeout=TIMEOUT_S) as comm:
        a = np.array([rank + 1], np.int32)
        comm.all_reduce(a)
        assert "RANK" not in os.environ
        return comm.rank, int(a[0])


def one_rank_raises(bad: int) -> int:
    """Rank `bad` raises; the others wait in a barrier for it (accord.run ends them)."""
    comm = accord.Communicator(timeout=TIMEOUT_S)
    if comm.rank == bad:
        raise ValueError(f"rank {bad} gives up")
    comm.barrier()
    return comm.rank


def exits_with(code: int) -> None:
    if int(os.environ["RANK"]) == 1:
        os._exit(code)


def environment() -> dict[str, str]:
    names = (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "ACCORD_JOB_SECRET",
    )
    return {k: os.environ[k] for k in names}


def peer_timeout() -> str:
    """Rank 1 never joins the all_reduce: rank 0's call times out naming it."""
    comm = accord.Communicator(timeout=2.0)
    if comm.rank == 0:
        try:
            comm.all_reduce(np.ones(4, np.float32))
        except (accord.TimeoutError, accord.PeerError) as e:
            return f"{type(e).__name__}: {e}"
        return "no error"
    import time

    time.sleep(4.0)
    return "slept"


def in_place_on_the_main_thread() -> tuple[bool, bool, list[float], str]:
    """``interruptible`` defaults to on; turned off, calls from the main thread run in place
    (no helper thread) and still give the right results, and a missing peer still times out
    naming it (the wait stays bounded without the interruptible helper)."""
    comm = accord.Communicator(timeout=2.0)
    default = comm.interruptible
    comm.interruptible = False
    data = np.full(4, comm.rank + 1, np.float32)
    comm.all_reduce(data)
    comm.barrier()
    if comm.rank == 0:
        try:
            comm.all_reduce(np.ones(4, np.float32))
            timed_out = "no error"
        except (accord.TimeoutError, accord.PeerError) as e:
            timed_out = f"{type(e).__name__}: {e}"
    else:
        import time

        time.sleep(4.0)
        timed_out = "slept"
    return default, comm.interruptible, [float(x) for x in data], timed_out


def turns_from_two_threads() -> int:
    """With ``_set_wait_turn(True)`` (what ``accord.torch`` sets), a call that finds another
    thread's call running waits for it instead of raising: two threads, 40 all_reduces each on
    one communicator, all complete with the right sums (every array holds ones, so whichever
    call of a peer the k-th call pairs with, the sum is the world size)."""
    import threading

    comm = accord.Communicator(timeout=30.0)
    comm.interruptible = False
    comm._set_wait_turn(True)
    done: list[int] = []
    failures: list[BaseException] = []

    def calls() -> None:
        data = np.ones(1 << 12, np.float32)
        try:
            for _ in range(40):
                data[:] = 1.0
                comm.all_reduce(data)
                assert (data == comm.world_size).all(), data[:4]
                done.append(1)
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=calls) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures, failures
    comm.close()
    return len(done)


def variable_blocks() -> int:
    """all_to_allv with uneven blocks (rank i sends i + j + 1 elements to rank j), packed and
    with explicit gaps, and send_recv as a ring shift in both directions at once."""
    checked = 0
    with accord.Communicator(timeout=TIMEOUT_S) as comm:
        rank, n = comm.rank, comm.world_size

        def block(src: int, dst: int) -> np.ndarray:
            # What rank src sends to rank dst: values that name both ends.
            return (np.arange(src + dst + 1) + 100 * src + 10 * dst).astype(np.int32)

        send_counts = [rank + j + 1 for j in range(n)]
        recv_counts = [i + rank + 1 for i in range(n)]
        packed = np.concatenate([block(rank, j) for j in range(n)])
        out = np.zeros(sum(recv_counts), np.int32)
        comm.all_to_allv(packed, out, send_counts, recv_counts)
        check("all_to_allv packed", out, np.concatenate([block(i, rank) for i in range(n)]))
        # The same exchange with a gap of 3 elements before every received block.
        recv_displs = [sum(recv_counts[:i]) + 3 * (i + 1) for i in range(n)]
        gapped = np.full(sum(recv_counts) + 3 * n, -1, np.int32)
        comm.all_to_allv(packed, gapped, send_counts, recv_counts, recv_displs=recv_displs)
        for i in range(n):
            got = gapped[recv_displs[i] : recv_displs[i] + recv_counts[i]]
            check(f"all_to_allv gapped from {i}", got, block(i, rank))
            gap = gapped[recv_displs[i] - 3 : recv_displs[i]]
            assert (gap == -1).all(), f"all_to_allv wrote into the gap before block {i}: {gap}"
        checked += 2
        if n > 1:
            right, left = (rank + 1) % n, (rank - 1) % n
            mine = np.full(5, rank, np.float64)
            got = np.zeros(5, np.float64)
            comm.send_recv(mine, right, got, left)
            check("send_recv ring shift", got, np.full(5, left, np.float64))
            checked += 1
    return checked


def bfloat16_collectives() -> int:
    """all_reduce, all_gather and broadcast of ml_dtypes.bfloat16 arrays (exact small integers)."""
    import ml_dtypes

    bf16 = ml_dtypes.bfloat16
    checked = 0
    with accord.Communicator(timeout=TIMEOUT_S) as comm:
        rank, n = comm.rank, comm.world_size
        everyone = [inputs(r, np.float32, COUNT).astype(bf16) for r in range(n)]
        for op in OPS:
            a = everyone[rank].copy()
            comm.all_reduce(a, op)
            want = reference(op, [e.astype(np.float32) for e in everyone])
            assert a.dtype == bf16 and np.allclose(a.astype(np.float64), want, rtol=1e-2), (op, a, want)
            checked += 1
        out = np.zeros(COUNT * n, bf16)
        comm.all_gather(everyone[rank], out)
        assert (out.astype(np.float32) == np.concatenate(everyone).astype(np.float32)).all(), out
        a = everyone[rank].copy() if rank == 0 else np.zeros(COUNT, bf16)
        comm.broadcast(a, 0)
        assert (a.astype(np.float32) == everyone[0].astype(np.float32)).all(), a
        checked += 2
    return checked


def all_to_allv_misuse() -> list[str]:
    """Wrong counts and displacements raise before anything is sent."""
    raised = []
    with accord.Communicator(timeout=TIMEOUT_S) as comm:
        n, rank = comm.world_size, comm.rank
        a = np.ones(4 * n, np.float32)
        out = np.zeros(4 * n, np.float32)
        fours = [4] * n
        wrong = [
            ("entries", lambda: comm.all_to_allv(a, out, [4] * (n + 1), fours)),
            ("past end", lambda: comm.all_to_allv(a, out, [5] * n, [5] * n)),
            ("displ past end", lambda: comm.all_to_allv(a, out, fours, fours, recv_displs=[4 * n] * n)),
            ("overlap", lambda: comm.all_to_allv(a, out, fours, fours, recv_displs=[0] * n)),
            ("kept block", lambda: comm.all_to_allv(a, out, fours, [3 if i == rank else 4 for i in range(n)])),
            ("dtype", lambda: comm.all_to_allv(a, out.astype(np.float64), fours, fours)),
            ("send_recv size", lambda: comm.send_recv(a, (rank + 1) % n, out[:3], (rank - 1) % n)),
            ("send_recv self", lambda: comm.send_recv(a, rank, out, (rank - 1) % n)),
        ]
        for name, call in wrong:
            try:
                call()
            except (accord.InvalidBufferError, accord.InvalidRequestError) as e:
                assert str(e), name
                raised.append(name)
        # Nothing was sent: a good call still matches on every rank.
        comm.all_to_allv(a, out, fours, fours)
        assert (out == 1).all()
    return raised


def torch_tensors() -> list[str]:
    """torch CPU tensors of float32 and bfloat16 (in place, results visible in the tensor), and
    the clear refusal of a CUDA tensor when a GPU is present."""
    import torch

    done = []
    with accord.Communicator(timeout=TIMEOUT_S) as comm:
        rank, n = comm.rank, comm.world_size
        for dtype in (torch.float32, torch.bfloat16):
            t = torch.full((4, 3), float(rank + 1), dtype=dtype)
            comm.all_reduce(t)
            assert t.dtype == dtype and torch.equal(t, torch.full((4, 3), n * (n + 1) / 2, dtype=dtype)), t
            done.append(str(dtype))
        if torch.cuda.is_available():
            try:
                comm.all_reduce(torch.ones(4, device="cuda"))
            except accord.InvalidBufferError as e:
                assert "GPU" in str(e), e
                done.append("cuda refused")
    return done


def torch_tensor_forms() -> list[str]:
    """The forms of torch CPU tensor a call reads: a plain tensor (read through its own
    accessors, registered where it is and cached), one of another dtype and shape, one that
    requires grad, a Parameter (a subclass, read through numpy), an input overlapping its
    output (staged, the byte view made on demand), and the clear refusals of strided,
    negative-view and sparse (COO and CSR) tensors."""
    import torch

    done = []
    with accord.Communicator(timeout=TIMEOUT_S) as comm:
        rank, n = comm.rank, comm.world_size
        total = n * (n + 1) / 2
        plain = torch.full((1024,), float(rank + 1))
        comm.all_reduce(plain)
        comm.all_reduce(plain)
        entries, _, hits, misses = comm._registration_stats()
        assert torch.equal(plain, torch.full((1024,), total * n)), plain
        assert (entries, hits, misses) == (1, 1, 1), comm._registration_stats()
        done.append("plain, cached")
        ints = torch.full((8, 4), rank + 1, dtype=torch.int64)
        comm.all_reduce(ints, "max")
        assert torch.equal(ints, torch.full((8, 4), n, dtype=torch.int64)), ints
        done.append("int64 2-D")
        grad = torch.full((16,), float(rank + 1), requires_grad=True)
        with torch.no_grad():
            comm.all_reduce(grad)
        assert torch.equal(grad.detach(), torch.full((16,), total)), grad
        done.append("requires grad")
        param = torch.nn.Parameter(torch.full((16,), float(rank + 1)))
        comm.all_reduce(param.data)
        comm.all_reduce(param)
        assert torch.equal(param.detach(), torch.full((16,), total * n)), param
        done.append("parameter")
        # The input a slice of the output, one element off this rank's block: they overlap, so
        # the call copies both through staging, reading and writing the tensors' bytes.
        staged = torch.zeros(4 * n + 4)
        staged[4 * rank + 1 : 4 * rank + 5] = float(rank + 1)
        misses = comm._registration_stats()[3]
        comm.all_gather(staged[4 * rank + 1 : 4 * rank + 5], staged[:-4])
        assert comm._registration_stats()[3] == misses, "staged: nothing registered"
        assert torch.equal(staged[: 4 * n], torch.arange(1, n + 1).float().repeat_interleave(4)), staged
        done.append("overlapping, staged")
        refused = (
            ("strided", torch.ones(16)[::2]),
            ("negative view", torch._neg_view(torch.ones(4))),
            ("sparse", torch.ones(4).to_sparse()),
            ("sparse csr", torch.ones(2, 2).to_sparse_csr()),
        )
        for name, bad in refused:
            try:
                comm.all_reduce(bad)
            except accord.InvalidBufferError:
                done.append(f"{name} refused")
        comm.barrier()
    return done


def element_types_read_both_ways() -> list[str]:
    """Every element type collectives take, through both of the binding's array readers: a
    read-only input is read through its memoryview's struct format (and staged), the writable
    output through numpy's ``__array_interface__`` typestr. An all_gather of each returns the
    ranks' blocks exactly."""
    done = []
    with accord.Communicator(timeout=TIMEOUT_S) as comm:
        rank, n = comm.rank, comm.world_size
        for dtype in (np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64):
            block = np.arange(4, dtype=dtype) + rank + 1
            block.flags.writeable = False
            out = np.zeros(4 * n, dtype)
            comm.all_gather(block, out)
            want = np.concatenate([np.arange(4, dtype=dtype) + r + 1 for r in range(n)])
            assert np.array_equal(out, want), (np.dtype(dtype).name, out)
            done.append(np.dtype(dtype).name)
    return done


def registrations_in_place() -> list[str]:
    """Writable arrays are registered where they are and cached: repeated calls hit the cache,
    results land in the caller's memory (a slice's neighbours untouched), a cached array stays
    alive after the program drops it and is released by close, an array used once is let go once
    newer once-used arrays pass 64 MiB while arrays used again stay, the cache stays bounded, an
    all_gather whose input is this rank's block of its output runs there, and the staged cases
    (a read-only input, a non-root's reduce) still give the right results without touching what
    they must not."""
    import gc
    import weakref

    done = []
    comm = accord.Communicator(timeout=TIMEOUT_S)
    rank, n = comm.rank, comm.world_size
    total = n * (n + 1) / 2

    a = np.full(1024, rank + 1, dtype=np.float32)
    for i in range(3):
        a[:] = rank + 1
        comm.all_reduce(a)
        assert (a == total).all(), a
    entries, nbytes, hits, misses = comm._registration_stats()
    assert (entries, nbytes, hits, misses) == (1, 4096, 2, 1), comm._registration_stats()
    done.append("cached")

    big = np.arange(16, dtype=np.float64)
    comm.all_reduce(big[4:8])
    want = np.arange(16, dtype=np.float64)
    want[4:8] *= n
    assert (big == want).all(), big
    done.append("slice in place")

    out = np.zeros(4 * n, dtype=np.int32)
    inp = out[rank * 4 : (rank + 1) * 4]
    inp[:] = rank + 1
    misses = comm._registration_stats()[3]
    comm.all_gather(inp, out)
    assert (out == np.repeat(np.arange(1, n + 1, dtype=np.int32), 4)).all(), out
    assert comm._registration_stats()[3] == misses + 1, "in place: the output alone is registered"
    done.append("input inside output")

    frozen = np.frombuffer(np.full(4, rank + 1, dtype=np.int64).tobytes(), dtype=np.int64)
    gathered = np.zeros(4 * n, dtype=np.int64)
    comm.all_gather(frozen, gathered)
    assert (gathered == np.repeat(np.arange(1, n + 1), 4)).all(), gathered
    done.append("read-only input")

    mine = np.full(8, rank + 1, dtype=np.float32)
    comm.reduce(mine, 0)
    assert (mine == (total if rank == 0 else rank + 1)).all(), mine
    done.append("non-root reduce untouched")

    # From another thread (as the torch backend's worker calls it): run inline, same result.
    import threading

    other = np.full(32, rank + 1, dtype=np.float64)
    failed: list[BaseException] = []

    def reduce_there() -> None:
        try:
            comm.all_reduce(other)
        except BaseException as e:  # noqa: BLE001 - reported below
            failed.append(e)

    worker = threading.Thread(target=reduce_there)
    worker.start()
    worker.join(TIMEOUT_S * 2)
    assert not worker.is_alive() and not failed and (other == total).all(), (failed, other)
    done.append("from another thread")

    before = comm._registration_stats()[3]
    shared = np.full(8, rank + 1, dtype=np.float32)
    comm.broadcast(shared, 0)
    assert (shared == 1).all(), shared
    assert comm._registration_stats()[3] == before + 1, "the root's array is registered in place too"
    done.append("broadcast in place")

    dropped = np.full(64, rank + 1, dtype=np.float32)
    comm.all_reduce(dropped)
    alive = weakref.ref(dropped)
    del dropped
    gc.collect()
    assert alive() is not None, "a cached registration must keep its array alive"
    first = np.full(8 << 20, 1.0, dtype=np.float32)  # 32 MiB, used once
    comm.all_reduce(first)
    first_alive = weakref.ref(first)
    del first
    for _ in range(3):
        comm.all_reduce(np.full(8 << 20, 1.0, dtype=np.float32))
    gc.collect()
    assert first_alive() is None, "an array used once stays cached only while newer ones hold < 64 MiB"
    hits = comm._registration_stats()[2]
    a[:] = rank + 1
    comm.all_reduce(a)
    assert comm._registration_stats()[2] == hits + 1, "an array used again stays cached"
    done.append("once-used arrays let go")
    for i in range(80):
        comm.all_reduce(np.full(16 + i, 1.0, dtype=np.float32))
    entries, _, _, _ = comm._registration_stats()
    assert entries <= 64, entries
    done.append("bounded")
    comm.close()
    gc.collect()
    assert alive() is None, "close releases every cached array"
    done.append("released by close")
    return done
