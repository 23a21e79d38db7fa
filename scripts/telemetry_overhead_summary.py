"""Summarises scripts/telemetry-overhead.sh: median accord_gbps per size, telemetry off vs on."""
import json, statistics, sys, glob

OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/ovh"

def load(kind):
    runs = []
    for f in sorted(glob.glob(f"{OUT}/{kind}[0-9].json")):
        rows = json.loads(open(f).read())["rows"]
        runs.append({(r["op"], r["bytes"]): r["accord_gbps"] for r in rows})
    return runs
off, on = load("off"), load("on")
keys = sorted(off[0], key=lambda k: (k[0], k[1]))
print(f"{'op':>6} {'bytes':>9} {'off_gbps_median':>16} {'on_gbps_median':>15} {'on/off':>7}   (runs: {len(off)} off, {len(on)} on, interleaved)")
ratios = []
for k in keys:
    a = statistics.median(r[k] for r in off if k in r); b = statistics.median(r[k] for r in on if k in r)
    ratios.append(b / a)
    print(f"{k[0]:>6} {k[1]:>9} {a:>16.2f} {b:>15.2f} {b/a:>7.3f}")
print(f"geometric mean of on/off: {statistics.geometric_mean(ratios):.3f}")
