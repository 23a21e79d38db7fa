#!/usr/bin/env bash
# Interleaved runs of `accord bench p2p --json`, telemetry off and on (metrics endpoint + trace file).
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/ovh}; mkdir -p "$OUT"
for i in 1 2 3 4; do
  ./target/release/accord bench p2p --json > $OUT/off$i.json 2>/dev/null
  ACCORD_METRICS_ADDR=127.0.0.1:0 ACCORD_TRACE_FILE=$OUT/trace$i-%p.json ./target/release/accord bench p2p --json > $OUT/on$i.json 2>/dev/null
done
python3 scripts/telemetry_overhead_summary.py "$OUT"
