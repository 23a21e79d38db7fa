"""One DDP step's GPU timeline on CUDA tensors, for any backend: where the step's time goes.

Run under torchrun, one run per backend (issue 20's GPU target is a DDP step within 1.1x NCCL's):

    torchrun --standalone --nproc_per_node 2 \\
        scripts/device/ddp_gpu_trace.py --backend accord
    torchrun --standalone --nproc_per_node 2 scripts/device/ddp_gpu_trace.py --backend nccl

The model is torch_backend_bench.py's (an MLP of about 50M parameters, batch 32). After the
warm-up steps, torch.profiler records --steps steps, each under a "step" annotation; each rank
in turn prints the last one's GPU work (kernels, copies, memsets; CUPTI sees every context of the process,
so the copies a private context submits show too) as offsets from the step's start on the host,
with durations and streams, then a summary: the step's host time, when its last GPU work ended,
and per stream the busy time. Each rank also prints the host calls that took longest in the step
(the profiler's CPU ops), which is where a host-bound step shows.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Any

from torch_backend_bench import add_model_args, model  # the same MLP as the bench's DDP row

_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def timeline(trace: dict[str, Any], top_host: int) -> list[str]:
    """The last "step" annotation's GPU events and longest host ops, as printable lines."""
    events = trace.get("traceEvents", [])
    steps = [e for e in events if e.get("name") == "step" and e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    if not steps:
        return ["no step annotation in the trace"]
    step = max(steps, key=lambda e: e["ts"])
    t0, t1 = float(step["ts"]), float(step["ts"]) + float(step["dur"])
    # GPU work the step queued may finish after the host left the step: look 20 ms past it.
    gpu = sorted(
        (e for e in events if e.get("cat") in _GPU_CATS and e.get("ph") == "X" and t0 <= float(e["ts"]) <= t1 + 20_000),
        key=lambda e: float(e["ts"]),
    )
    lines = [f"{'start_us':>9} {'dur_us':>8} {'stream':>7}  name"]
    busy: dict[str, float] = {}
    end = t0
    for e in gpu:
        start, dur = float(e["ts"]) - t0, float(e["dur"])
        stream = str(e.get("args", {}).get("stream", e.get("tid", "?")))
        busy[stream] = busy.get(stream, 0.0) + dur
        end = max(end, float(e["ts"]) + dur)
        lines.append(f"{start:9.1f} {dur:8.1f} {stream:>7}  {e['name'][:90]}")
    lines.append(
        f"step on the host {t1 - t0:.1f} us; its GPU work ended at {end - t0:.1f} us; "
        + "busy per stream: "
        + ", ".join(f"{s} {b:.1f} us" for s, b in sorted(busy.items()))
    )
    host = sorted(
        (e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X" and t0 <= float(e["ts"]) <= t1),
        key=lambda e: -float(e["dur"]),
    )[:top_host]
    lines.append("longest host ops in the step (start_us dur_us name):")
    lines += [f"  {float(e['ts']) - t0:9.1f} {float(e['dur']):8.1f}  {e['name'][:80]}" for e in host]
    comm = sorted(
        (
            e
            for e in events
            if e.get("cat") in ("cpu_op", "user_annotation") and e.get("ph") == "X" and t0 <= float(e["ts"]) <= t1
            and (e["name"].startswith("accord.") or any(k in e["name"].lower() for k in ("c10d", "allreduce")))
        ),
        key=lambda e: float(e["ts"]),
    )
    lines.append("communication calls on the host (start_us dur_us name):")
    lines += [f"  {float(e['ts']) - t0:9.1f} {float(e['dur']):8.1f}  {e['name'][:80]}" for e in comm]
    return lines


def annotate_accord(device: Any) -> Any:
    """Wraps the accord backend's calls that DDP makes (and the GPU communicator's all_reduce) in
    profiler annotations named ``accord.<call>``, so the timeline shows their host time: DDP's
    reducer calls the backend from C++, which the profiler does not record. Returns the group's
    GPU path (None when the group stages CUDA tensors through host memory)."""
    import torch.distributed as dist
    from torch.profiler import record_function

    from accord.torch import AccordProcessGroup, _StreamWork

    def wrap(owner: Any, name: str) -> None:
        inner = getattr(owner, name)

        def annotated(*a: Any, **k: Any) -> Any:
            with record_function(f"accord.{name}"):
                return inner(*a, **k)

        setattr(owner, name, annotated)

    for name in ("allreduce", "_on_stream"):
        wrap(AccordProcessGroup, name)
    for name in ("get_future", "wait"):
        wrap(_StreamWork, name)
    world: Any = dist.group.WORLD
    backend = world._get_backend(device)
    gpu = getattr(backend, "_gpu", None)
    if gpu is None or isinstance(gpu, bool):
        return None

    class Annotated:
        def __init__(self, comm: Any) -> None:
            self._comm = comm

        def __getattr__(self, name: str) -> Any:
            return getattr(self._comm, name)

        def all_reduce(self, *a: Any) -> Any:
            with record_function("accord.comm.all_reduce"):
                return self._comm.all_reduce(*a)

    gpu.comm = Annotated(gpu.comm)
    return gpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", required=True)
    add_model_args(ap)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top-host", type=int, default=12)
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile, record_function

    import accord.torch  # noqa: F401 - registers "accord"

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    ddp = DDP(model(args.width, args.depth).to(device), device_ids=[local_rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width, device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        ddp(x).square().mean().backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    gpu = annotate_accord(device) if args.backend == "accord" else None
    registrations = gpu.comm.registration_count() if gpu is not None else None
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            with record_function("step"):
                step()
            torch.cuda.synchronize()
    # Every rank's timeline, one after the other (a late peer shows in its own).
    for turn in range(dist.get_world_size()):
        if turn == rank:
            print_timeline(prof, args, gpu, registrations, rank)
        dist.barrier()
    dist.destroy_process_group()


def print_timeline(prof: Any, args: Any, gpu: Any, registrations: Any, rank: int) -> None:
    """This rank's timeline of the last profiled step, from the profiler's chrome trace."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        path = tmp.name
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    os.unlink(path)
    print(f"== {args.backend}: one DDP step, rank {rank}")
    if gpu is not None:
        print(f"GPU path registrations: {registrations} before the profiled steps, {gpu.comm.registration_count()} after")
    print("\n".join(timeline(trace, args.top_host)), flush=True)


if __name__ == "__main__":
    main()
