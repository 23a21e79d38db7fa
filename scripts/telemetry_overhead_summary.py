"""Summarises scripts/telemetry-overhead.sh: median accord_gbps per size, telemetry off vs
each mode run (`on` unless more are named after the directory)."""
import json, re, statistics, sys, glob, os

OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/ovh"
MODES = sys.argv[2:] or ["on"]

def load(kind):
    runs = []
    for f in sorted(glob.glob(f"{OUT}/{kind}*.json")):
        if not re.fullmatch(rf"{kind}[0-9]+\.json", os.path.basename(f)):
            continue
        rows = json.loads(open(f).read())["rows"]
        runs.append({(r["op"], r["bytes"]): r["accord_gbps"] for r in rows})
    return runs

off = load("off")
modes = {m: load(m) for m in MODES}
keys = sorted(off[0], key=lambda k: (k[0], k[1]))
if MODES == ["on"]:
    on = modes["on"]
    print(f"{'op':>6} {'bytes':>9} {'off_gbps_median':>16} {'on_gbps_median':>15} {'on/off':>7}   (runs: {len(off)} off, {len(on)} on, interleaved)")
    ratios = []
    for k in keys:
        a = statistics.median(r[k] for r in off if k in r); b = statistics.median(r[k] for r in on if k in r)
        ratios.append(b / a)
        print(f"{k[0]:>6} {k[1]:>9} {a:>16.2f} {b:>15.2f} {b/a:>7.3f}")
    print(f"geometric mean of on/off: {statistics.geometric_mean(ratios):.3f}")
else:
    runs = ", ".join(f"{len(v)} {m}" for m, v in modes.items())
    print(f"{'op':>6} {'bytes':>9} {'off_gbps':>9} " + " ".join(f"{m + '/off':>11}" for m in MODES) + f"   (medians; runs: {len(off)} off, {runs}, interleaved)")
    ratios = {m: [] for m in MODES}
    for k in keys:
        a = statistics.median(r[k] for r in off if k in r)
        cells = []
        for m in MODES:
            b = statistics.median(r[k] for r in modes[m] if k in r)
            ratios[m].append(b / a)
            cells.append(f"{b / a:>11.3f}")
        print(f"{k[0]:>6} {k[1]:>9} {a:>9.2f} " + " ".join(cells))
    print("geometric mean:   " + " ".join(f"{m}/off {statistics.geometric_mean(r):.3f}" for m, r in ratios.items()))
