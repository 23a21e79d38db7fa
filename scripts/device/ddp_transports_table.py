#!/usr/bin/env python3
"""The table of scripts/device/ddp_transports.sh: one row per transport and round (median, p10,
p90 step time, and the ratio to Socket's median of the same round), then each transport's median
over the rounds with the median of its per-round ratios, and whether every run ended with the
same parameters. Input: the JSON lines the loop wrote (ddp_transports.py's, plus "round")."""
import json
import statistics
import sys


def table(rows):
    lines = []
    socket = {r.get("round", 1): r for r in rows if r.get("label") == "socket" and "step_ms_median" in r}
    digests = {r.get("params_sha256") for r in rows if "params_sha256" in r}
    lines.append(f"{'round':>5} {'transport':<18} {'median ms':>10} {'p10':>8} {'p90':>8} {'vs socket':>10}  params")
    ratios = {}
    medians = {}
    for r in rows:
        rnd, label = r.get("round", 1), r.get("label", "?")
        if "step_ms_median" not in r:
            lines.append(f"{rnd:>5} {label:<18} failed rc={r.get('rc')}")
            continue
        base = socket.get(rnd)
        ratio = base["step_ms_median"] / r["step_ms_median"] if base else None
        medians.setdefault(label, []).append(r["step_ms_median"])
        if ratio is not None:
            ratios.setdefault(label, []).append(ratio)
        shown = f"{ratio:.2f}x" if ratio is not None else "-"
        lines.append(
            f"{rnd:>5} {label:<18} {r['step_ms_median']:>10.2f} {r['step_ms_p10']:>8.2f} {r['step_ms_p90']:>8.2f} "
            f"{shown:>10}  {r['params_sha256']} ranks_agree={r['ranks_agree']}"
        )
    lines.append("")
    lines.append(f"{'transport':<18} {'rounds':>6} {'median ms':>10} {'ratio to socket, median of rounds':>36}  ratios")
    for label, ms in medians.items():
        rs = ratios.get(label, [])
        med_ratio = f"{statistics.median(rs):.2f}x" if rs else "-"
        lines.append(
            f"{label:<18} {len(ms):>6} {statistics.median(ms):>10.2f} {med_ratio:>36}  "
            + " ".join(f"{x:.2f}" for x in rs)
        )
    lines.append(f"every transport gave the same parameters: {len(digests) == 1}")
    for r in rows:
        if r.get("gpu_stats"):
            lines.append(f"{r.get('label')} round {r.get('round', 1)} plugin GPU-buffer counters (rank 0): "
                         + json.dumps(r["gpu_stats"]))
    return "\n".join(lines)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(table([json.loads(line) for line in f if line.strip()]))
