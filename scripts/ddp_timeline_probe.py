"""Where a CPU DDP step's time goes, per gradient bucket (issue 20).

Run under torchrun, one backend per run:

    CUDA_VISIBLE_DEVICES= python3 -m torch.distributed.run --standalone --nproc_per_node 2 \
        scripts/ddp_timeline_probe.py --backend accord --width 2048

It trains the model of scripts/device/torch_backend_bench.py (depth x Linear(width, width),
batch 32, DDP's default buckets) and prints, on rank 0:

1. a timeline of the last timed step, in ms from the step's start: when the forward pass
   ended, when DDP handed each bucket to the communication hook ("submit"), when the backend
   began and ended the collective (accord only: the group's Communicator is wrapped), when
   the bucket's future completed, when the last bucket was submitted (the backward pass's
   compute is done then: DDP starts waiting), when backward() returned, and when the optimizer
   step ended;
2. the mean over the timed steps of: forward, backward up to the last submit (compute),
   the wait after it (communication not hidden), the optimizer, the whole step; for three
   hooks: "none" (no communication: DDP's own cost, the compute floor under DDP), "after" (the
   buckets' all_reduces held until the backward pass's compute is done, then run one after
   another: no overlap, no sharing of the cores with it) and "overlap" (DDP's way: each
   bucket's all_reduce starts when it is handed over). "overlap" slower than "after" means the
   communication and the backward pass slow each other down more than overlap saves;
3. each bucket size's all_reduce alone (no backward running), and 4 KiB (the per-call cost):
   through torch.distributed, and for accord through the Communicator directly, from the main
   thread and from a non-main thread (what the backend's worker does), median of --op-iters
   calls; and the accord communicator's registration cache (hits, misses).

The hook is a Python one that all_reduces the bucket and divides it by the world size (as
DDP's default hook does), so every backend goes through the same path.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import threading
import time
from typing import Any

# The bench's model, so the probe times the very model the DDP rows time.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "device"))
from torch_backend_bench import add_model_args, model  # noqa: E402


class CommSpy:
    """Stands in for an AccordProcessGroup's Communicator: records when each all_reduce began
    and ended on the backend's thread, then calls the real one."""

    def __init__(self, comm: Any, clock: Any) -> None:
        self._comm = comm
        self._clock = clock
        self.calls: list[tuple[int, float, float]] = []

    def all_reduce(self, array: Any, *args: Any, **kwargs: Any) -> Any:
        start = self._clock()
        try:
            return self._comm.all_reduce(array, *args, **kwargs)
        finally:
            self.calls.append((array.numel() * array.element_size(), start, self._clock()))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)


def accord_group(dist: Any, torch: Any) -> Any:
    """The world group's AccordProcessGroup, or None (another backend)."""
    from accord.torch import AccordProcessGroup

    pg = dist.group.WORLD
    if isinstance(pg, AccordProcessGroup):
        return pg
    try:
        be = pg._get_backend(torch.device("cpu"))
    except (RuntimeError, AttributeError):
        return None
    return be if isinstance(be, AccordProcessGroup) else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", required=True)
    add_model_args(ap)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--op-iters", type=int, default=5)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default: cores / local ranks)")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import accord.torch  # noqa: F401 - registers "accord"

    n_local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // n_local))
    dist.init_process_group(args.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    clock = time.perf_counter
    acc = accord_group(dist, torch)
    spy = None
    if acc is not None:
        spy = CommSpy(acc._comm, clock)
        acc._comm = spy

    x = torch.randn(args.batch, args.width)
    m = model(args.width, args.depth)
    ddp = DDP(m, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)

    # Per step: bucket index -> [bytes, submit, done]. The hook's mode: "none" (no
    # communication: DDP's own cost), "overlap" (each bucket's all_reduce starts when DDP hands
    # it over, as DDP's default hook does), "after" (held until the last bucket is handed over,
    # then run one after another: communication that does not overlap the backward pass).
    buckets: dict[int, list[float]] = {}
    mode = ["overlap"]
    held: list[tuple[int, Any, Any]] = []

    def finished(idx: int, t: Any) -> Any:
        buckets[idx][2] = clock()
        return t

    # No annotations: DDP checks them against dist.GradBucket / torch.futures.Future.
    def hook(_state, bucket):  # type: ignore[no-untyped-def]
        t = bucket.buffer()
        idx = bucket.index()
        buckets[idx] = [t.numel() * t.element_size(), clock(), float("nan")]
        if mode[0] == "none":
            fut: Any = torch.futures.Future()
            fut.set_result(finished(idx, t))
            return fut
        t.div_(n)
        if mode[0] == "overlap":
            return dist.all_reduce(t, async_op=True).get_future().then(lambda f: finished(idx, f.value()[0]))
        fut = torch.futures.Future()
        held.append((idx, t, fut))
        if bucket.is_last():
            for i, tensor, f in held:
                dist.all_reduce(tensor)
                f.set_result(finished(i, tensor))
            held.clear()
        return fut

    ddp.register_comm_hook(None, hook)

    def step() -> dict[str, Any]:
        buckets.clear()
        if spy is not None:
            spy.calls.clear()
        t0 = clock()
        opt.zero_grad(set_to_none=True)
        loss = ddp(x).square().mean()
        t_fwd = clock()
        loss.backward()
        t_bwd = clock()
        opt.step()
        t_end = clock()
        last_submit = max(b[1] for b in buckets.values())
        return {
            "t0": t0, "fwd": t_fwd, "bwd": t_bwd, "end": t_end, "last_submit": last_submit,
            "buckets": {k: list(v) for k, v in buckets.items()},
            "calls": list(spy.calls) if spy is not None else [],
        }

    def run(how: str) -> list[dict[str, Any]]:
        mode[0] = how
        for _ in range(args.warmup):
            step()
        dist.barrier()
        return [step() for _ in range(args.iters)]

    modes = {how: run(how) for how in ("none", "after", "overlap")}
    steps = modes["overlap"]

    if rank == 0:
        print(f"# ddp_timeline_probe: backend {args.backend}, {n} ranks, torch threads {torch.get_num_threads()}, "
              f"width {args.width} depth {args.depth} batch {args.batch}")
        s = steps[-1]
        ms = lambda t: (t - s["t0"]) * 1e3  # noqa: E731
        print("\n## Last step's timeline (rank 0, ms from the step's start)")
        print(f"forward ended {ms(s['fwd']):8.2f}")
        calls = iter(s["calls"])
        for idx in sorted(s["buckets"], key=lambda k: s["buckets"][k][1]):
            nbytes, sub, done = s["buckets"][idx]
            call = next(calls, None)
            began = f"{ms(call[1]):8.2f}" if call else "       -"
            ended = f"{ms(call[2]):8.2f}" if call else "       -"
            print(f"bucket {idx:2d} {nbytes / 2**20:7.2f} MiB  submit {ms(sub):8.2f}  backend began {began}  "
                  f"ended {ended}  future done {ms(done):8.2f}")
        print(f"last submit (backward compute done) {ms(s['last_submit']):8.2f}")
        print(f"backward() returned {ms(s['bwd']):8.2f}")
        print(f"optimizer step ended {ms(s['end']):8.2f}")

        def summary(name: str, rows: list[dict[str, Any]]) -> None:
            f = statistics.mean((r["fwd"] - r["t0"]) * 1e3 for r in rows)
            c = statistics.mean((r["last_submit"] - r["fwd"]) * 1e3 for r in rows)
            w = statistics.mean((r["bwd"] - r["last_submit"]) * 1e3 for r in rows)
            o = statistics.mean((r["end"] - r["bwd"]) * 1e3 for r in rows)
            t = statistics.mean((r["end"] - r["t0"]) * 1e3 for r in rows)
            print(f"{name:>14} {f:9.2f} {c:19.2f} {w:15.2f} {o:9.2f} {t:9.2f}")

        print("\n## Mean over the timed steps (rank 0, ms)")
        print(f"{'hook':>14} {'forward':>9} {'backward compute':>19} {'wait after it':>15} {'optimizer':>9} {'step':>9}")
        for how, rows in modes.items():
            summary(how, rows)
        if spy is not None:
            busy = statistics.mean(sum(c[2] - c[1] for c in r["calls"]) * 1e3 for r in steps)
            print(f"accord backend busy (sum of its all_reduce calls) per step: {busy:.2f} ms")
            entries, nbytes, hits, misses = spy._comm._registration_stats()
            print(f"accord registration cache: {entries} arrays ({nbytes / 2**20:.1f} MiB), {hits} hits, {misses} misses")

    # Each bucket's all_reduce alone.
    # 4 KiB first: there the per-call cost of each path (Python, hand-offs) shows, not bandwidth.
    sizes = [4096] + sorted({int(v[0]) for v in steps[-1]["buckets"].values()})
    rows = []
    for nbytes in sizes:
        t = torch.ones(nbytes // 4)
        row = {"bytes": nbytes, "torch": op_median(lambda: dist.all_reduce(t), args.op_iters, dist)}
        if acc is not None:
            comm = spy._comm if spy is not None else acc._comm
            # The backend's worker is idle here (every op above was waited for).
            row["comm_main"] = op_median(lambda: comm.all_reduce(t), args.op_iters, dist)
            box: dict[str, float] = {}
            th = threading.Thread(target=lambda: box.update(v=op_median(lambda: comm.all_reduce(t), args.op_iters, None)))
            dist.barrier()
            th.start()
            th.join()
            row["comm_thread"] = box["v"]
        rows.append(row)
    if rank == 0:
        print("\n## all_reduce alone: 4 KiB and each bucket size (rank 0, median ms; algbw GB/s)")
        print(f"{'bytes':>10} {'torch.distributed':>18} {'Communicator main':>18} {'Communicator thread':>20}")
        for r in rows:
            cells = [r.get(k) for k in ("torch", "comm_main", "comm_thread")]
            shown = [f"{v * 1e3:9.3f} ({r['bytes'] / v / 1e9:5.2f})" if v is not None else "-" for v in cells]
            print(f"{r['bytes']:>10} {shown[0]:>18} {shown[1]:>18} {shown[2]:>20}")
    dist.barrier()
    dist.destroy_process_group()


def op_median(call: Any, iters: int, dist: Any) -> float:
    """Median seconds of `call` over `iters` calls after one warm-up, ranks lined up by a
    barrier first (`dist` None: the caller lined them up)."""
    call()
    if dist is not None:
        dist.barrier()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


if __name__ == "__main__":
    main()
