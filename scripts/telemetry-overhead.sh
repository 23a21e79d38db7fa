#!/usr/bin/env bash
# Interleaved runs of `accord bench p2p --json`, telemetry off and on.
#   scripts/telemetry-overhead.sh [OUT_DIR] [ACCORD_BINARY]
# ROUNDS (default 10): rounds; each runs off, then every mode of MODES once. The summary
#   (scripts/telemetry_overhead_summary.py) prints per size the median of the rounds' paired
#   ratios mode/off, the interval that bounds it (min..max with 6 rounds, 97%; tighter ranks
#   with more) and whether the 3% target is met, missed or not resolved by that many rounds.
# MODES (default "on"): on = metrics endpoint + trace file, metrics = the endpoint only,
#   trace = the trace file only (both still keep the latency histograms), so a cost can be
#   pinned on one half.
# BENCH_ARGS: extra arguments for the bench (default none).
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/ovh}; mkdir -p "$OUT"
BIN=${2:-./target/release/accord}
MODES=${MODES:-on}
# Runs of an earlier call with more rounds would be summarised with these.
for kind in off $MODES; do rm -f "$OUT/$kind"[0-9]*.json; done
for i in $(seq 1 "${ROUNDS:-10}"); do
  "$BIN" bench p2p --json $BENCH_ARGS > "$OUT/off$i.json" 2>/dev/null
  for mode in $MODES; do
    case $mode in
      on) env=(ACCORD_METRICS_ADDR=127.0.0.1:0 "ACCORD_TRACE_FILE=$OUT/trace$i-%p.json") ;;
      metrics) env=(ACCORD_METRICS_ADDR=127.0.0.1:0) ;;
      trace) env=("ACCORD_TRACE_FILE=$OUT/trace$i-%p.json") ;;
      *) echo "unknown mode $mode (on, metrics, trace)" >&2; exit 2 ;;
    esac
    env "${env[@]}" "$BIN" bench p2p --json $BENCH_ARGS > "$OUT/$mode$i.json" 2>/dev/null
  done
done
python3 scripts/telemetry_overhead_summary.py "$OUT" $MODES
