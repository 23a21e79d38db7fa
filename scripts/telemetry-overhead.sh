#!/usr/bin/env bash
# Interleaved runs of `accord bench p2p --json`, telemetry off and on (metrics endpoint + trace file).
#   scripts/telemetry-overhead.sh [OUT_DIR] [ACCORD_BINARY]   (ROUNDS, default 4)
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/ovh}; mkdir -p "$OUT"
BIN=${2:-./target/release/accord}
for i in $(seq 1 "${ROUNDS:-4}"); do
  "$BIN" bench p2p --json > $OUT/off$i.json 2>/dev/null
  ACCORD_METRICS_ADDR=127.0.0.1:0 ACCORD_TRACE_FILE=$OUT/trace$i-%p.json "$BIN" bench p2p --json > $OUT/on$i.json 2>/dev/null
done
python3 scripts/telemetry_overhead_summary.py "$OUT"
