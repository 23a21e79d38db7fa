"""One rank of the peer-death test under torch.distributed (NCCL), started by
peer_death_torch.sh with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set (not
under torchrun: its agent would end the survivor as soon as the other rank died).

Both ranks run a few all_reduces; rank 1 then writes the time to --death-file and kills itself
(SIGKILL); rank 0 starts another all_reduce and waits for it with a bounded wait, and writes
to --out one JSON object: the label, whether its wait raised, the error text, and the seconds
from rank 1's death to the error."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--death-file", required=True)
    parser.add_argument("--limit-s", type=float, default=120.0)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=args.limit_s))
    x = torch.ones(1 << 20, device="cuda")
    for _ in range(5):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.synchronize()
    if rank == 1:
        with open(args.death_file, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(1.0)  # rank 1 is dead by now: the next all_reduce has a dead peer
    died_at = float(open(args.death_file).read())
    outcome = {"label": args.label, "raised": False, "error": None}
    try:
        work = dist.all_reduce(x, async_op=True)
        work.wait(datetime.timedelta(seconds=args.limit_s))
        torch.cuda.synchronize()
    except Exception as e:  # NCCL errors come as RuntimeError / DistBackendError
        outcome.update(raised=True, error=f"{type(e).__name__}: {str(e)[:400]}")
    outcome["seconds_after_death"] = time.time() - died_at
    with open(args.out, "w") as f:
        json.dump(outcome, f)
    print(json.dumps(outcome), flush=True)
    os._exit(0)  # no teardown with a dead peer


if __name__ == "__main__":
    main()
