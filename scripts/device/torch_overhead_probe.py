"""Where the torch backend's time goes on CPU: all_reduce of 1, 4 and 16 MiB float32 tensors,
2 ranks, 5 warm-up and 30 timed calls (mean per call, rank 0's clock).

    python scripts/device/torch_overhead_probe.py            # accord.run: the "accord" group's
                                                             # Communicator, then dist.all_reduce
    python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        scripts/device/torch_overhead_probe.py --torch       # in one torchrun job: the group's own
                                                             # Communicator, then dist.all_reduce

    RANK=r WORLD_SIZE=2 python scripts/device/torch_overhead_probe.py --port P
                                                             # one rank launched by hand (under
                                                             # `setsid` or not): 1 MiB numpy only

Compare with `accord bench all-reduce -n 2 -b 1M -e 16M -f 4 -w 5 -i 30` (since issue 22:
`--ranks 2 ... -n 30`) in the same shell loop (docs/results/2026-11-26-torch-backend.md)."""

from __future__ import annotations

import sys
import time
from typing import Callable

SIZES = (1 << 20, 4 << 20, 16 << 20)


def mean_us(call: Callable[[], None], sync: Callable[[], None]) -> int:
    for _ in range(5):
        call()
    sync()
    start = time.perf_counter()
    for _ in range(30):
        call()
    return round((time.perf_counter() - start) / 30 * 1e6)


def communicator_rank() -> list[tuple[int, int, int]]:
    """Under accord.run (ranks in the launcher's session): the "accord" group's Communicator
    called directly, then dist.all_reduce, on the same tensor."""
    import torch
    import torch.distributed as dist

    import accord.torch  # noqa: F401 - registers "accord"

    torch.set_num_threads(1)
    dist.init_process_group("accord")
    group = dist.group.WORLD._get_backend(torch.device("cpu"))
    rows = []
    for nbytes in SIZES:
        t = torch.ones(nbytes // 4)
        direct = mean_us(lambda: group._comm.all_reduce(t), dist.barrier)
        through = mean_us(lambda: dist.all_reduce(t), dist.barrier)
        rows.append((nbytes, direct, through))
    dist.destroy_process_group()
    return rows


def under_torchrun() -> None:
    import torch
    import torch.distributed as dist

    import accord.torch  # noqa: F401 - registers "accord"

    torch.set_num_threads(1)
    dist.init_process_group("accord")
    group = dist.group.WORLD._get_backend(torch.device("cpu"))
    for nbytes in SIZES:
        t = torch.ones(nbytes // 4)
        direct = mean_us(lambda: group._comm.all_reduce(t), dist.barrier)
        through = mean_us(lambda: dist.all_reduce(t), dist.barrier)
        if dist.get_rank() == 0:
            print(f"{nbytes:>9} B: Communicator {direct} us, dist.all_reduce {through} us", flush=True)
    dist.destroy_process_group()


def by_hand(port: int) -> None:
    import os

    import numpy as np

    import accord

    rank = int(os.environ["RANK"])
    comm = accord.Communicator(rank, int(os.environ["WORLD_SIZE"]), "127.0.0.1", port, timeout=30)
    a = np.ones(SIZES[0] // 4, np.float32)
    us = mean_us(lambda: comm.all_reduce(a), comm.barrier)
    if rank == 0:
        print(f"{SIZES[0]:>9} B: Communicator {us} us (session {os.getsid(0)})", flush=True)
    comm.close()


if __name__ == "__main__":
    if "--port" in sys.argv:
        by_hand(int(sys.argv[sys.argv.index("--port") + 1]))
    elif "--torch" in sys.argv:
        under_torchrun()
    else:
        import accord

        for nbytes, direct, through in accord.run(communicator_rank, 2, timeout=200)[0]:
            print(
                f"{nbytes:>9} B: Communicator {direct} us {nbytes / direct / 1e3:.3f} GB/s, dist.all_reduce "
                f"{through} us {nbytes / through / 1e3:.3f} GB/s (busbw = algbw at 2 ranks)"
            )
