"""Summarises scripts/telemetry-overhead.sh: per size, telemetry off against each mode run
(`on` unless more are named after the directory), with the spread over rounds. With --ab,
summarises instead in-process A/B runs: `accord bench p2p --telemetry-ab --json` or
`scripts/device/nccl_plugin_bench.py --telemetry-ab PAIRS` (their `telemetry_ab` object).

    python3 scripts/telemetry_overhead_summary.py OUT_DIR [MODE ...]
    python3 scripts/telemetry_overhead_summary.py --ab FILE.json [FILE.json ...]

Round i ran off, then each mode, one after the other, so the runs of one round saw the same
machine: the ratio mode_i / off_i of each round is the paired measure. Per size it prints
- off: the median of the off runs (GB/s) and their spread, (max - min) / 2 / median, the
  noise of the bench alone;
- ratio: the median over rounds of mode_i / off_i, and the lowest and highest of those ratios
  that bound the true median ratio with the stated confidence (order statistics of a
  binomial(n, 1/2): no assumption about the noise's shape; with 6 rounds it is the min and
  the max, 97%);
- verdict against the target (cost under 3%, ratio at least 0.97): "met" when the interval's
  low end is at least 0.97, "missed" when its high end is below 0.97, else "unresolved"
  (more rounds, or a quieter machine, are needed to tell); "too few rounds" while the
  interval's coverage is below 90% (5 rounds at least).

An A/B file holds, per size, each pair's ratio on/paused (blocks recording paused and on, in
one process pair); the same median, interval and verdict are computed from those ratios
(`accord bench p2p --telemetry-ab` prints the same numbers itself, `accord_bench::paired`).
"""
import glob
import json
import math
import os
import re
import statistics
import sys

TARGET = 0.97
CONFIDENCE = 0.90


def load(out, kind):
    """Runs of `kind` by round number: {round: {(op, bytes): gbps}}."""
    runs = {}
    for f in glob.glob(os.path.join(out, f"{kind}*.json")):
        m = re.fullmatch(rf"{re.escape(kind)}([0-9]+)\.json", os.path.basename(f))
        if not m:
            continue
        try:
            rows = json.load(open(f))["rows"]
        except (ValueError, KeyError) as e:
            print(f"skipping {f}: {e}", file=sys.stderr)
            continue
        runs[int(m.group(1))] = {(r["op"], r["bytes"]): r["accord_gbps"] for r in rows}
    return runs


def median_interval(values, confidence=CONFIDENCE):
    """(low, high, coverage): order statistics bounding the median of what `values` sample,
    with the largest coverage-respecting rank: P(B < k) * 2 <= 1 - confidence for B ~
    binomial(n, 1/2). With too few values for `confidence`, the min and max and their own
    coverage, 1 - 2^(1-n)."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return (math.nan, math.nan, 0.0)
    cdf = lambda k: sum(math.comb(n, i) for i in range(k)) / 2**n  # P(B < k)
    k = 1
    while k + 1 <= n // 2 and 2 * cdf(k + 1) <= 1 - confidence:
        k += 1
    return (xs[k - 1], xs[n - k], 1 - 2 * cdf(k))


def verdict(low, high, coverage, target=TARGET):
    if coverage < CONFIDENCE:
        return "too few rounds"
    if low >= target:
        return "met"
    if high < target:
        return "missed"
    return "unresolved"


def summarise(off, runs, mode):
    """Lines of the table of `mode` against off, and the rows' paired medians."""
    paired_rounds = sorted(set(off) & set(runs))
    keys = sorted({k for r in off.values() for k in r}, key=lambda k: (k[0], k[1]))
    lines = [
        f"{mode} vs off: {len(paired_rounds)} rounds paired "
        f"(off runs {len(off)}, {mode} runs {len(runs)}); ratio = {mode}/off, 1.000 = no cost",
        f"{'op':>6} {'bytes':>9} {'off_gbps':>9} {'off_spread':>10} {'ratio':>7} {'interval':>15} {'coverage':>8}  verdict (<3%)",
    ]
    medians = []
    for k in keys:
        offs = [off[i][k] for i in off if k in off[i]]
        ratios = [runs[i][k] / off[i][k] for i in paired_rounds if k in off[i] and k in runs[i] and off[i][k] > 0]
        if not offs or not ratios:
            continue
        off_median = statistics.median(offs)
        spread = (max(offs) - min(offs)) / 2 / off_median if off_median > 0 else math.nan
        ratio = statistics.median(ratios)
        low, high, coverage = median_interval(ratios)
        medians.append(ratio)
        lines.append(
            f"{k[0]:>6} {k[1]:>9} {off_median:>9.2f} {'±' + format(spread * 100, '.1f') + '%':>10} {ratio:>7.3f} "
            f"{f'{low:.3f}..{high:.3f}':>15} {coverage * 100:>7.0f}%  {verdict(low, high, coverage)}"
        )
    if medians:
        lines.append(f"geometric mean of the sizes' median ratios: {statistics.geometric_mean(medians):.3f}")
    return lines


def summarise_ab(report, name):
    """Lines of the table of one A/B report (the `telemetry_ab` object) and its median ratios."""
    rows = report.get("rows", [])
    pairs = report.get("pairs", "?")
    lines = [
        f"{name}: in-process A/B, {pairs} pairs of blocks per size (recording paused / on); "
        f"ratio = on/paused, 1.000 = no cost",
        f"{'op':>6} {'bytes':>10} {'paused_gbps':>11} {'on_gbps':>9} {'ratio':>7} {'interval':>15} {'coverage':>8}  verdict (<3%)",
    ]
    medians = []
    for r in rows:
        ratios = r.get("ratios", [])
        if not ratios:
            continue
        ratio = statistics.median(ratios)
        low, high, coverage = median_interval(ratios)
        medians.append(ratio)
        word = verdict(low, high, coverage).replace("rounds", "pairs")
        lines.append(
            f"{r['op']:>6} {r['bytes']:>10} {r['paused_gbps']:>11.3f} {r['on_gbps']:>9.3f} {ratio:>7.3f} "
            f"{f'{low:.3f}..{high:.3f}':>15} {coverage * 100:>7.0f}%  {word}"
        )
    if medians:
        lines.append(f"geometric mean of the sizes' median ratios: {statistics.geometric_mean(medians):.3f}")
    return lines


def main_ab(files):
    if not files:
        print("--ab needs at least one JSON file", file=sys.stderr)
        return 2
    for i, f in enumerate(files):
        try:
            report = json.load(open(f))["telemetry_ab"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"{f}: not an A/B report ({e})", file=sys.stderr)
            return 1
        if i:
            print()
        print("\n".join(summarise_ab(report, f)))
    return 0


def main(argv):
    if len(argv) > 1 and argv[1] == "--ab":
        return main_ab(argv[2:])
    out = argv[1] if len(argv) > 1 else "/tmp/ovh"
    modes = argv[2:] or ["on"]
    off = load(out, "off")
    if not off:
        print(f"no off runs (off<N>.json) in {out}", file=sys.stderr)
        return 1
    for i, mode in enumerate(modes):
        if i:
            print()
        print("\n".join(summarise(off, load(out, mode), mode)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
