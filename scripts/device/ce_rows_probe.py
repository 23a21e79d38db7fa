#!/usr/bin/env python3
"""How fast the copy engines move scattered rows GPU0 -> GPU1, without Accord: the bound on a
paged KV write that uses no SMs (issue 23's "90% of the copy ceiling" for 2048 blocks).

A KV cache in the layout layers x {K,V} x blocks x block_bytes puts a block's 160 pieces one
plane apart, so a block is one 2D copy of 160 rows (what accord's paged device writes issue).
This probe issues the same 2D copies straight through the CUDA driver (cuMemcpy2DAsync_v2 via
ctypes, in the primary context PyTorch uses), for rows of 32 KiB (the issue's layout) and for
longer rows (as if 2, 4, 8 or 32 adjacent blocks merged), on 1 and 4 streams, and divides each
by one contiguous copy of the same bytes measured in the same run. Nothing of Accord is
imported. Every byte is checked once per row size (on a sample of blocks).

Usage: python3 scripts/device/ce_rows_probe.py [--blocks 2048] [--pool 2560] [--planes 160]
       [--iters 3]    (needs 2 GPUs with peer access and PyTorch)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import random
import sys
import time

CU_MEMORYTYPE_DEVICE = 2


class Memcpy2D(ctypes.Structure):
    """CUDA_MEMCPY2D (the driver API's layout, cuda.h)."""

    _fields_ = [
        ("srcXInBytes", ctypes.c_size_t),
        ("srcY", ctypes.c_size_t),
        ("srcMemoryType", ctypes.c_int),
        ("srcHost", ctypes.c_void_p),
        ("srcDevice", ctypes.c_uint64),
        ("srcArray", ctypes.c_void_p),
        ("srcPitch", ctypes.c_size_t),
        ("dstXInBytes", ctypes.c_size_t),
        ("dstY", ctypes.c_size_t),
        ("dstMemoryType", ctypes.c_int),
        ("dstHost", ctypes.c_void_p),
        ("dstDevice", ctypes.c_uint64),
        ("dstArray", ctypes.c_void_p),
        ("dstPitch", ctypes.c_size_t),
        ("WidthInBytes", ctypes.c_size_t),
        ("Height", ctypes.c_size_t),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=2048)
    ap.add_argument("--pool", type=int, default=2560)
    ap.add_argument("--planes", type=int, default=160, help="layers x 2 (K and V)")
    ap.add_argument("--block-kib", type=int, default=32)
    ap.add_argument("--merge", default="1,2,4,8,32", help="adjacent blocks per row")
    ap.add_argument("--streams", default="1,4")
    ap.add_argument("--iters", type=int, default=3)
    args = ap.parse_args()

    import torch

    if torch.cuda.device_count() < 2:
        print("ce_rows_probe: needs 2 GPUs", file=sys.stderr)
        return 0
    cu = ctypes.CDLL("libcuda.so.1")
    copy2d = cu.cuMemcpy2DAsync_v2
    copy2d.argtypes = [ctypes.POINTER(Memcpy2D), ctypes.c_void_p]
    block = args.block_kib << 10
    plane = args.pool * block
    total = args.planes * plane
    src = torch.empty(total, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty(total, dtype=torch.uint8, device="cuda:1")
    src.view(torch.int64)[:] = torch.arange(total // 8, device="cuda:0")
    torch.cuda.set_device(0)
    nbytes = args.blocks * args.planes * block
    flat_src, flat_dst = src[:nbytes], dst[:nbytes]

    def timed(fn) -> float:
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        return time.perf_counter() - t

    # The ceiling: one contiguous copy of the same bytes (also enables peer access).
    flat_dst.copy_(flat_src)
    ceiling_s = min(timed(lambda: flat_dst.copy_(flat_src)) for _ in range(args.iters))
    ceiling = nbytes / ceiling_s / 1e9
    print(f"ceiling: {nbytes / 2**30:.2f} GiB in {ceiling_s * 1e3:.2f} ms = {ceiling:.1f} GB/s", flush=True)

    streams = {n: [torch.cuda.Stream(0) for _ in range(n)] for n in map(int, args.streams.split(","))}
    rows_out = []
    print(f"{'row KiB':>8} {'streams':>7} {'2D copies':>9} {'ms':>8} {'GB/s':>7} {'ratio':>6} {'us/row':>7}  checked")
    for merge in map(int, args.merge.split(",")):
        runs = args.blocks // merge
        # Scattered runs of `merge` adjacent blocks, different on each side, inside the pool.
        rng = random.Random(merge)
        slots = args.pool // merge
        src_runs = rng.sample(range(slots), runs)
        dst_runs = rng.sample(range(slots), runs)
        width = merge * block
        descs = []
        for s_run, d_run in zip(src_runs, dst_runs):
            d = Memcpy2D()
            d.srcMemoryType = d.dstMemoryType = CU_MEMORYTYPE_DEVICE
            d.srcDevice = src.data_ptr() + s_run * width
            d.dstDevice = dst.data_ptr() + d_run * width
            d.srcPitch = d.dstPitch = plane
            d.WidthInBytes = width
            d.Height = args.planes
            descs.append(d)
        for n, ss in streams.items():
            handles = [s.cuda_stream for s in ss]

            def issue() -> None:
                for i, d in enumerate(descs):
                    rc = copy2d(ctypes.byref(d), ctypes.c_void_p(handles[i % n]))
                    if rc != 0:
                        raise RuntimeError(f"cuMemcpy2DAsync_v2 failed: CUresult {rc}")

            dst.zero_()
            torch.cuda.synchronize(1)  # the zeroing (device 1's stream) before the copies
            issue()
            torch.cuda.synchronize(0)  # the copies (side streams of device 0) before the check
            checked = check(src, dst, src_runs, dst_runs, width, plane, args.planes)
            best = min(timed(issue) for _ in range(args.iters))
            moved = runs * width * args.planes
            gbps = moved / best / 1e9
            row = {"row_kib": width >> 10, "streams": n, "copies": runs, "ms": round(best * 1e3, 2),
                   "gbps": round(gbps, 1), "ceiling_gbps": round(ceiling, 1), "ratio": round(gbps / ceiling, 3),
                   "us_per_row": round(best * 1e6 / (runs * args.planes), 3), "checked": checked}
            rows_out.append(row)
            print(f"{row['row_kib']:>8} {n:>7} {runs:>9} {row['ms']:>8} {row['gbps']:>7} {row['ratio']:>6} "
                  f"{row['us_per_row']:>7}  {'bytes ok' if checked else 'WRONG'}", flush=True)
    for row in rows_out:
        print(json.dumps(row))
    return 0 if all(r["checked"] for r in rows_out) else 1


def check(src, dst, src_runs, dst_runs, width, plane, planes) -> bool:
    """Compares a sample of runs (first, middle, last) on the first, middle and last planes."""
    picks = sorted({0, len(src_runs) // 2, len(src_runs) - 1})
    for i in picks:
        for p in sorted({0, planes // 2, planes - 1}):
            a = src[p * plane + src_runs[i] * width : p * plane + (src_runs[i] + 1) * width].to("cuda:1")
            b = dst[p * plane + dst_runs[i] * width : p * plane + (dst_runs[i] + 1) * width]
            if not bool((a == b).all()):
                return False
    return True


if __name__ == "__main__":
    sys.exit(main())
