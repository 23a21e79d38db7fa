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
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
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
