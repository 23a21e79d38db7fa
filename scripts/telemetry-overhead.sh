#!/usr/bin/env bash
# Interleaved runs of `accord bench p2p --json`, telemetry off and on.
#   scripts/telemetry-overhead.sh [OUT_DIR] [ACCORD_BINARY]
# Separate processes differ between themselves (placement, which core a worker lands on) by
# more than a 3% cost, so this method rarely resolves the target. The finer method runs in
# one process pair, recording paused and on in alternating blocks on the same connections:
#   ACCORD_METRICS_ADDR=127.0.0.1:0 ACCORD_TRACE_FILE=/tmp/t-%p.json accord bench p2p --telemetry-ab
# (and, for the NCCL plugin, MODE=ab scripts/device/plugin_telemetry_overhead.sh). This
# script stays for what only separate runs show: the cost of having the endpoint's thread and
# the trace's memory at all, and the metrics/trace halves apart (MODES).
# ROUNDS (default 10): rounds; each runs off and every mode of MODES once (off first in odd
#   rounds, last in even ones). The summary
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
# One run of `kind` (off or a mode) for round $1.
run() {
  local i=$1 kind=$2 env=()
  case $kind in
    off) ;;
    on) env=(ACCORD_METRICS_ADDR=127.0.0.1:0 "ACCORD_TRACE_FILE=$OUT/trace$i-%p.json") ;;
    metrics) env=(ACCORD_METRICS_ADDR=127.0.0.1:0) ;;
    trace) env=("ACCORD_TRACE_FILE=$OUT/trace$i-%p.json") ;;
    *) echo "unknown mode $kind (on, metrics, trace)" >&2; exit 2 ;;
  esac
  env "${env[@]}" "$BIN" bench p2p --json $BENCH_ARGS > "$OUT/$kind$i.json" 2>/dev/null ||
    echo "round $i, $kind: the bench failed (its file is skipped)" >&2
}
# Odd rounds run off first, even rounds last: a machine that warms up or slows down over a
# round does not favour one side of every pair.
kinds=(off $MODES)
for i in $(seq 1 "${ROUNDS:-10}"); do
  order=("${kinds[@]}")
  if [ $((i % 2)) -eq 0 ]; then
    order=()
    for ((k = ${#kinds[@]} - 1; k >= 0; k--)); do order+=("${kinds[k]}"); done
  fi
  for kind in "${order[@]}"; do run "$i" "$kind"; done
done
python3 scripts/telemetry_overhead_summary.py "$OUT" $MODES
