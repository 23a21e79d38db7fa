"""The copy ceiling that the GPU benches (kv_gpu_bench.py, weight_push_gpu_bench.py) compare
against: one contiguous torch ``copy_`` of the same bytes from GPU 0 to the last GPU, timed the
same way by both, so their ratios to it mean the same thing."""

from __future__ import annotations

import statistics
import time
from typing import Any


def copy_ceiling_s(torch: Any, nbytes: int, iters: int) -> float:
    """Seconds of one contiguous bf16 ``copy_`` of ``nbytes`` GPU 0 -> last GPU: the median of
    ``iters`` timed copies after one warm-up, each waited for on both GPUs."""
    last = torch.cuda.device_count() - 1
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda:0")
    dst = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=f"cuda:{last}")
    dst.copy_(src)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(last)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(last)
        times.append(time.perf_counter() - t0)
    del src, dst
    torch.cuda.empty_cache()
    return statistics.median(times)
