#!/usr/bin/env python3
"""What the torch backend's registration cache costs an all_gather_into_tensor of 8 MiB a rank
(2 ranks, CPU): the output reused, 80 persistent outputs in turn (every call a cache miss, no new
memory), and a new output each call (what FSDP2 does), against Gloo in the same run; ms per call.

Usage: python3 scripts/registration_probe.py   (accord and torch importable; runs 2 ranks)
"""

import datetime
import time
from typing import Any

import accord


def probe(iters: int = 20) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    import accord.torch  # noqa: F401 - registers "accord"

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    group = dist.new_group(backend="accord")
    n = dist.get_world_size()
    x = torch.ones(2 << 20)
    ring = [torch.zeros(x.numel() * n) for _ in range(80)]
    out: dict[str, float] = {}
    for name, g in [("gloo", None), ("accord", group)]:
        for mode in ["reused", "rotating", "fresh"]:
            turn = [0]

            def call(g: Any = g, mode: str = mode, turn: list[int] = turn) -> None:
                if mode == "reused":
                    o = ring[0]
                elif mode == "rotating":
                    o = ring[turn[0] % len(ring)]
                    turn[0] += 1
                else:
                    o = torch.empty(x.numel() * n)
                dist.all_gather_into_tensor(o, x, group=g)

            for _ in range(2):
                call()
            dist.barrier()
            t = time.perf_counter()
            for _ in range(iters):
                call()
            out[f"{name} {mode}"] = round((time.perf_counter() - t) / iters * 1e3, 2)
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    for key, ms in accord.run(probe, 2, timeout=300)[0].items():
        print(f"{key:>16}: {ms} ms")
