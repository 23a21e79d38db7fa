"""One rank of the NIC-failover job (scripts/device/nic_failover.sh starts two, each in a
network namespace of its own, with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).

Both ranks run all_reduces of --bytes over torch.distributed (NCCL, through the Accord plugin
or whatever NCCL_NET names) for --seconds, each result checked exactly: every element of
rank r's input is r + 1 plus a per-iteration offset that is a small integer, so the float32
sum is exact and known. Rank 0 writes --out: the end time of every all_reduce (time.time()),
the bytes of each, how many results were wrong (must be 0), and the error if one raised.
The script that started it takes a link down meanwhile; it never waits on more than
--limit-s."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--ready-file", required=True, help="rank 0 writes it when timing starts")
    p.add_argument("--bytes", type=int, default=64 << 20)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--limit-s", type=float, default=120.0)
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=args.limit_s))
    n = args.bytes // 4
    x = torch.empty(n, dtype=torch.float32, device="cuda")
    base = sum(r + 1 for r in range(world))
    for i in range(3):  # warm-up
        x.fill_(rank + 1)
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.barrier()
    ends, wrong, error = [], 0, None
    start = time.time()
    if rank == 0:
        with open(args.ready_file, "w") as f:
            f.write(repr(start))
    i = 0
    # Both ranks stop after the same number of iterations: rank 0 decides from the clock and
    # tells rank 1 through the all_reduce itself (a trailing element set to 1 means "last").
    while True:
        x.fill_(rank + 1 + (i % 7))
        last = rank == 0 and time.time() - start >= args.seconds
        x[-1] = 1.0 if last else 0.0
        try:
            work = dist.all_reduce(x, async_op=True)
            work.wait(datetime.timedelta(seconds=args.limit_s))
            torch.cuda.synchronize()
        except Exception as e:  # NCCL errors come as RuntimeError / DistBackendError
            error = f"{type(e).__name__}: {e}"
            break
        ends.append(time.time())
        expected = base + world * (i % 7)
        if not bool(torch.all(x[:-1] == expected).item()):
            wrong += 1
        i += 1
        if x[-1].item() >= 1.0:
            break
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"start": start, "ends": ends, "bytes": args.bytes, "wrong": wrong, "error": error}, f)
    if error is None:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
