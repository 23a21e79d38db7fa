"""Rank bodies of the compiled backend's tests (accord._torch_native; a module of its own so
`accord.run`'s spawned children can import it).

Each rank joins a Gloo default group, makes an "accord" group over the same store, and checks
that the all_reduces the compiled backend runs without Python (a synchronous all_reduce of a CPU
tensor used before) give Gloo's results, count as such, and stay in call order with the ops the
Python backend queues, defers or refuses.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch_roles import DTYPES, TIMEOUT, _init_gloo, _inputs, _reduce_ops


def _native_ops(group: Any) -> int:
    """CPU all_reduces the group's compiled backend ran (see accord.torch._NativeProcessGroup)."""
    return int(group._native_ops()[1])


def host_all_reduce_matches_gloo() -> dict[str, int]:
    """Every host dtype and reduce op, each on a tensor used twice: the first call registers it
    (Python), the second runs compiled; both must equal Gloo's result."""
    _init_gloo()
    rank = dist.get_rank()
    acc = dist.new_group(backend="accord", timeout=TIMEOUT)
    assert type(acc).__name__ == "_NativeProcessGroup", type(acc)
    compared = 0
    before = _native_ops(acc)
    calls = 0
    for salt, dtype in enumerate(DTYPES):
        for op in _reduce_ops(dtype):
            x = _inputs(rank, dtype, (1000,), salt)
            want = x.clone()
            dist.all_reduce(want, op=op)
            got = x.clone()
            for _ in range(2):
                got.copy_(x)
                dist.all_reduce(got, op=op, group=acc)
                assert torch.equal(got, want), (dtype, op, got[:8].tolist(), want[:8].tolist())
                compared += 1
            calls += 1
    native = _native_ops(acc) - before
    dist.destroy_process_group()
    return {"compared": compared, "calls": calls, "native": native}


def order_with_python_ops() -> dict[str, int]:
    """Async ops queued on the Python backend's worker, then a synchronous all_reduce the
    compiled backend could run: the sync op must go after them on every rank. The tensors differ
    in size, so an op run out of order would pair different ops across ranks and fail. Also a
    deferred send/recv pair before a sync all_reduce, and sync ops from two threads at once."""
    import threading

    _init_gloo()
    rank, n = dist.get_rank(), dist.get_world_size()
    acc = dist.new_group(backend="accord", timeout=TIMEOUT)
    small, big = torch.ones(7), torch.ones(1 << 16)
    dist.all_reduce(small, group=acc)  # registered from now on
    for step in range(30):
        big.fill_(rank + step)
        small.fill_(1.0)
        works = [dist.all_reduce(big, group=acc, async_op=True) for _ in range(2)]
        dist.all_reduce(small, group=acc)
        for w in works:
            w.wait()
        base = sum(r + step for r in range(n))
        assert torch.equal(small, torch.full((7,), float(n))), small
        assert torch.equal(big, torch.full((1 << 16,), float(base * n))), (step, big[:4].tolist())
    # A deferred point to point pair, then a sync all_reduce: the pair goes first.
    peer = (rank + 1) % n
    sent, received = torch.full((5,), float(rank)), torch.zeros(5)
    ops = [dist.P2POp(dist.isend, sent, peer, group=acc), dist.P2POp(dist.irecv, received, (rank - 1) % n, group=acc)]
    reqs = dist.batch_isend_irecv(ops)
    small.fill_(1.0)
    dist.all_reduce(small, group=acc)
    for r in reqs:
        r.wait()
    assert torch.equal(received, torch.full((5,), float((rank - 1) % n))), received
    assert torch.equal(small, torch.full((7,), float(n)))
    # Two threads, each with its own group, calling at once: each group's ops stay ordered.
    groups = [dist.new_group(backend="accord", timeout=TIMEOUT) for _ in range(2)]
    failures: list[BaseException] = []

    def hammer(group: Any, value: float) -> None:
        t = torch.zeros(33)
        try:
            for _ in range(50):
                t.fill_(value)
                dist.all_reduce(t, group=group)
                assert torch.equal(t, torch.full((33,), value * n)), t[:4].tolist()
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=hammer, args=(g, float(i + 2))) for i, g in enumerate(groups)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not failures, failures
    native = _native_ops(acc) + sum(_native_ops(g) for g in groups)
    dist.destroy_process_group()
    return {"native": native}


def compiled_call_names_the_missing_rank() -> str:
    """A compiled all_reduce whose peer never comes: it raises accord's own TimeoutError (or
    PeerError) naming the rank, as the Python path does, within the group's timeout."""
    import datetime

    import accord

    _init_gloo()
    rank = dist.get_rank()
    lonely = dist.new_group(backend="accord", timeout=datetime.timedelta(seconds=2))
    t = torch.ones(16)
    dist.all_reduce(t, group=lonely)  # registers t (Python); the next call is compiled
    outcome = "slept"
    if rank == 0:
        failures = lonely._native.native_failures()
        try:
            dist.all_reduce(t, group=lonely)
            outcome = "no error"
        except (accord.TimeoutError, accord.PeerError) as e:
            assert lonely._native.native_failures() == failures + 1, "the compiled call raised it"
            outcome = f"{type(e).__name__}: {e}"
    dist.barrier()  # on Gloo: rank 1 stays until rank 0 gave up
    dist.destroy_process_group()
    return outcome
