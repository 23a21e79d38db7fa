"""The GPU side of one marked call in a torch.profiler Chrome trace: every kernel and copy that
ran between the start of the last range named `--range` and the start of the next marked range,
with its start (µs after the range began) and duration, so a call's critical path and its idle
gaps read as a table (examples/ep_bench.py --profile --trace-dir writes such traces).

    python3 scripts/device/trace_summary.py TRACE.json --range "ep:dispatch num_worst" [--nth -1]
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--range", required=True, help="the record_function name marking each call")
    parser.add_argument("--nth", type=int, default=-1, help="which call of that name (default: the last)")
    args = parser.parse_args()
    with open(args.trace) as f:
        events: list[dict[str, Any]] = json.load(f)["traceEvents"]
    marks = sorted(
        (e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ep:") and e.get("cat") == "user_annotation"),
        key=lambda e: float(e["ts"]),
    )
    calls = [i for i, e in enumerate(marks) if e["name"] == args.range]
    if not calls:
        raise SystemExit(f"no range {args.range!r} in {args.trace} (ranges: {sorted({e['name'] for e in marks})})")
    index = calls[args.nth]
    start = float(marks[index]["ts"])
    end = float(marks[index + 1]["ts"]) if index + 1 < len(marks) else float("inf")
    gpu = sorted(
        (e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
         and start <= float(e["ts"]) < end),
        key=lambda e: float(e["ts"]),
    )
    host_us = float(marks[index].get("dur", 0))
    print(f"# {args.range}, call {index}: host range {host_us:.1f} us; {len(gpu)} GPU events")
    print("| GPU event | stream | start us | runs us |")
    print("|---|---|---|---|")
    for e in gpu:
        stream = e.get("args", {}).get("stream", "")
        print(f"| {str(e['name'])[:60]} | {stream} | {float(e['ts']) - start:.1f} | {float(e.get('dur', 0)):.1f} |")
    if gpu:
        last = max(float(e["ts"]) + float(e.get("dur", 0)) for e in gpu)
        print(f"# GPU busy until {last - start:.1f} us after the range began")


if __name__ == "__main__":
    main()
