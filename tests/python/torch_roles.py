"""Rank bodies of the torch.distributed backend tests (a module of its own so `accord.run`'s
spawned children can import it).

Each rank joins a Gloo default group through the torchrun variables `accord.run` sets, then
makes an "accord" group over the same c10d store, runs every op on both groups with the same
inputs and compares the results. Returns the number of comparisons made, so the parent knows
the checks ran.
"""

from __future__ import annotations

import datetime
import os
import sys
from typing import Any, Callable

import torch
import torch.distributed as dist

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int8, torch.uint8]
TIMEOUT = datetime.timedelta(seconds=30)


def _init_gloo() -> None:
    import accord.torch  # noqa: F401 - registers "accord"

    dist.init_process_group("gloo", timeout=TIMEOUT)


def _inputs(rank: int, dtype: torch.dtype, shape: tuple[int, ...], salt: int = 0) -> torch.Tensor:
    # Small integers (1..3) so sums and products are exact in every dtype, uint8 and f16 too.
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randint(1, 4, shape, generator=g).to(dtype)


class Checker:
    """Runs ``fn(group)`` on the Gloo and the accord group and compares what it returns."""

    def __init__(self, gloo: Any, accord_group: Any) -> None:
        self.gloo, self.accord = gloo, accord_group
        self.count = 0

    def same(self, what: str, fn: Callable[[Any], list[torch.Tensor]]) -> None:
        want, got = fn(self.gloo), fn(self.accord)
        assert len(want) == len(got), what
        for w, g in zip(want, got):
            assert w.dtype == g.dtype and w.shape == g.shape, (what, w, g)
            assert torch.equal(w, g), f"{what}: gloo {w.tolist()} accord {g.tolist()}"
            self.count += 1


Op = Callable[[Any, torch.device], list[torch.Tensor]]


def _reduce_ops(dtype: torch.dtype) -> list[Any]:
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
    if dtype not in (torch.float16, torch.bfloat16, torch.int8, torch.uint8):
        ops.append(dist.ReduceOp.PRODUCT)  # Gloo has no 8-bit or half product
    return ops


def _ops(rank: int, n: int, dtype: torch.dtype, salt: int) -> dict[str, Op]:
    """The ops `every_op` and `every_op_cuda` compare with Gloo: name -> fn(group, device),
    which makes its inputs on the device, runs the op on the group and returns what to compare."""

    def x(d: torch.device, shape: tuple[int, ...] = (5, 3)) -> torch.Tensor:
        return _inputs(rank, dtype, shape, salt).to(d)

    ops: dict[str, Op] = {}
    for op in _reduce_ops(dtype):

        def all_reduce(g: Any, d: torch.device, op: Any = op) -> list[torch.Tensor]:
            t = x(d)
            dist.all_reduce(t, op=op, group=g)
            return [t]

        def reduce(g: Any, d: torch.device, op: Any = op) -> list[torch.Tensor]:
            t = x(d)
            dist.reduce(t, dst=n - 1, op=op, group=g)
            return [t] if rank == n - 1 else []  # elsewhere the tensor's value is undefined

        ops[f"all_reduce {op}"] = all_reduce
        ops[f"reduce {op}"] = reduce

    def broadcast(g: Any, d: torch.device) -> list[torch.Tensor]:
        t = x(d)
        dist.broadcast(t, src=1, group=g)
        return [t]

    def all_gather(g: Any, d: torch.device) -> list[torch.Tensor]:
        outs = [torch.zeros(5, 3, dtype=dtype, device=d) for _ in range(n)]
        dist.all_gather(outs, x(d), group=g)
        return outs

    def all_gather_into_tensor(g: Any, d: torch.device) -> list[torch.Tensor]:
        out = torch.zeros(n * 4, 3, dtype=dtype, device=d)
        dist.all_gather_into_tensor(out, x(d, (4, 3)), group=g)
        return [out]

    def all_gather_into_tensor_in_place(g: Any, d: torch.device) -> list[torch.Tensor]:
        # FSDP2's form: the input is this rank's block of the output.
        out = torch.zeros(n * 4, 3, dtype=dtype, device=d)
        out[rank * 4 : (rank + 1) * 4] = x(d, (4, 3))
        dist.all_gather_into_tensor(out, out[rank * 4 : (rank + 1) * 4], group=g)
        return [out]

    def reduce_scatter(g: Any, d: torch.device) -> list[torch.Tensor]:
        out = torch.zeros(4, dtype=dtype, device=d)
        dist.reduce_scatter(out, [x(d, (4,)) + i for i in range(n)], group=g)
        return [out]

    def reduce_scatter_tensor(g: Any, d: torch.device) -> list[torch.Tensor]:
        out = torch.zeros(2, 3, dtype=dtype, device=d)
        dist.reduce_scatter_tensor(out, x(d, (2 * n, 3)), group=g)
        return [out]

    def all_to_all(g: Any, d: torch.device) -> list[torch.Tensor]:
        # Equal blocks (uneven: all_to_all_single below). Gloo in torch 2.11 (the GPU host's)
        # has no list form ("Backend gloo does not support alltoall"; 2.15 has one), so its
        # reference is the same blocks through all_to_all_single.
        ins = [x(d, (3,)) + j for j in range(n)]
        outs = [torch.zeros(3, dtype=dtype, device=d) for _ in range(n)]
        if dist.get_backend(g) == "gloo":
            out = torch.zeros(3 * n, dtype=dtype, device=d)
            dist.all_to_all_single(out, torch.cat(ins), group=g)
            return list(out.split(3))
        dist.all_to_all(outs, ins, group=g)
        return outs

    def all_to_all_single_even(g: Any, d: torch.device) -> list[torch.Tensor]:
        out = torch.zeros(2 * n, 3, dtype=dtype, device=d)
        dist.all_to_all_single(out, x(d, (2 * n, 3)), group=g)
        return [out]

    def all_to_all_single_uneven(g: Any, d: torch.device) -> list[torch.Tensor]:
        # Rank r sends (r + j) % 3 rows to rank j (some empty); receives (i + r) % 3 from i.
        send = [(rank + j) % 3 for j in range(n)]
        recv = [(i + rank) % 3 for i in range(n)]
        out = torch.zeros(sum(recv), 2, dtype=dtype, device=d)
        dist.all_to_all_single(out, x(d, (sum(send), 2)), recv, send, group=g)
        return [out]

    def gather(g: Any, d: torch.device) -> list[torch.Tensor]:
        outs = [torch.zeros(3, dtype=dtype, device=d) for _ in range(n)] if rank == 0 else None
        dist.gather(x(d, (3,)), outs, dst=0, group=g)
        return outs or []

    def scatter(g: Any, d: torch.device) -> list[torch.Tensor]:
        out = torch.zeros(3, dtype=dtype, device=d)
        dist.scatter(out, [x(d, (3,)) + i for i in range(n)] if rank == n - 1 else None, src=n - 1, group=g)
        return [out]

    def send_recv(g: Any, d: torch.device) -> list[torch.Tensor]:
        got = torch.zeros(4, dtype=dtype, device=d)
        if rank == 0:
            dist.send(x(d, (4,)), dst=1, group=g)
        elif rank == 1:
            dist.recv(got, src=0, group=g)
        return [got]

    def batch_ring(g: Any, d: torch.device) -> list[torch.Tensor]:
        # Each rank sends one tensor forward and a different-sized one backward.
        fwd, bwd = torch.zeros(3, dtype=dtype, device=d), torch.zeros(5, dtype=dtype, device=d)
        p2p = [
            dist.P2POp(dist.isend, x(d, (3,)), (rank + 1) % n, g),
            dist.P2POp(dist.irecv, fwd, (rank - 1) % n, g),
            dist.P2POp(dist.isend, x(d, (5,)), (rank - 1) % n, g),
            dist.P2POp(dist.irecv, bwd, (rank + 1) % n, g),
        ]
        for w in dist.batch_isend_irecv(p2p):
            w.wait()
        return [fwd, bwd]

    for fn in (
        broadcast,
        all_gather,
        all_gather_into_tensor,
        all_gather_into_tensor_in_place,
        reduce_scatter,
        reduce_scatter_tensor,
        all_to_all,
        all_to_all_single_even,
        all_to_all_single_uneven,
        gather,
        scatter,
        send_recv,
        batch_ring,
    ):
        ops[fn.__name__] = fn
    return ops


def every_op() -> int:
    _init_gloo()
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    acc = dist.new_group(backend="accord", timeout=TIMEOUT)
    assert dist.get_backend(acc) == "accord"
    c = Checker(gloo, acc)
    cpu = torch.device("cpu")
    for salt, dtype in enumerate(DTYPES):
        for name, fn in _ops(rank, n, dtype, salt).items():
            c.same(f"{name} {dtype}", lambda g, fn=fn: fn(g, cpu))

    # AVG: Gloo has none; compare with its SUM divided by the world size.
    t, want = _inputs(rank, torch.float64, (7,)), _inputs(rank, torch.float64, (7,))
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=acc)
    dist.all_reduce(want, group=gloo)
    assert torch.allclose(t, want / n), (t, want)
    c.count += 1

    # A non-contiguous view is reduced in place, the elements between left alone. (Gloo reduces
    # the view's span of memory instead, so the reference is Gloo on a contiguous copy.)
    base = _inputs(rank, torch.float32, (4, 6))
    want = base.clone()
    reduced = want[:, ::2].contiguous()
    dist.all_reduce(reduced, group=gloo)
    want[:, ::2] = reduced
    dist.all_reduce(base[:, ::2], group=acc)
    assert torch.equal(base, want), (base, want)
    c.count += 1

    # Async: futures carry the output tensors, and several ops can be in flight in order.
    works = []
    for i in range(4):
        t = torch.full((1000,), float(rank + i))
        works.append((t, dist.all_reduce(t, group=acc, async_op=True)))
    for i, (t, w) in enumerate(works):
        value = w.get_future().wait()
        assert value[0] is t or torch.equal(value[0], t)
        assert w.wait() and w.is_completed() and w.exception() is None
        assert torch.all(t == sum(r + i for r in range(n))), t[:3]
        c.count += 1
    fut = dist.all_reduce(torch.ones(3), group=acc, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    assert torch.equal(fut.wait(), torch.full((3,), 2.0 * n))

    # Subgroups: ranks 0 and n-1 only, each backend.
    members = [0, n - 1]
    sub_gloo = dist.new_group(members, backend="gloo")
    sub_acc = dist.new_group(members, backend="accord", timeout=TIMEOUT)
    if rank in members:
        sub = Checker(sub_gloo, sub_acc)

        def sub_all_reduce(g: Any) -> list[torch.Tensor]:
            t = _inputs(rank, torch.float32, (9,), 77)
            dist.all_reduce(t, group=g)
            return [t]

        def sub_broadcast(g: Any) -> list[torch.Tensor]:
            t = _inputs(rank, torch.int64, (4,), 78)
            dist.broadcast(t, src=n - 1, group=g)  # a global rank
            return [t]

        sub.same("subgroup all_reduce", sub_all_reduce)
        sub.same("subgroup broadcast", sub_broadcast)
        assert dist.get_world_size(sub_acc) == 2 and dist.get_rank(sub_acc) == members.index(rank)
        c.count += sub.count

    dist.barrier(group=acc)
    dist.barrier()
    dist.destroy_process_group()
    return c.count


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _train(group: Any, hook: bool) -> list[torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    ddp = DDP(_model(0), process_group=group, bucket_cap_mb=0.001)  # several buckets
    if hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(group, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(4):
        opt.zero_grad()
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in ddp.parameters()]


def ddp_matches_gloo() -> int:
    _init_gloo()
    gloo = dist.new_group(backend="gloo")
    acc = dist.new_group(backend="accord", timeout=TIMEOUT)
    want = _train(gloo, hook=False)
    compared = 0
    for hook in (False, True):
        got = _train(acc, hook)
        for w, g in zip(want, got):
            assert torch.allclose(w, g, rtol=1e-5, atol=1e-6), (hook, (w - g).abs().max())
            compared += 1
        # The ranks started from one seed but saw different data: the parameters moved together.
        assert not torch.equal(got[0], _model(0)[0].weight)
    # DDP's gradient buckets were reduced where they are, their registrations reused from step
    # to step (a staged copy would not touch the registration cache at all). DDP rebuilds its
    # buckets after the first step, so misses come first: 4 hits and 8 misses on torch 2.15.
    _, _, hits, misses = acc._get_backend(torch.device("cpu"))._comm._registration_stats()
    assert hits >= 3 and misses >= 1, (hits, misses)
    dist.barrier()
    dist.destroy_process_group()
    return compared


def held_tensors_stay_registered() -> list[str]:
    """The registration cache keeps what the program still holds, past its bound on once-used
    arrays (64 MiB), and lets go of it once the program drops it: four 32 MiB tensors in turn,
    as DDP's buckets come, held by Python and then only by C++ (parameters' gradients)."""
    import gc
    import weakref

    _init_gloo()
    acc = dist.new_group(backend="accord", timeout=TIMEOUT)
    comm = acc._get_backend(torch.device("cpu"))._comm
    done = []

    def all_reduce_each(tensors: list[torch.Tensor]) -> tuple[int, int]:
        _, _, h0, m0 = comm._registration_stats()
        for t in tensors:
            dist.all_reduce(t, group=acc)
        _, _, h1, m1 = comm._registration_stats()
        return h1 - h0, m1 - m0

    held = [torch.full((8 << 20,), float(i)) for i in range(4)]
    assert all_reduce_each(held) == (0, 4)
    assert all_reduce_each(held) == (4, 0), "held by the program: still registered"
    done.append("held by Python")

    params = [torch.nn.Parameter(torch.zeros(8 << 20)) for _ in range(4)]
    for p in params:
        p.grad = torch.ones(8 << 20)
    assert all_reduce_each([p.grad for p in params if p.grad is not None]) == (0, 4)
    assert all_reduce_each([p.grad for p in params if p.grad is not None]) == (4, 0), "held by C++"
    done.append("held by C++")

    def fresh_calls() -> None:
        for _ in range(3):
            dist.all_reduce(torch.ones(8 << 20), group=acc)  # a new tensor each, used once

    once = [torch.full((8 << 20,), 1.0) for _ in range(4)]
    all_reduce_each(once)
    watch = [weakref.ref(t) for t in once]
    fresh_calls()
    assert comm._registration_stats()[1] >= 4 * (32 << 20) + (64 << 20), "held: kept beside the fresh ones"
    del once
    gc.collect()
    fresh_calls()
    gc.collect()
    assert all(w() is None for w in watch), "used once and dropped by the program: let go at the next misses"
    done.append("let go once dropped")
    dist.barrier()
    dist.destroy_process_group()
    return done


def default_group() -> list[float]:
    """``init_process_group("accord")`` itself, from the torchrun variables."""
    import accord.torch  # noqa: F401

    dist.init_process_group("accord", timeout=TIMEOUT)
    rank, n = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "accord"
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    out = [torch.zeros(2) for _ in range(n)]
    dist.all_gather(out, torch.full((2,), float(rank)))
    _fsdp2_matches_local()
    dist.barrier()
    dist.destroy_process_group()
    return t.tolist() + torch.cat(out).tolist()


def _fsdp2_matches_local() -> None:
    """FSDP2 (fully_shard: all_gather_into_tensor, reduce_scatter_tensor) on the default
    group, every rank fed the same data, ends with the parameters of plain local training."""
    from torch.distributed.fsdp import fully_shard

    sharded, local = _model(1), _model(1)
    for layer in sharded:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(sharded)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (sharded, local)]
    g = torch.Generator().manual_seed(5)
    for _ in range(3):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        for m, opt in zip((sharded, local), opts):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
    for p, q in zip(sharded.parameters(), local.parameters()):
        full = p.full_tensor()  # type: ignore[attr-defined]
        assert torch.allclose(full, q, rtol=1e-5, atol=1e-6), (full - q).abs().max()


def errors() -> list[str]:
    """Misuse raises a clear Python exception; a rank that never joins times out, named."""
    _init_gloo()
    rank = dist.get_rank()
    acc = dist.new_group(backend="accord", timeout=TIMEOUT)
    seen: list[str] = []

    def expect(what: str, fn: Callable[[], Any], *needles: str) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - any exception type, checked by message
            message = str(e)
            assert all(n in message for n in needles), (what, message)
            seen.append(what)
        else:
            raise AssertionError(f"{what}: no exception")

    # (Not all_reduce: with the compiled backend, torch dispatches it in C++, where a meta tensor
    # gets torch's own shape-only kernel, as it does under gloo and nccl.)
    expect("wrong device", lambda: dist.broadcast(torch.ones(2, device="meta"), 0, group=acc), "meta", "cpu or cuda")
    expect("bool dtype", lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool), group=acc), "torch.bool")
    expect("band", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND, group=acc), "BAND")
    expect("wrong output size", lambda: dist.all_gather_into_tensor(torch.zeros(3), torch.ones(2), group=acc), "world_size")
    expect(
        "bad splits",
        lambda: dist.all_to_all_single(torch.zeros(4), torch.zeros(4), [1, 1], [3, 3], group=acc),
        "split sizes",
    )
    # The group still works after refused calls (nothing was sent).
    t = torch.ones(3)
    dist.all_reduce(t, group=acc)
    assert torch.equal(t, torch.full((3,), 2.0))

    # Shapes that differ across ranks: an error naming the disagreement, not a hang.
    mismatch = dist.new_group(backend="accord", timeout=datetime.timedelta(seconds=3))
    expect("mismatched count", lambda: dist.all_reduce(torch.ones(4 + rank), group=mismatch), "rank")

    # Rank 1 never calls: rank 0 times out, and the message names rank 1.
    lonely = dist.new_group(backend="accord", timeout=datetime.timedelta(seconds=2))
    if rank == 0:
        expect("timeout", lambda: dist.all_reduce(torch.ones(2), group=lonely), "rank(s) [1]")
    dist.barrier()  # on Gloo, so rank 1 stays until rank 0 gave up
    dist.destroy_process_group()
    return seen


def communicator_in_torchrun() -> None:
    """Body of the torchrun test: a plain ``accord.Communicator()`` while torchrun's agent
    holds MASTER_PORT, then a default "accord" process group."""
    import accord

    with accord.Communicator(timeout=30) as comm:
        t = torch.full((4,), float(comm.rank + 1))
        comm.all_reduce(t)
        second = accord.Communicator(timeout=30)  # a second one meets under its own keys
        u = torch.ones(2)
        second.all_reduce(u)
        second.close()
    import accord.torch  # noqa: F401

    dist.init_process_group("accord", timeout=TIMEOUT)
    v = torch.full((3,), float(dist.get_rank()))
    dist.all_reduce(v)
    dist.destroy_process_group()
    # One write per line: print() writes the text and the newline separately, and the two ranks
    # share torchrun's stdout, so their lines could interleave.
    sys.stdout.write(f"RANK {os.environ['RANK']} comm {t.tolist()} second {u.tolist()} pg {v.tolist()}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    communicator_in_torchrun()



def take_peer_descriptor() -> str | None:
    """Each rank offers a probe descriptor as the GPU path's choice does and tries its peers'
    (``accord.torch._descriptor_problem``); returns what it found (None: taken)."""
    import accord.torch as backend

    _init_gloo()
    rank, n = dist.get_rank(), dist.get_world_size()
    read_end, write_end = os.pipe()
    try:
        mine = f"E|gpu-{rank}|{os.getpid()}:{read_end}|{backend._host_identity()}"
        entries: list[Any] = [None] * n
        dist.all_gather_object(entries, mine)
        problem = backend._descriptor_problem(entries, rank)
        dist.barrier()  # every rank has tried before any closes its descriptor
    finally:
        os.close(read_end)
        os.close(write_end)
    dist.destroy_process_group()
    return problem


def gpu_choice_refused_by_one_rank() -> tuple[bool, list[str]]:
    """The GPU path's two rounds through a real group's store, without a GPU: every rank on a GPU
    of its own (faked), modules loaded eagerly, VMM memory (what the import set), and rank 1
    refused its peers' descriptors (faked). Returns what ``_start_gpu`` chose and the warnings
    this rank gave: every rank must stage, and only rank 0 warn, naming rank 1."""
    import warnings

    import accord.torch as backend

    _init_gloo()
    rank = dist.get_rank()
    group = dist.new_group(backend="accord", timeout=TIMEOUT)
    pg = group._get_backend(torch.device("cpu"))
    backend._gpu_identity = lambda index: f"gpu-of-rank-{rank}"  # type: ignore[assignment]
    if rank == 1:
        backend._descriptor_problem = lambda entries, me: "rank 0: refused (a test)"  # type: ignore[assignment]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chose = pg._start_gpu(torch.device("cuda", 0))
    said = [str(w.message) for w in caught if "accord backend" in str(w.message)]
    dist.destroy_process_group()
    return chose, said

# ---- CUDA tensors (one GPU per rank, ranks on one host): the copy-engine GPU collectives ----

CUDA_DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.float64, torch.uint8]


def every_op_cuda() -> dict[str, Any]:
    """Every op of `_ops` on CUDA tensors of an "accord" group against Gloo on CPU copies of
    the same inputs. On the GPU path (the default), float64 and 8-bit reductions (and gather,
    scatter, point to point, all_to_all with split sizes or as a list) take the staged path and
    the rest the GPU collectives; with ACCORD_TORCH_GPU=0 every op is staged. Returns how many
    tensors were compared, which path the group took, and how many CUDA ops the compiled backend
    queued."""
    _init_gloo()
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    gloo = dist.new_group(backend="gloo")
    acc = dist.new_group(backend="accord", timeout=TIMEOUT)
    cpu = torch.device("cpu")
    count = 0

    def same(what: str, fn: Callable[[Any, torch.device], list[torch.Tensor]]) -> None:
        nonlocal count
        want = fn(gloo, cpu)
        got = fn(acc, dev)
        torch.cuda.synchronize()
        assert len(want) == len(got), what
        for w, g in zip(want, got):
            assert g.device == dev, (what, g.device)
            assert torch.equal(w, g.cpu()), f"{what}: gloo {w.flatten()[:8].tolist()} accord {g.cpu().flatten()[:8].tolist()}"
            count += 1

    for salt, dtype in enumerate(CUDA_DTYPES):
        for name, fn in _ops(rank, n, dtype, salt).items():
            same(f"{name} {dtype}", fn)

    # A non-contiguous view is reduced in place, the elements between it left alone.
    base = _inputs(rank, torch.float32, (4, 6)).to(dev)
    want = base.cpu().clone()
    reduced = want[:, ::2].contiguous()
    dist.all_reduce(reduced, group=gloo)
    want[:, ::2] = reduced
    dist.all_reduce(base[:, ::2], group=acc)
    assert torch.equal(base.cpu(), want), (base, want)
    count += 1

    # Stream order: a slow producer kernel before, a consumer after, on a side stream, with
    # async_op; wait() makes the default stream wait for the collective.
    side = torch.cuda.Stream()
    big = 16 << 20  # 64 MiB of float32: several pipeline chunks
    with torch.cuda.stream(side):
        t = torch.empty(big, device=dev)
        torch.cuda._sleep(50_000_000)  # a kernel that spins, so the input arrives late
        t.fill_(float(rank + 1))
        work = dist.all_reduce(t, group=acc, async_op=True)
        fut = work.get_future()
    work.wait()
    doubled = t * 2  # on the default stream, after wait()
    total = float(sum(r + 1 for r in range(n)))
    assert torch.all(doubled == 2 * total).item(), doubled[:4]
    assert torch.equal(fut.wait()[0], t)
    assert work.is_success() and work.exception() is None
    count += 1

    # Many calls queued back to back, each into a new tensor, checked at the end.
    outs = []
    for i in range(20):
        t = torch.full((1000 + i,), float(rank * i), device=dev)
        dist.all_reduce(t, group=acc)
        outs.append((i, t))
    torch.cuda.synchronize()
    for i, t in outs:
        assert torch.all(t == float(sum(r * i for r in range(n)))).item(), (i, t[:3])
        count += 1

    backend = acc._get_backend(dev)
    path = type(backend._gpu).__name__
    registrations = backend._gpu.comm.registration_count() if path == "_GpuPath" else 0
    # CUDA ops the compiled backend queued without Python (None where it is not loaded).
    native = acc._native_ops()[0] if hasattr(acc, "_native_ops") else None
    dist.barrier(group=acc)
    dist.barrier()
    dist.destroy_process_group()
    return {"count": count, "path": path, "registrations": registrations, "native": native}


def ddp_cuda_matches_gloo() -> int:
    """DDP on CUDA with the "accord" group ends with Gloo's parameters (on CPU)."""
    _init_gloo()
    rank = dist.get_rank()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    gloo = dist.new_group(backend="gloo")
    acc = dist.new_group(backend="accord", timeout=TIMEOUT)
    from torch.nn.parallel import DistributedDataParallel as DDP

    def train(group: Any, d: torch.device) -> list[torch.Tensor]:
        model = _model(0).to(d)
        ddp = DDP(model, process_group=group, bucket_cap_mb=0.001, device_ids=[d] if d.type == "cuda" else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        for _ in range(4):
            opt.zero_grad()
            x, y = torch.randn(8, 16, generator=g).to(d), torch.randn(8, 4, generator=g).to(d)
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        return [p.detach().cpu().clone() for p in ddp.parameters()]

    want, got = train(gloo, torch.device("cpu")), train(acc, dev)
    for w, g in zip(want, got):
        assert torch.allclose(w, g, rtol=1e-4, atol=1e-5), (w - g).abs().max()
    dist.barrier()
    dist.destroy_process_group()
    return len(got)
