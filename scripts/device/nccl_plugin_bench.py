#!/usr/bin/env python3
"""Correctness and bus bandwidth of torch.distributed over NCCL, for the Accord net plugin.

Run under `torchrun --nproc_per_node 2` (scripts/device/nccl_plugin_bench.sh does, once per
transport). Each run:
  1. checks all_reduce, all_gather, all_to_all and send/recv on seeded inputs and records a
     SHA-256 of every rank's result, so runs over different transports can be compared
     bit for bit (with two ranks a float32 sum is exact in any order);
  2. times all_reduce at each size and records bus bandwidth (GB/s, 1e9 bytes per second,
     busbw = algbw * 2 * (n - 1) / n as nccl-tests defines it).
Rank 0 writes one JSON file (--out) with both.
"""

import argparse
import hashlib
import json
import os
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--label", required=True, help="name of this run (nvlink, accord, socket, socket_tuned)")
    p.add_argument("--out", required=True, help="JSON file rank 0 writes")
    p.add_argument("--min-bytes", type=int, default=1 << 20)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--check-elems", type=int, default=(4 << 20) + 12345,
                   help="elements per rank in the correctness checks (odd on purpose)")
    p.add_argument("--skip-bench", action="store_true")
    return p.parse_args()


def digest(t):
    import torch

    return hashlib.sha256(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()


def seeded(n, rank, salt, device):
    import torch

    g = torch.Generator(device="cpu")
    g.manual_seed(1000 * salt + rank)
    return torch.randn(n, generator=g, dtype=torch.float32).to(device)


def gather_digests(local, world):
    import torch.distributed as dist

    out = [None] * world
    dist.all_gather_object(out, local)
    return out


def correctness(rank, world, device, n):
    import torch
    import torch.distributed as dist

    results = {}
    x = seeded(n, rank, 1, device)
    dist.all_reduce(x)
    results["all_reduce"] = digest(x)

    x = seeded(n, rank, 2, device)
    out = torch.empty(n * world, dtype=x.dtype, device=device)
    dist.all_gather_into_tensor(out, x)
    results["all_gather"] = digest(out)

    per = n - n % world
    x = seeded(per, rank, 3, device)
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    results["all_to_all"] = digest(out)

    # send/recv both ways at once (a batch, as NCCL groups it), odd size on purpose.
    peer = (rank + 1) % world
    src = (rank - 1) % world
    x = seeded(n + 7, rank, 4, device)
    got = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, got, src)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    results["send_recv"] = digest(got)
    # Zero-element send/recv must complete as well.
    empty = torch.empty(0, device=device)
    got0 = torch.empty(0, device=device)
    for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, empty, peer), dist.P2POp(dist.irecv, got0, src)]):
        req.wait()
    torch.cuda.synchronize()
    return gather_digests(results, world)


def bench(rank, world, device, args):
    import torch
    import torch.distributed as dist

    rows = {}
    size = args.min_bytes
    while size <= args.max_bytes:
        n = size // 4
        x = torch.ones(n, dtype=torch.float32, device=device)
        iters = max(5, min(args.iters, (256 << 20) * args.iters // (size * 4) + 5))
        for _ in range(args.warmup):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dist.all_reduce(x)
        stop.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(stop) / 1000.0 / iters
        # The slowest rank defines the time, as nccl-tests reports it.
        t = torch.tensor([seconds], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        seconds = t.item()
        algbw = size / seconds / 1e9
        busbw = algbw * 2 * (world - 1) / world
        rows[str(size)] = {"seconds": seconds, "algbw": algbw, "busbw": busbw, "iters": iters}
        if rank == 0:
            print(f"[{args.label}] all_reduce {size:>11d} B  {seconds * 1e6:10.1f} us  busbw {busbw:7.2f} GB/s",
                  flush=True)
        size *= 2
    return rows


def main():
    args = parse_args()
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if world != 2:
        print(f"expected 2 ranks, got {world}", file=sys.stderr)
        return 2
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    try:
        dist.init_process_group("nccl", device_id=device)
    except TypeError:  # torch before 2.3 has no device_id
        dist.init_process_group("nccl")
    began = time.time()
    digests = correctness(rank, world, device, args.check_elems)
    rows = {} if args.skip_bench else bench(rank, world, device, args)
    if rank == 0:
        report = {
            "label": args.label,
            "nccl_version": ".".join(str(v) for v in torch.cuda.nccl.version()),
            "torch_version": torch.__version__,
            "digests": digests,
            "all_reduce": rows,
            "wall_seconds": time.time() - began,
            "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "ACCORD_", "TORCH_", "NVSHMEM_"))},
        }
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
