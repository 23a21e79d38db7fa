"""What a torch.distributed all_reduce through the "accord" backend costs when every call hands
it a fresh tensor (as FSDP2's and many models' temporaries do), so every call misses the
backend's registration cache and registers, and evicts, once: us a call, the best of 5 runs of
300 calls after 100, at each size, on rank 0's clock. Compare two builds of the extension by
their PYTHONPATH; no GPU needed.

    python -m torch.distributed.run --standalone --nproc_per_node 2 scripts/torch_fresh_tensor_cost.py
    python -m torch.distributed.run --standalone --nproc_per_node 2 scripts/torch_fresh_tensor_cost.py --sizes 4096,1048576
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

import accord.torch  # noqa: F401  (registers the backend)


def best_us_per_call(numel: int, runs: int = 5, calls: int = 300, warmup: int = 100) -> float:
    for _ in range(warmup):
        dist.all_reduce(torch.ones(numel))
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(torch.ones(numel))
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16384,262144", help="bytes of each tensor, comma list")
    args = parser.parse_args()
    dist.init_process_group("accord")
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            us = best_us_per_call(max(1, size // 4))
            if dist.get_rank() == 0:
                print(f"fresh-tensor all_reduce {size:>9} B: {us:8.1f} us a call, {dist.get_world_size()} ranks")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
