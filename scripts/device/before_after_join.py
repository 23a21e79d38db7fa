#!/usr/bin/env python3
"""Joins before_after.sh's tagged JSON lines into one table: per bench, size and figure, the
base and new values of every round, and new/base of their means. NCCL's figure (when present)
is shown beside the collectives as the anchor.

Usage: before_after_join.py RAW_JSONL
"""
import json
import sys
from collections import defaultdict

# The figures compared, per source: (field, label). Higher is better for every one.
FIGURES = {
    "engine": [("engine_gbps", "one write at a time, GB/s"), ("ratio", "one at a time / ceiling"),
               ("engine_window_gbps", "window, GB/s"), ("ceiling_gbps", "copy ceiling, GB/s")],
    "coll": [("busbw_gbps", "busbw, GB/s")],
    "p2p": [("accord_gbps", "GB/s"), ("ratio", "vs TCP")],
}


def rows(path):
    for line in open(path):
        try:
            yield json.loads(line)
        except ValueError:
            continue


def flatten(d):
    """p2p prints {"rows": [...]}: one row per size."""
    if "rows" in d and isinstance(d["rows"], list):
        for r in d["rows"]:
            r = dict(r)
            r.update(variant=d["variant"], round=d["round"], source=d["source"])
            if "ratio" not in r and "vs_tcp" in r:  # renamed with issue 22
                r["ratio"] = r["vs_tcp"]
            yield r
    else:
        yield d


def main():
    values = defaultdict(lambda: defaultdict(dict))  # (source, name, bytes, field) -> variant -> round -> v
    nccl = {}
    for d in rows(sys.argv[1]):
        for r in flatten(d):
            src = r.get("source")
            if src == "nccl":
                nccl[(r.get("collective"), r.get("bytes"))] = r.get("busbw_gbps")
                continue
            name = r.get("collective") or r.get("bench") or src
            for field, _ in FIGURES.get(src, []):
                if isinstance(r.get(field), (int, float)):
                    values[(src, name, r.get("bytes"), field)][r["variant"]][r["round"]] = r[field]
    print(f"{'bench':<10} {'what':<18} {'bytes':>10} {'figure':<26} {'base':>16} {'new':>16} {'new/base':>9} {'nccl':>7}")
    for (src, name, size, field), by_variant in sorted(values.items(), key=lambda kv: [str(x) for x in kv[0]]):
        base = by_variant.get("base", {})
        new = by_variant.get("new", {})
        label = dict(FIGURES[src])[field]
        fmt = lambda vs: "/".join(f"{vs[k]:.2f}" for k in sorted(vs)) or "-"
        mean = lambda vs: sum(vs.values()) / len(vs) if vs else float("nan")
        ratio = mean(new) / mean(base) if base and new and mean(base) > 0 else float("nan")
        anchor = nccl.get((name, size)) if src == "coll" else None
        anchor_s = f"{anchor:.1f}" if isinstance(anchor, (int, float)) else ""
        print(f"{src:<10} {str(name):<18} {str(size):>10} {label:<26} {fmt(base):>16} {fmt(new):>16} {ratio:>9.3f} {anchor_s:>7}")


if __name__ == "__main__":
    main()
