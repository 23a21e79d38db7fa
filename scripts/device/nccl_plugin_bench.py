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

With --telemetry-ab PAIRS (telemetry on through ACCORD_METRICS_ADDR / ACCORD_TRACE_FILE), step
2 measures instead what telemetry costs the plugin's all_reduce: per size, PAIRS pairs of
blocks of --iters calls, one block with the plugin's recording paused and one with it on,
alternating which goes first. Each rank switches its own process through the plugin library
NCCL loaded (ctypes on $NCCL_NET_PLUGIN: dlopen of the same file returns the same library,
whose accord_telemetry_set_recording reaches the engine NCCL drives); a barrier follows each
switch, so both ranks record or neither does while a block is timed. The JSON then carries a
`telemetry_ab` object (per size the pairs' ratios on/paused) that
`scripts/telemetry_overhead_summary.py --ab FILE` judges against the 3% target.
"""

import argparse
import hashlib
import json
import os
import sys
import time
from statistics import median


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
    p.add_argument("--telemetry-ab", type=int, default=0, metavar="PAIRS",
                   help="pairs of all_reduce blocks (--iters calls each) with the plugin's telemetry "
                        "recording paused and on, per size, instead of one timed run")
    args = p.parse_args()
    if args.telemetry_ab and args.telemetry_ab < 5:
        p.error("--telemetry-ab needs at least 5 pairs (fewer cannot bound the median ratio at 90%)")
    return args


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


def plugin_telemetry_switch():
    """(set_recording, enabled) of the Accord plugin NCCL loaded: the library named by
    NCCL_NET_PLUGIN (a path, or NCCL's short name for libnccl-net-<name>.so)."""
    import ctypes

    name = os.environ.get("NCCL_NET_PLUGIN", "")
    if not name:
        raise SystemExit("--telemetry-ab needs NCCL_NET_PLUGIN naming the Accord plugin")
    lib = ctypes.CDLL(name if "/" in name else f"libnccl-net-{name}.so")
    try:
        set_recording, enabled = lib.accord_telemetry_set_recording, lib.accord_telemetry_enabled
    except AttributeError as e:
        raise SystemExit(f"{name} has no telemetry switch (an older Accord plugin?): {e}")
    set_recording.argtypes, set_recording.restype = [ctypes.c_int], ctypes.c_int
    enabled.argtypes, enabled.restype = [], ctypes.c_int
    return set_recording, enabled


def bench_telemetry_ab(rank, world, device, args, set_recording):
    """Per size, args.telemetry_ab pairs of blocks paused / recording; rows for the summary."""
    import torch
    import torch.distributed as dist

    pairs = args.telemetry_ab
    bus = 2 * (world - 1) / world
    rows = []
    size = args.min_bytes
    while size <= args.max_bytes:
        x = torch.ones(size // 4, dtype=torch.float32, device=device)
        for _ in range(args.warmup):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        recording = True
        seconds = {False: [], True: []}
        for i in range(pairs):
            for on in ((False, True) if i % 2 == 0 else (True, False)):
                if on != recording:
                    torch.cuda.synchronize()
                    if set_recording(int(on)) < 0:
                        raise SystemExit("accord_telemetry_set_recording failed")
                    recording = on
                dist.barrier()  # both ranks switched before either is timed
                torch.cuda.synchronize()
                start.record()
                for _ in range(args.iters):
                    dist.all_reduce(x)
                stop.record()
                torch.cuda.synchronize()
                seconds[on].append(start.elapsed_time(stop) / 1000.0 / args.iters)
        set_recording(1)
        # The slowest rank defines each block's time, as nccl-tests reports it.
        t = torch.tensor(seconds[False] + seconds[True], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        both = t.tolist()
        paused, on = both[:pairs], both[pairs:]
        ratios = [p / o for p, o in zip(paused, on)]  # busbw on / busbw paused
        row = {
            "op": "allred",
            "bytes": size,
            "iters_per_block": args.iters,
            "block_ms": median(both) * args.iters * 1e3,
            "paused_gbps": size / median(paused) / 1e9 * bus,
            "on_gbps": size / median(on) / 1e9 * bus,
            "ratios": ratios,
        }
        rows.append(row)
        if rank == 0:
            print(f"[{args.label}] all_reduce {size:>11d} B  telemetry A/B, {pairs} pairs: busbw paused "
                  f"{row['paused_gbps']:7.2f} on {row['on_gbps']:7.2f} GB/s, median on/paused {median(ratios):.3f}",
                  flush=True)
        size *= 2
    return {"pairs": pairs, "target": 0.97, "rows": rows}


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
    switch = plugin_telemetry_switch() if args.telemetry_ab else None
    digests = correctness(rank, world, device, args.check_elems)
    ab = None
    if switch and not args.skip_bench:
        set_recording, enabled = switch
        if enabled() != 1:  # the plugin's engine is up once the checks ran
            raise SystemExit("--telemetry-ab: telemetry is off in the plugin: set ACCORD_METRICS_ADDR "
                             "and/or ACCORD_TRACE_FILE")
        ab = bench_telemetry_ab(rank, world, device, args, set_recording)
    rows = {} if args.skip_bench or ab else bench(rank, world, device, args)
    if rank == 0:
        report = {
            "label": args.label,
            "nccl_version": ".".join(str(v) for v in torch.cuda.nccl.version()),
            "torch_version": torch.__version__,
            "digests": digests,
            "all_reduce": rows,
            **({"telemetry_ab": ab} if ab else {}),
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
