"""Probes of accord.torch's GPU path (the default, ACCORD_TORCH_GPU=auto), two ranks on
one host, through accord.run. Each scenario prints what every rank saw.

    python3 scripts/device/torch_gpu_probe.py blocking   # in-place all_reduce of a strided view, read back
    python3 scripts/device/torch_gpu_probe.py streams    # 1000 and 16M floats, default and side streams
    python3 scripts/device/torch_gpu_probe.py ddp        # three DDP steps on a small MLP
    python3 scripts/device/torch_gpu_probe.py latency    # where a small op's time goes: host vs GPU

`blocking` also reports whether the tensors are VMM memory (no owning context) and
ACCORD_GPU_PRIVATE_CONTEXT as the ranks saw it.
Env: N (iterations of `blocking`, default 30), SYNC=1 (torch.cuda.synchronize() before reading
back), WARM=1 (one all_reduce before, so the peers' mappings exist), ACCORD_GPU_OP_TIMEOUT_MS
(a short deadline turns a stall into an error quickly), ACCORD_GPU_STREAM_ORDER.
Needs torch and two GPUs; the accord package on PYTHONPATH.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

import accord


def _start() -> torch.device:
    import accord.torch  # noqa: F401 - registers the backend, asks for eager module loading

    logging.basicConfig(level=logging.DEBUG, format=f"r{os.environ['RANK']} %(name)s %(message)s")
    dist.init_process_group("accord", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    return torch.device("cuda", rank)


def _inputs(i: int, rank: int) -> torch.Tensor:
    return torch.randint(1, 4, (4, 6), generator=torch.Generator().manual_seed(100 * i + rank)).float()


def blocking() -> dict[str, Any]:
    """A strided view reduced in place, then read back with a blocking copy (tensor.cpu())."""
    dev = _start()
    rank = dist.get_rank()
    if os.environ.get("WARM") == "1":
        dist.all_reduce(torch.ones(4, 6, device=dev))
        torch.cuda.synchronize()
    wrong = []
    for i in range(int(os.environ.get("N", "30"))):
        base = _inputs(i, rank).to(dev)
        dist.all_reduce(base[:, ::2])
        if os.environ.get("SYNC") == "1":
            torch.cuda.synchronize()
        got = base.cpu()
        want = _inputs(i, rank)
        want[:, ::2] += _inputs(i, 1 - rank)[:, ::2]
        if not torch.equal(got, want):
            wrong.append(i)
    memory = _memory_kind(base)
    dist.destroy_process_group()
    return {"wrong": wrong, "memory": memory, "private": os.environ.get("ACCORD_GPU_PRIVATE_CONTEXT", "unset")}


def _memory_kind(t: torch.Tensor) -> str:
    """"vmm" when no CUDA context owns the tensor's memory (PyTorch's expandable segments),
    "context" for cudaMalloc memory; asked of the driver (CU_POINTER_ATTRIBUTE_CONTEXT)."""
    import ctypes

    cu = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    r = cu.cuPointerGetAttribute(ctypes.byref(ctx), 1, ctypes.c_uint64(t.data_ptr()))
    return f"error {r}" if r else ("vmm" if not ctx.value else "context")


def streams() -> list[tuple[int, bool, float, float]]:
    dev = _start()
    rank = dist.get_rank()
    out = []
    for size, side in ((1000, False), (16 << 20, False), (1000, True), (16 << 20, True)):
        s = torch.cuda.Stream() if side else torch.cuda.current_stream()
        with torch.cuda.stream(s):
            t = torch.full((size,), float(rank + 1), device=dev)
            work = dist.all_reduce(t, async_op=True)
        work.wait()
        torch.cuda.synchronize()
        out.append((size, side, t.min().item(), t.max().item()))
    dist.destroy_process_group()
    return out


def ddp() -> str:
    dev = _start()
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(dev)
    wrapped = DDP(model, bucket_cap_mb=0.001, device_ids=[dev])
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(wrapped(torch.randn(8, 16, device=dev)), torch.randn(8, 4, device=dev))
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
    dist.destroy_process_group()
    return "ok"


def latency() -> list[tuple[str, int, float, float, float]]:
    """Per op and size: host µs a call with no synchronisation (what the calling thread, DDP's
    autograd hook, spends), GPU µs a call back to back (CUDA events around 50 calls) and µs a
    call with a synchronisation after each (the whole round trip). No debug logging here."""
    import time

    import accord.torch  # noqa: F401

    dist.init_process_group("accord", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    rows = []
    for op in ("all_reduce", "all_gather"):
        for size in (4096, 1 << 20, 16 << 20):
            t = torch.ones(size // 4, device=dev)
            out = torch.empty(2 * (size // 4), device=dev)

            def call() -> None:
                if op == "all_reduce":
                    dist.all_reduce(t)
                else:
                    dist.all_gather_into_tensor(out, t)

            for _ in range(5):
                call()
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(50):
                call()
            host = (time.perf_counter() - t0) / 50
            torch.cuda.synchronize()
            dist.barrier()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(50):
                call()
            end.record()
            end.synchronize()
            gpu = start.elapsed_time(end) / 50 * 1e3
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(20):
                call()
                torch.cuda.synchronize()
            synced = (time.perf_counter() - t0) / 20
            rows.append((op, size, round(host * 1e6, 1), round(gpu, 1), round(synced * 1e6, 1)))
    if os.environ.get("PROFILE") == "1":
        # Where the calling thread's time goes: cProfile of 200 all_reduce calls of 1 MiB.
        import cProfile
        import io
        import pstats

        t = torch.ones(1 << 18, device=dev)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            dist.all_reduce(t)
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
        rows.append(("profile", 0, 0.0, 0.0, 0.0))
        print(f"rank {rank} cProfile:\n{text.getvalue()}", file=sys.stderr, flush=True)
    dist.destroy_process_group()
    return rows


if __name__ == "__main__":
    scenarios = {"blocking": blocking, "streams": streams, "ddp": ddp, "latency": latency}
    if len(sys.argv) != 2 or sys.argv[1] not in scenarios:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(scenarios)}")
    print(accord.run(scenarios[sys.argv[1]], 2, timeout=60))
