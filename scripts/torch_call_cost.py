"""The fixed cost of one torch.distributed call through the "accord" backend on one rank, with
no peer to wait for: us a call (mean of 20,000 after 500) for each common op on a 4 KiB float32
tensor, then accord.Communicator's own all_reduce on that tensor and on a numpy array. What is left is the Python layer's work and the binding's (what issue 20's "under 10%
at 1 MiB" is about), so two builds can be compared on any machine, no GPU and no peer needed.

    python scripts/torch_call_cost.py            # the importable accord package
    PYTHONPATH=/path/to/other/build python scripts/torch_call_cost.py
    python scripts/torch_call_cost.py gloo       # the same ops through gloo, for scale

docs/results/2026-11-27-proxy-host-steps-and-torch-layer.md has stop 45's before and after.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable


def mean_us(call: Callable[[], object], calls: int = 20_000, warmup: int = 500) -> float:
    for _ in range(warmup):
        call()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    import torch
    import torch.distributed as dist

    import accord.torch  # noqa: F401 - registers "accord"

    backend = sys.argv[1] if len(sys.argv) > 1 else "accord"
    dist.init_process_group(backend, rank=0, world_size=1)
    t, out = torch.ones(1024), torch.ones(1024)
    ops: dict[str, Callable[[], object]] = {
        "all_reduce": lambda: dist.all_reduce(t),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(out, t),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(out, t),
        "all_to_all_single": lambda: dist.all_to_all_single(out, t),
        "broadcast": lambda: dist.broadcast(t, 0),
        "barrier": lambda: dist.barrier(),
    }
    print(f"dist ({backend}): " + "  ".join(f"{n} {mean_us(c):.2f}" for n, c in ops.items()), flush=True)
    dist.destroy_process_group()
    if backend != "accord":
        return
    # The binding alone: accord.Communicator's all_reduce on the tensor and on a numpy array.
    import numpy as np

    import accord

    comm = accord.Communicator(0, 1, "127.0.0.1", int(os.environ["MASTER_PORT"]) + 1, timeout=30)
    comm.interruptible = False  # in place, as the backend calls it
    array = np.ones(1024, np.float32)
    calls: dict[str, Callable[[], object]] = {
        "tensor": lambda: comm.all_reduce(t),
        "numpy": lambda: comm.all_reduce(array),
    }
    print("Communicator.all_reduce: " + "  ".join(f"{n} {mean_us(c):.2f}" for n, c in calls.items()), flush=True)
    comm.close()


if __name__ == "__main__":
    main()
