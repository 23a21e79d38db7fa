"""Where the host time of one ``dist.all_reduce`` of a CUDA tensor goes in ``accord.torch``:
each piece the backend does per op, timed alone (µs a call, 200 calls, median of 5 rounds),
beside the whole op and ``get_future`` (which DDP asks for at every bucket). Two ranks; rank 0
prints one JSON line per piece. GPU host machines only.

    python3 scripts/device/torch_op_cost_probe.py            # from the repo root, accord importable
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
import time
from typing import Callable

import torch
import torch.distributed as dist

import accord


def pieces() -> list[tuple[str, float]]:
    import accord._torch_work as work_types
    import accord.torch as at

    dist.init_process_group("accord", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    t = torch.ones(1 << 18, device=dev)  # 1 MiB
    dist.all_reduce(t)
    torch.cuda.synchronize()
    group = dist.distributed_c10d._get_default_group()
    pg = group._get_backend(dev) if hasattr(group, "_get_backend") else group
    gpu = pg._gpu_for(t, "all_reduce")
    side = gpu.stream or torch.cuda.current_stream(dev)
    current = torch.cuda.current_stream(dev)
    dtype, op = at._dtype_name(t), at._reduce_op_name(dist.ReduceOp.SUM, "all_reduce")

    def rust_call() -> None:
        gpu.comm.all_reduce(t.data_ptr(), t.data_ptr(), t.numel(), dtype, op, side.cuda_stream)

    def event_record() -> None:
        work_types._CudaEvent().record(side)

    def work() -> None:
        at.Work(pg, "all_reduce", [t])

    def device_ctx() -> None:
        with torch.cuda.device(dev):
            pass

    def stream_ctx() -> None:
        with torch.cuda.stream(side):
            pass

    def op_and_future() -> None:
        dist.all_reduce(t, async_op=True).get_future()

    cases: list[tuple[str, Callable[[], None]]] = [
        ("current_stream", lambda: torch.cuda.current_stream(dev)),
        ("current_stream_no_device", lambda: torch.cuda.current_stream()),
        ("side.wait_stream(current)", lambda: side.wait_stream(current)),
        ("event create+record", event_record),
        ("Work.__init__", work),
        ("record_stream", lambda: t.record_stream(side)),
        ("data_ptr+numel", lambda: (t.data_ptr(), t.numel())),
        ("rust all_reduce (direct)", rust_call),
        ("with torch.cuda.device(dev)", device_ctx),
        ("with torch.cuda.stream(side)", stream_ctx),
        ("backend.allreduce([t]) (no dispatch)", lambda: pg.allreduce([t])),
        ("dist.all_reduce", lambda: dist.all_reduce(t)),
        ("dist.all_reduce async + get_future", op_and_future),
    ]
    rows = []
    for name, fn in cases:
        rounds = []
        for _ in range(5):
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(200):
                fn()
            rounds.append((time.perf_counter() - t0) / 200 * 1e6)
        rows.append((name, round(statistics.median(rounds), 2)))
    torch.cuda.synchronize()
    dist.destroy_process_group()
    return rows


if __name__ == "__main__":
    out = accord.run(pieces, 2, timeout=120)
    for name, us in out[0]:
        print(json.dumps({"piece": name, "host_us": us, "rank1_us": dict(out[1]).get(name)}))
    sys.exit(0)
