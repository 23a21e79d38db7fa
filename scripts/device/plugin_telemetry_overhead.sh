#!/usr/bin/env bash
# What telemetry costs the NCCL plugin's all_reduce (issue 18: under 3% at 256 MiB), on one
# host with 2 GPUs: ROUNDS rounds, each running torch.distributed over the plugin
# (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Accord) once with telemetry off and once on
# (ACCORD_METRICS_ADDR=127.0.0.1:0 and ACCORD_TRACE_FILE), alternating which goes first.
# Each run is scripts/device/nccl_plugin_bench.py at BYTES only (its correctness digests are
# compared across all runs: telemetry must not change a bit). The runs are converted to the
# rows scripts/telemetry_overhead_summary.py reads, which prints the paired ratio on/off with
# the interval that bounds it and the verdict against the 3% target.
#
# MODE=ab measures instead inside one process pair: separate runs spread more between
# themselves than a 3% cost (docs/results/2026-11-26-never-hang.md). One torchrun run with telemetry on, where
# nccl_plugin_bench.py --telemetry-ab PAIRS times PAIRS pairs of blocks of ITERS all_reduces,
# the plugin's recording paused in one block and on in the other (switched in both ranks
# through the plugin's accord_telemetry_set_recording), and the summary judges the pairs'
# ratios (scripts/telemetry_overhead_summary.py --ab).
#
# Usage: scripts/device/plugin_telemetry_overhead.sh [output directory]
#        (default: target/plugin-telemetry)
# Knobs: ACCORD_NCCL_PLUGIN=<path to .so> (default: build it), MODE (runs, the default, or
#        ab), ROUNDS (default 6), BYTES (default 268435456), ITERS (default 20; per block in
#        ab mode, default 5 there), PAIRS (ab mode, default 20), PYTHON, TORCHRUN.
set -uo pipefail

. "$(dirname "$0")/plugin_env.sh" "${1:-}" plugin-telemetry
MODE=${MODE:-runs}
ROUNDS=${ROUNDS:-6}
BYTES=${BYTES:-268435456}
PAIRS=${PAIRS:-20}
case $MODE in
    runs) ITERS=${ITERS:-20} ;;
    ab) ITERS=${ITERS:-5} ;;
    *) echo "MODE must be runs or ab, not $MODE" >&2; exit 2 ;;
esac
TORCHRUN=${TORCHRUN:-torchrun}
BENCH=$ROOT/scripts/device/nccl_plugin_bench.py

fail() {
    echo "FAILED: $*" >&2
    exit 1
}

command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: run on the GPU host"
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] || fail "need 2 GPUs"
command -v "$TORCHRUN" >/dev/null || fail "torchrun not found (set TORCHRUN)"
accord_plugin
PLUGIN_DIR=$(mktemp -d)
trap 'rm -rf "$PLUGIN_DIR"' EXIT
ln -sf "$PLUGIN" "$PLUGIN_DIR/libnccl-net-accord.so"

export ACCORD_NET_IFS=${ACCORD_NET_IFS:-127.0.0.1}
export ACCORD_PATHS=${ACCORD_PATHS:-4}
export ACCORD_SHARD_BYTES=${ACCORD_SHARD_BYTES:-262144}
RUN_ENV=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=WARN NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=Accord
    LD_LIBRARY_PATH="$PLUGIN_DIR:${LD_LIBRARY_PATH:-}")
rm -f "$OUT"/off[0-9]*.json "$OUT"/on[0-9]*.json "$OUT"/raw-*.json "$OUT"/ab.json

PORT=$((29500 + RANDOM % 1000))

if [ "$MODE" = ab ]; then
    env "${RUN_ENV[@]}" ACCORD_METRICS_ADDR=127.0.0.1:0 "ACCORD_TRACE_FILE=$OUT/trace-ab-%p.json" \
        timeout 300 "$TORCHRUN" --standalone --nproc_per_node 2 --master_port "$PORT" "$BENCH" \
        --label ab --out "$OUT/ab.json" --min-bytes "$BYTES" --max-bytes "$BYTES" --iters "$ITERS" \
        --telemetry-ab "$PAIRS" >"$OUT/ab.log" 2>&1 || { cat "$OUT/ab.log" >&2; fail "the A/B run failed"; }
    grep -h "telemetry A/B" "$OUT/ab.log" | sed "s/^/  /"
    echo "=== telemetry recording on vs paused, one process pair (plugin all_reduce busbw, GB/s)"
    "$PYTHON" "$ROOT/scripts/telemetry_overhead_summary.py" --ab "$OUT/ab.json"
    exit $?
fi
# One run: round, kind (off | on).
run() {
    local i=$1 kind=$2 telemetry=()
    [ "$kind" = on ] && telemetry=(ACCORD_METRICS_ADDR=127.0.0.1:0 "ACCORD_TRACE_FILE=$OUT/trace$i-%p.json")
    PORT=$((PORT + 1))
    env "${RUN_ENV[@]}" "${telemetry[@]}" timeout 300 "$TORCHRUN" --standalone --nproc_per_node 2 \
        --master_port "$PORT" "$BENCH" --label "$kind$i" --out "$OUT/raw-$kind$i.json" \
        --min-bytes "$BYTES" --max-bytes "$BYTES" --iters "$ITERS" >"$OUT/$kind$i.log" 2>&1 ||
        { echo "round $i, $kind: the run failed (see $OUT/$kind$i.log)" >&2; return; }
    # The summary's row format: {"rows": [{"op", "bytes", "accord_gbps"}]}, busbw as the rate.
    "$PYTHON" - "$OUT/raw-$kind$i.json" "$OUT/$kind$i.json" <<'EOF'
import json, sys
raw = json.load(open(sys.argv[1]))
rows = [{"op": "allred", "bytes": int(b), "accord_gbps": r["busbw"]} for b, r in raw["all_reduce"].items()]
json.dump({"rows": rows, "digests": raw["digests"]}, open(sys.argv[2], "w"))
EOF
    grep -h "busbw" "$OUT/$kind$i.log" | sed "s/^/  /"
}

for i in $(seq 1 "$ROUNDS"); do
    if [ $((i % 2)) = 1 ]; then run "$i" off; run "$i" on; else run "$i" on; run "$i" off; fi
done

echo "=== bit for bit: every run's correctness digests"
"$PYTHON" - "$OUT" <<'EOF'
import glob, json, sys
digests = {f: json.dumps(json.load(open(f))["digests"], sort_keys=True) for f in glob.glob(sys.argv[1] + "/o*[0-9].json")}
distinct = set(digests.values())
print(f"{len(digests)} runs, {len(distinct)} distinct result sets" + ("" if len(distinct) == 1 else "  <- MISMATCH"))
EOF
echo "=== telemetry on vs off (plugin all_reduce busbw, GB/s)"
"$PYTHON" "$ROOT/scripts/telemetry_overhead_summary.py" "$OUT" on
