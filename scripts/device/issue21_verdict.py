#!/usr/bin/env python3
"""Issue 21's acceptance, target by target, from one device call's outputs.

Why: the targets are ratios between transports at given sizes, judged per round and over
rounds, and reading them off several tables by hand is where mistakes creep in. This reads what
scripts/device/nccl_tests.sh wrote (its summary.txt, one per round) and what
scripts/device/ddp_transports.sh wrote (ddp.jsonl), and prints each target with every round's
ratio and whether all rounds met it.

Usage: issue21_verdict.py [--transport accord] [--ddp DDP_JSONL] SUMMARY_TXT...
"""
import argparse
import json
import statistics
import sys

# Issue 21's floors: busbw at 256 MiB against tuned Socket in each launch shape, busbw at 1 MiB,
# and the DDP loop's step against Socket's (median of the rounds' ratios).
LARGE, SMALL = "256M", "1M"
LARGE_FLOOR, SMALL_FLOOR, DDP_FLOOR = 2.0, 1.0, 1.5


def parse_summary(text):
    """{(shape, transport): {"busbw": {size: GB/s}, "wrong": int, "ok": bool}} from one summary.txt."""
    runs = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3 or fields[0] not in ("g2", "mp") or fields[2] != "all_reduce":
            continue
        cells = line.split("|")
        busbw = {}
        for word in cells[0].split()[3:]:
            size, _, value = word.partition(":")
            try:
                busbw[size] = float(value)
            except ValueError:
                continue
        wrong = int(cells[1]) if len(cells) > 1 and cells[1].strip().isdigit() else None
        ok = len(cells) > 2 and cells[2].strip().startswith("0 OK") and line.rstrip().endswith("rc=0")
        runs[(fields[0], fields[1])] = {"busbw": busbw, "wrong": wrong, "ok": ok}
    return runs


def ratio(runs, shape, transport, size):
    """transport's busbw over tuned Socket's at size in one round, or None if either is missing."""
    ours = runs.get((shape, transport), {}).get("busbw", {}).get(size)
    base = runs.get((shape, "socket"), {}).get("busbw", {}).get(size)
    return ours / base if ours and base else None


def ddp_ratios(rows, transport):
    """Socket's median step over the transport's, round by round."""
    by_round = {}
    for r in rows:
        if "step_ms_median" in r:
            by_round.setdefault(r.get("round", 1), {})[r["label"]] = r["step_ms_median"]
    return [
        steps["socket"] / steps[transport]
        for _, steps in sorted(by_round.items())
        if "socket" in steps and transport in steps
    ]


def verdicts(rounds, ddp_rows, transport):
    """Lines of the targets table: target, per-round figures, met or not."""
    lines = []

    def judge(name, values, floor):
        shown = " ".join("-" if v is None else f"{v:.2f}" for v in values)
        met = bool(values) and all(v is not None and v >= floor for v in values)
        lines.append(f"{name:<44} {shown:<28} {'met' if met else 'NOT met'}")

    for shape in ("g2", "mp"):
        judge(f"{shape} all_reduce {LARGE} >= {LARGE_FLOOR:g}x Socket", [ratio(r, shape, transport, LARGE) for r in rounds], LARGE_FLOOR)
    for shape in ("g2", "mp"):
        judge(f"{shape} all_reduce {SMALL} >= Socket", [ratio(r, shape, transport, SMALL) for r in rounds], SMALL_FLOOR)
    wrong = [run["wrong"] for r in rounds for run in r.values()]
    clean = bool(wrong) and all(w == 0 for w in wrong) and all(run["ok"] for r in rounds for run in r.values())
    lines.append(f"{'zero wrong values, every run verified':<44} {f'{len(wrong)} runs':<28} {'met' if clean else 'NOT met'}")
    digests = {r.get("params_sha256") for r in ddp_rows if "params_sha256" in r}
    agree = len(digests) == 1 and all(r.get("ranks_agree", False) for r in ddp_rows if "params_sha256" in r)
    runs = sum(1 for r in ddp_rows if "params_sha256" in r)
    lines.append(f"{'DDP: same parameters in every run':<44} {f'{runs} runs':<28} {'met' if agree else 'NOT met'}")
    ratios = ddp_ratios(ddp_rows, transport)
    median = statistics.median(ratios) if ratios else None
    shown = " ".join(f"{v:.2f}" for v in ratios) + (f" (median {median:.2f})" if median else "")
    met = median is not None and median >= DDP_FLOOR
    lines.append(f"{f'DDP step >= {DDP_FLOOR:g}x Socket, median of rounds':<44} {shown:<28} {'met' if met else 'NOT met'}")
    return lines


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", default="accord", help="the transport judged (default: the plugin's defaults)")
    parser.add_argument("--ddp", help="ddp.jsonl of scripts/device/ddp_transports.sh")
    parser.add_argument("summaries", nargs="+", help="summary.txt of scripts/device/nccl_tests.sh, one per round")
    args = parser.parse_args(argv)
    rounds = []
    for path in args.summaries:
        with open(path, errors="replace") as f:
            rounds.append(parse_summary(f.read()))
    ddp_rows = []
    if args.ddp:
        with open(args.ddp) as f:
            ddp_rows = [json.loads(line) for line in f if line.strip()]
    print(f"issue 21 targets for transport {args.transport} ({len(rounds)} nccl-tests round(s)):")
    for line in verdicts(rounds, ddp_rows, args.transport):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
