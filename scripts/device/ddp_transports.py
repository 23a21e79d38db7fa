#!/usr/bin/env python3
"""One DDP training loop, timed (issue 21): run under `torchrun --nproc_per_node 2` once per NCCL
transport (scripts/device/ddp_transports.sh sets each transport's environment).

The model is 8 Linear(2048, 2048) layers with GELU (33.6M parameters, 134 MB of fp32 gradients),
DDP with 25 MB buckets, SGD, a fixed seeded batch per rank and step. Rank 0 prints one JSON line:
the median, p10 and p90 step time over the timed steps (CUDA-synchronised wall clock), and a
SHA-256 of the final parameters, which must be equal for every transport: with two ranks each
bucket's sum is a + b in either order, so every transport gives the same bits.
"""

import argparse
import hashlib
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


# The Accord plugin's GPU-buffer counters, in its order (crates/accord-nccl-net/src/gpu_stats.rs).
GPU_STATS = ["bounce_waits", "gpu_recvs", "gpu_recv_bytes", "land_ns_total", "copy_ns_total", "copy_ns_max",
             "gpu_sends", "gpu_send_bytes", "send_ns_total", "send_ns_max", "regmr_gpu", "regmr_refused"]


def plugin_gpu_stats():
    """The counters of the plugin NCCL loaded in this process (dlopen of the same file returns the
    same library), or None without the plugin or the export."""
    import ctypes

    path = os.environ.get("NCCL_NET_PLUGIN", "")
    if not path.endswith(".so") or not os.path.exists(path):
        return None
    try:
        fn = ctypes.CDLL(path).accord_net_gpu_stats
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
    n = fn(None, 0)
    values = (ctypes.c_uint64 * n)()
    fn(values, n)
    stats = dict(zip(GPU_STATS, values))
    recvs, sends = stats.get("gpu_recvs", 0), stats.get("gpu_sends", 0)
    stats["mean_land_us"] = round(stats.get("land_ns_total", 0) / recvs / 1e3, 1) if recvs else 0
    stats["mean_copy_us"] = round(stats.get("copy_ns_total", 0) / recvs / 1e3, 1) if recvs else 0
    stats["mean_send_us"] = round(stats.get("send_ns_total", 0) / sends / 1e3, 1) if sends else 0
    return stats


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--label", required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()

    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)  # the same initial weights on every rank
    width, depth = 2048, 8
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).cuda()
    ddp = DDP(model, device_ids=[local], bucket_cap_mb=25)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    gen = torch.Generator(device="cpu")
    times = []
    for step in range(args.warmup + args.steps):
        gen.manual_seed(1000 * step + rank)
        x = torch.randn(args.batch, width, generator=gen).cuda(non_blocking=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = ddp(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    # Every rank's parameters must agree too (DDP keeps them equal).
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest.hexdigest())
    if rank == 0:
        ms = sorted(t * 1e3 for t in times)
        stats = plugin_gpu_stats()
        print(json.dumps({
            "label": args.label,
            "step_ms_median": round(statistics.median(ms), 3),
            "step_ms_p10": round(ms[len(ms) // 10], 3),
            "step_ms_p90": round(ms[(9 * len(ms)) // 10], 3),
            "params_sha256": digest.hexdigest()[:16],
            "ranks_agree": len(set(digests)) == 1,
            **({"gpu_stats": stats} if stats else {}),
        }), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
