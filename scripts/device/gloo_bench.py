"""Gloo baseline for `accord bench`: the same collectives through torch.distributed's Gloo
backend on CPU tensors, timed the nccl-tests way (warm-up, mean of timed iterations, the slowest
rank's time), printed as one JSON object per collective on rank 0.

Run: torchrun --nproc_per_node N gloo_bench.py --collective all_reduce --sizes 1048576,...
"""
import argparse
import json
import time

import torch
import torch.distributed as dist


def busbw_factor(collective, n):
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def run_one(collective, size_bytes, warmup, iters):
    n = dist.get_world_size()
    elems = max(size_bytes // 4, n)
    if collective == "all_reduce":
        t = torch.ones(elems, dtype=torch.float32)
        op = lambda: dist.all_reduce(t)
    elif collective == "all_gather":
        per = max(elems // n, 1)
        src = torch.ones(per, dtype=torch.float32)
        outs = [torch.empty(per, dtype=torch.float32) for _ in range(n)]
        op = lambda: dist.all_gather(outs, src)
        size_bytes = per * n * 4
    elif collective == "all_to_all":
        per = max(elems // n, 1)
        src = torch.ones(per * n, dtype=torch.float32)
        dst = torch.empty(per * n, dtype=torch.float32)
        op = lambda: dist.all_to_all_single(dst, src)
        size_bytes = per * n * 4
    else:
        raise SystemExit(f"unknown collective {collective}")
    for _ in range(warmup):
        op()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        op()
    mine = (time.perf_counter() - start) / iters * 1e6
    t = torch.tensor([mine], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    time_us = t.item()
    algbw = size_bytes / (time_us * 1e-6) / 1e9
    return {"bytes": size_bytes, "time_us": time_us, "algbw_gbps": algbw, "busbw_gbps": algbw * busbw_factor(collective, n)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--collective", default="all_reduce")
    p.add_argument("--sizes", default="1048576,4194304,16777216,67108864")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rows = [run_one(a.collective, int(s), a.warmup, a.iters) for s in a.sizes.split(",")]
    if dist.get_rank() == 0:
        print(json.dumps({"collective": a.collective, "backend": "gloo", "ranks": dist.get_world_size(), "rows": rows}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
