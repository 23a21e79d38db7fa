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


def host_tensor_ops_match_gloo() -> dict[str, int]:
    """all_gather_into_tensor (out of place and in place), reduce_scatter_tensor (every reduce
    op) and all_to_all_single (even and uneven splits), every host dtype, each on tensors used
    twice: the first call registers them (Python), the second runs compiled; both must equal
    what Gloo gives. Then wrong sizes: refused with the Python path's clear error."""
    _init_gloo()
    rank, n = dist.get_rank(), dist.get_world_size()
    acc = dist.new_group(backend="accord", timeout=TIMEOUT)
    compared, calls = 0, 0
    before = _native_ops(acc)

    def twice(run: Any, want: torch.Tensor, got: torch.Tensor, what: Any) -> None:
        nonlocal compared, calls
        for _ in range(2):
            run()
            assert torch.equal(got, want), (what, got[:8].tolist(), want[:8].tolist())
            compared += 1
        calls += 1

    # Rows rank r sends to rank j (uneven, every pair different from its mirror).
    def rows(r: int, j: int) -> int:
        return (r + 2 * j) % n + 1

    for salt, dtype in enumerate(DTYPES):
        part = _inputs(rank, dtype, (6,), salt)
        parts = [torch.empty_like(part) for _ in range(n)]
        dist.all_gather(parts, part)
        gathered = torch.cat(parts)
        out = torch.empty(6 * n, dtype=dtype)
        twice(lambda: dist.all_gather_into_tensor(out, part, group=acc), gathered, out, ("all_gather", dtype))
        # In place: the input is this rank's block of the output.
        whole = torch.zeros(6 * n, dtype=dtype)
        mine = whole[rank * 6 : (rank + 1) * 6]

        def in_place() -> None:
            whole.zero_()
            mine.copy_(part)
            dist.all_gather_into_tensor(whole, mine, group=acc)

        twice(in_place, gathered, whole, ("all_gather in place", dtype))
        for op in _reduce_ops(dtype):
            full = _inputs(rank, dtype, (4 * n,), salt + 100)
            reduced = full.clone()
            dist.all_reduce(reduced, op=op)
            block = torch.empty(4, dtype=dtype)
            want = reduced[rank * 4 : (rank + 1) * 4].clone()
            twice(lambda: dist.reduce_scatter_tensor(block, full, op=op, group=acc), want, block, ("rs", dtype, op))
        src = _inputs(rank, dtype, (3 * n, 2), salt + 200)
        even_want = torch.empty_like(src)
        dist.all_to_all_single(even_want, src)
        even = torch.empty_like(src)
        twice(lambda: dist.all_to_all_single(even, src, group=acc), even_want, even, ("all_to_all", dtype))
        send_rows = [rows(rank, j) for j in range(n)]
        recv_rows = [rows(i, rank) for i in range(n)]
        usrc = _inputs(rank, dtype, (sum(send_rows), 3), salt + 300)
        uneven_want = torch.empty(sum(recv_rows), 3, dtype=dtype)
        dist.all_to_all_single(uneven_want, usrc, recv_rows, send_rows)
        uneven = torch.empty_like(uneven_want)
        twice(
            lambda: dist.all_to_all_single(uneven, usrc, recv_rows, send_rows, group=acc),
            uneven_want,
            uneven,
            ("all_to_all uneven", dtype),
        )
    native = _native_ops(acc) - before
    # One tensor registered, the other new: the compiled backend declines (nothing of it counts
    # as a hit), Python registers the new one, and the next call runs compiled.
    part = _inputs(rank, torch.float32, (6,), 7)
    dist.all_gather_into_tensor(torch.empty(6 * n), part, group=acc)  # registers part
    fresh = torch.empty(6 * n)
    mark = _native_ops(acc)
    dist.all_gather_into_tensor(fresh, part, group=acc)
    declined_first = _native_ops(acc) == mark
    dist.all_gather_into_tensor(fresh, part, group=acc)
    compiled_second = _native_ops(acc) == mark + 1
    refused = 0
    short = torch.empty(5)
    for bad in (
        lambda: dist.all_gather_into_tensor(short, torch.ones(2), group=acc),
        lambda: dist.reduce_scatter_tensor(torch.empty(2), short, group=acc),
        lambda: dist.all_to_all_single(torch.empty(2 * n), torch.ones(2 * n), [1] * n, [2] * n, group=acc),
    ):
        try:
            bad()
        except Exception as e:  # noqa: BLE001 - the message is checked
            refused += int("accord backend" in str(e))
    # Sizes that differ across ranks, each rank's tensors registered (by two matched calls), so
    # the mismatched call runs compiled: an accord error naming the disagreement, not a hang.
    import datetime

    import accord

    mm = dist.new_group(backend="accord", timeout=datetime.timedelta(seconds=3))
    pairs = {k: (torch.ones(k), torch.empty(k * n)) for k in (4, 5)}
    for small, big in pairs.values():
        dist.all_gather_into_tensor(big, small, group=mm)
    small, big = pairs[4 + rank % 2]
    failures = mm._native.native_failures()
    try:
        dist.all_gather_into_tensor(big, small, group=mm)
        mismatch = "no error"
    except accord.AccordError as e:
        compiled = mm._native.native_failures() == failures + 1
        mismatch = f"{type(e).__name__} compiled={compiled}: {e}"
    dist.barrier()  # on Gloo: no rank leaves while another still waits in the failed call
    dist.destroy_process_group()
    return {
        "compared": compared,
        "calls": calls,
        "native": native,
        "refused": refused,
        "half_registered": [declined_first, compiled_second],
        "mismatch": mismatch,
    }
