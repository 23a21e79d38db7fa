#!/usr/bin/env python3
"""Joins accord-gpu-bench and gpu_vs_nccl.py JSON lines into the comparison tables.

Usage: gpu_vs_nccl_join.py ACCORD_OUT NCCL_OUT
"""
import json
import sys


def rows(path):
    out = []
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def main():
    accord, nccl = rows(sys.argv[1]), rows(sys.argv[2])
    ref = {(r["collective"], r["bytes"]): r for r in nccl}
    best = {}
    for r in accord:
        if r["order"] == "hostfn":
            best[(r["collective"], r["bytes"])] = r
    print("collective bytes accord_busbw nccl_busbw ratio accord_sms")
    for (coll, b), r in best.items():
        n = ref.get((coll, b))
        nb = n["busbw_gbps"] if n else float("nan")
        ratio = r["busbw_gbps"] / nb if n and nb > 0 else float("nan")
        print(f"{coll} {b} {r['busbw_gbps']:.1f} {nb:.1f} {ratio:.2f} {r['sms']}")
    print()
    print("latency (us, 4 KiB..1 MiB): collective bytes accord_hostfn accord_stall nccl stall_sms")
    stall = {(r["collective"], r["bytes"]): r for r in accord if r["order"] == "stall"}
    for (coll, b), r in best.items():
        if b > 1 << 20:
            continue
        s = stall.get((coll, b))
        n = ref.get((coll, b))
        st = f"{s['time_us']:.1f}" if s else "-"
        print(f"{coll} {b} {r['time_us']:.1f} {st} {n['time_us'] if n else '-'} {s['sms'] if s else '-'}")


if __name__ == "__main__":
    main()
