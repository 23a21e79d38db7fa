#!/usr/bin/env python3
"""NCCL side of the Accord-vs-NCCL GPU comparison (torch.distributed).

Run under torchrun; rank 0 prints one JSON object per row with the same
byte conventions as accord-gpu-bench (nccl-tests): all_gather bytes = total
output, all_to_all bytes = total per rank, sendrecv = ring pair, all_reduce
float32 sum. busbw factors: all_reduce 2(n-1)/n, all_gather and all_to_all
(n-1)/n, sendrecv 1.
"""
import json
import os
import sys

import torch
import torch.distributed as dist


def main():
    min_bytes = int(os.environ.get("BENCH_MIN_BYTES", 4096))
    max_bytes = int(os.environ.get("BENCH_MAX_BYTES", 256 << 20))
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, n = dist.get_rank(), dist.get_world_size()
    stream = torch.cuda.current_stream()
    send = torch.zeros(max_bytes // 4, dtype=torch.float32, device="cuda")
    recv = torch.zeros(max_bytes // 4, dtype=torch.float32, device="cuda")
    nxt, prv = (rank + 1) % n, (rank - 1 + n) % n

    def op(coll, nbytes):
        elems = nbytes // 4
        if coll == "all_gather":
            dist.all_gather_into_tensor(recv[:elems], send[: elems // n])
        elif coll == "all_to_all":
            dist.all_to_all_single(recv[:elems], send[:elems])
        elif coll == "sendrecv":
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, send[:elems], nxt), dist.P2POp(dist.irecv, recv[:elems], prv)])
            for r in reqs:
                r.wait()
        else:
            dist.all_reduce(send[:elems])

    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "all_to_all": (n - 1) / n, "sendrecv": 1.0}
    for coll in ["all_gather", "all_to_all", "sendrecv", "all_reduce"]:
        nbytes = min_bytes
        while nbytes <= max_bytes:
            b = nbytes - nbytes % (4 * n)
            iters = 50 if b <= 1 << 20 else (20 if b <= 16 << 20 else 10)
            for _ in range(3):
                op(coll, b)
            torch.cuda.synchronize()
            dist.barrier()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(iters):
                op(coll, b)
            end.record(stream)
            end.synchronize()
            t = torch.tensor([start.elapsed_time(end) * 1000.0 / iters], device="cuda")
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            t_us = t.item()
            if rank == 0:
                busbw = b / (t_us * 1e-6) / 1e9 * factor[coll]
                print(json.dumps({"impl": "nccl", "collective": coll, "bytes": b, "time_us": round(t_us, 2),
                                  "busbw_gbps": round(busbw, 2), "ranks": n}), flush=True)
            nbytes *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
