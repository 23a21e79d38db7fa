"""Where the torch backend's time goes on CPU (issue 20): per op, the group's own
`Communicator` called directly on the same tensors against the op through torch.distributed,
float32, 5 warm-up and 30 timed calls by default (mean per call, rank 0's clock), and what the call copied
beyond what the algorithm needs.

    python scripts/device/torch_overhead_probe.py            # accord.run, 2 ranks: one table,
                                                             # every op (--ops, --sizes, --ranks)
    python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        scripts/device/torch_overhead_probe.py --torch       # the same table in one torchrun job
    RANK=r WORLD_SIZE=2 python scripts/device/torch_overhead_probe.py --port P
                                                             # one rank launched by hand (under
                                                             # `setsid` or not): 1 MiB numpy only

Ops (`--ops`, comma list; default all): all_reduce, all_gather (all_gather_into_tensor),
reduce_scatter (reduce_scatter_tensor), a2a_even (all_to_all_single, no splits), a2a_uneven
(all_to_all_single with split sizes: rank r sends (r + j) % n + 1 parts to rank j), a2a_list
(dist.all_to_all of world_size block views of one tensor each way), a2a_list_loose (the same
with separately allocated tensors). Sizes (`--sizes`, bytes of the op's larger tensor; default
4 KiB, 1 MiB, 4 MiB, 16 MiB). The direct column is the Communicator call the backend makes
on the same memory (`all_to_allv` for every all_to_all form, even blocks included, as the
backend does on CPU), so dist - direct is the Python layer's cost. (Before stop 37's review the
even and list forms' direct call was `all_to_all`, another collective: the stop 36 rows of
docs/results/2026-11-26-torch-backend.md compare against that.)

Both columns run on Python's main thread, as a synchronous `dist.*` call now does (the backend
runs it on the calling thread; the Communicator waits on a kept helper thread there, so Ctrl-C
can interrupt it), so the helper hand-off is in both and `+us` is the Python layer alone, as in
`torch_backend_bench.py`'s `direct` column.

Columns: `direct us`, `dist us`, `+us` (dist - direct), `ratio` (direct / dist: the share of
the direct call's speed that the dist call keeps), `copied` (bytes one dist call copied beyond
the algorithm: torch copies made by the backend's Python code, found by wrapping
`Tensor.copy_`, `Tensor.contiguous`, `Tensor.clone` and `torch.cat`, plus the binding's staging
of both tensors when the call did not touch the registration cache).

Compare with `accord bench <op> --ranks 2 -b 1M -e 16M -f 4 -w 5 -n 30` in the same shell
loop (docs/results/2026-11-26-torch-backend.md)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable

SIZES = (1 << 12, 1 << 20, 4 << 20, 16 << 20)
OPS = ("all_reduce", "all_gather", "reduce_scatter", "a2a_even", "a2a_uneven", "a2a_list", "a2a_list_loose")


# Calls before and in the timing (--warmup, --iters).
WARMUP, ITERS = 5, 30


def mean_us(call: Callable[[], None], sync: Callable[[], None], warmup: int = -1, iters: int = -1) -> float:
    warmup = WARMUP if warmup < 0 else warmup
    iters = ITERS if iters < 0 else iters
    for _ in range(warmup):
        call()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - start) / iters * 1e6


class CopyCounter:
    """Counts the bytes of torch copies made while it is on (Python-level calls only: the
    backend's staging code calls these from Python)."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.bytes = 0
        self.on = False
        T = torch.Tensor
        self.saved = (T.copy_, T.contiguous, T.clone, torch.cat)
        copy_, contiguous, clone, cat = self.saved
        counter = self

        def nbytes(t: Any) -> int:
            return int(t.numel() * t.element_size())

        def copy_w(self: Any, src: Any, *a: Any, **k: Any) -> Any:
            if counter.on and self.data_ptr() != src.data_ptr():
                counter.bytes += nbytes(self)
            return copy_(self, src, *a, **k)

        def contiguous_w(self: Any, *a: Any, **k: Any) -> Any:
            out = contiguous(self, *a, **k)
            if counter.on and out.data_ptr() != self.data_ptr():
                counter.bytes += nbytes(out)
            return out

        def clone_w(self: Any, *a: Any, **k: Any) -> Any:
            out = clone(self, *a, **k)
            if counter.on:
                counter.bytes += nbytes(out)
            return out

        def cat_w(tensors: Any, *a: Any, **k: Any) -> Any:
            out = cat(tensors, *a, **k)
            if counter.on:
                counter.bytes += nbytes(out)
            return out

        T.copy_, T.contiguous, T.clone, torch.cat = copy_w, contiguous_w, clone_w, cat_w  # type: ignore[method-assign]

    def close(self) -> None:
        T = self.torch.Tensor
        T.copy_, T.contiguous, T.clone, self.torch.cat = self.saved  # type: ignore[method-assign]


def op_pair(name: str, nbytes: int, rank: int, n: int, comm: Any) -> tuple[Callable[[], None], Callable[[], None], int]:
    """(direct call, dist call, bytes the binding would stage if it copied both tensors)."""
    import torch
    import torch.distributed as dist

    elems = max(nbytes // 4 // n * n, n)
    full, part = torch.ones(elems), torch.ones(elems // n)
    out = torch.zeros(elems)
    if name == "all_reduce":
        return (lambda: comm.all_reduce(full)), (lambda: dist.all_reduce(full)), 2 * elems * 4
    if name == "all_gather":
        return (lambda: comm.all_gather(part, full)), (lambda: dist.all_gather_into_tensor(full, part)), (
            elems + elems // n
        ) * 4
    if name == "reduce_scatter":
        return (lambda: comm.reduce_scatter(full, part)), (lambda: dist.reduce_scatter_tensor(part, full)), (
            elems + elems // n
        ) * 4
    even = [elems // n] * n  # the backend runs every all_to_all form as all_to_allv on CPU
    if name == "a2a_even":
        return (lambda: comm.all_to_allv(full, out, even, even)), (lambda: dist.all_to_all_single(out, full)), 2 * elems * 4
    if name == "a2a_uneven":
        # Rank r sends (r + j) % n + 1 parts to rank j, receives (i + r) % n + 1 from rank i.
        unit = max(elems // (n * (n + 1) // 2 * n), 1)
        send = [((rank + j) % n + 1) * unit for j in range(n)]
        recv = [((i + rank) % n + 1) * unit for i in range(n)]
        src, dst = torch.ones(sum(send)), torch.zeros(sum(recv))
        return (
            (lambda: comm.all_to_allv(src, dst, send, recv)),
            (lambda: dist.all_to_all_single(dst, src, recv, send)),
            (sum(send) + sum(recv)) * 4,
        )
    if name in ("a2a_list", "a2a_list_loose"):
        block = elems // n
        if name == "a2a_list":
            ins, outs = list(full.split(block)), list(out.split(block))
        else:
            ins = [torch.ones(block) for _ in range(n)]
            outs = [torch.zeros(block) for _ in range(n)]
        return (lambda: comm.all_to_allv(full, out, even, even)), (lambda: dist.all_to_all(outs, ins)), 2 * elems * 4
    raise SystemExit(f"unknown op {name!r}: pick from {', '.join(OPS)}")


def table(ops: list[str], sizes: list[int]) -> list[tuple[str, int, float, float, int]]:
    """Under torch.distributed with the "accord" default group: one row per op and size."""
    import torch
    import torch.distributed as dist

    group = dist.group.WORLD._get_backend(torch.device("cpu"))
    comm = group._comm
    rank, n = dist.get_rank(), dist.get_world_size()
    counter = CopyCounter()
    rows = []
    try:
        for name in ops:
            for nbytes in sizes:
                direct, through, staged = op_pair(name, nbytes, rank, n, comm)
                d_us = mean_us(direct, dist.barrier)
                t_us = mean_us(through, dist.barrier)
                through()  # warm: registrations made, so the count below is one steady call's
                _, _, h0, m0 = comm._registration_stats()
                counter.bytes, counter.on = 0, True
                through()
                counter.on = False
                _, _, h1, m1 = comm._registration_stats()
                copied = counter.bytes + (staged if (h1 + m1) == (h0 + m0) else 0)
                rows.append((name, nbytes, d_us, t_us, copied))
                dist.barrier()
    finally:
        counter.close()
    return rows


def show(rows: list[tuple[str, int, float, float, int]], n: int) -> None:
    print(f"# {n} ranks, float32; us per call (mean of {ITERS} after {WARMUP}), rank 0", flush=True)
    print(f"{'op':>15} {'bytes':>9} {'direct us':>10} {'dist us':>9} {'+us':>8} {'ratio':>6} {'copied':>10}")
    for name, nbytes, d_us, t_us, copied in rows:
        print(f"{name:>15} {nbytes:>9} {d_us:>10.0f} {t_us:>9.0f} {t_us - d_us:>8.0f} {d_us / t_us:>6.2f} {copied:>10}")
    sys.stdout.flush()


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--torch", action="store_true", help="run as one rank of a torchrun job")
    ap.add_argument("--port", type=int, help="one rank by hand (RANK, WORLD_SIZE set): 1 MiB numpy all_reduce")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--ranks", type=int, default=2, help="ranks under accord.run (default 2)")
    ap.add_argument("--warmup", type=int, default=5, help="calls before the timing (default 5)")
    ap.add_argument("--iters", type=int, default=30, help="timed calls (default 30)")
    ap.add_argument(
        "--profile",
        metavar="OP:BYTES",
        help="with --torch, after the table: 200 dist calls of OP at BYTES under cProfile on rank 0 "
        "(top functions by own time, us a dist call), and on which thread the backend ran them",
    )
    return ap.parse_args(argv)


def communicator_rank(
    ops: list[str], sizes: list[int], counts: tuple[int, int] = (5, 30)
) -> list[tuple[str, int, float, float, int]]:
    """Under accord.run (ranks in the launcher's session)."""
    global WARMUP, ITERS
    WARMUP, ITERS = counts
    import torch
    import torch.distributed as dist

    import accord.torch  # noqa: F401 - registers "accord"

    torch.set_num_threads(1)
    dist.init_process_group("accord")
    rows = table(ops, sizes)
    dist.destroy_process_group()
    return rows


def profile_calls(spec: str, calls: int = 200) -> None:
    """Where one dist call's time goes on this host: `calls` calls of the op under cProfile on
    rank 0 (the others run them plainly), the functions with the most own time in us a call, and
    how many of the calls the backend ran on the calling thread and how many on its worker
    (a worker run costs two thread wake-ups)."""
    import cProfile
    import pstats
    import threading

    import torch
    import torch.distributed as dist

    name, _, nbytes = spec.partition(":")
    group = dist.group.WORLD._get_backend(torch.device("cpu"))
    rank, n = dist.get_rank(), dist.get_world_size()
    _, through, _ = op_pair(name, int(nbytes or 1 << 20), rank, n, group._comm)
    threads: dict[str, int] = {}
    # Both ways an op runs: `_run_job` (the worker, or a waiting caller) and `_run_now` (a
    # synchronous op on the caller, which never reaches `_run_job`).
    run_job, run_now = group._run_job, group._run_now

    def count() -> None:
        key = "caller" if threading.current_thread() is threading.main_thread() else "worker"
        threads[key] = threads.get(key, 0) + 1

    def counted_job(fn: Any, work: Any) -> None:
        count()
        run_job(fn, work)

    def counted_now(op: str, result: Any, fn: Any) -> Any:
        count()
        return run_now(op, result, fn)

    group._run_job, group._run_now = counted_job, counted_now
    for _ in range(WARMUP):
        through()
    dist.barrier()
    threads.clear()
    prof = cProfile.Profile() if rank == 0 else None
    start = time.perf_counter()
    if prof is not None:
        prof.enable()
    for _ in range(calls):
        through()
    if prof is not None:
        prof.disable()
    elapsed_us = (time.perf_counter() - start) / calls * 1e6
    group._run_job, group._run_now = run_job, run_now
    dist.barrier()
    if prof is None:
        return
    print(f"# profile {name} {nbytes} B, {calls} calls, {n} ranks: {elapsed_us:.0f} us a call under cProfile; "
          f"backend ran them on: {threads}", flush=True)
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:25]  # type: ignore[attr-defined]
    print(f"{'own us/call':>12} {'cum us/call':>12} {'ncalls':>8}  function")
    for (file, line, func), (_, ncalls, tottime, cumtime, _) in rows:
        where = f"{'/'.join(file.rsplit('/', 2)[-2:])}:{line}"
        print(f"{tottime / calls * 1e6:>12.1f} {cumtime / calls * 1e6:>12.1f} {ncalls:>8}  {func} {where}")
    sys.stdout.flush()


def under_torchrun(ops: list[str], sizes: list[int], profile: str | None = None) -> None:
    import torch
    import torch.distributed as dist

    import accord.torch  # noqa: F401 - registers "accord"

    torch.set_num_threads(1)
    dist.init_process_group("accord")
    rows = table(ops, sizes)
    if dist.get_rank() == 0:
        show(rows, dist.get_world_size())
    if profile:
        profile_calls(profile)
    dist.destroy_process_group()


def by_hand(port: int) -> None:
    import os

    import numpy as np

    import accord

    rank = int(os.environ["RANK"])
    comm = accord.Communicator(rank, int(os.environ["WORLD_SIZE"]), "127.0.0.1", port, timeout=30)
    a = np.ones(SIZES[1] // 4, np.float32)
    us = round(mean_us(lambda: comm.all_reduce(a), comm.barrier))
    if rank == 0:
        print(f"{SIZES[1]:>9} B: Communicator {us} us (session {os.getsid(0)})", flush=True)
    comm.close()


if __name__ == "__main__":
    args = parse(sys.argv[1:])
    WARMUP, ITERS = args.warmup, args.iters
    ops = [o for o in args.ops.split(",") if o]
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.port is not None:
        by_hand(args.port)
    elif args.torch:
        under_torchrun(ops, sizes, args.profile)
    else:
        import accord

        rows = accord.run(communicator_rank, args.ranks, ops, sizes, (WARMUP, ITERS), timeout=600)[0]
        show(rows, args.ranks)
