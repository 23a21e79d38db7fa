#!/usr/bin/env bash
# DDP step time over each NCCL transport, 2 GPUs, one call (issue 21): scripts/device/ddp_transports.py
# under torchrun once per transport, then a table with each transport's median against tuned Socket
# and a check that every transport ended with the same parameters.
# Usage: scripts/device/ddp_transports.sh OUT_DIR
# Env:   ACCORD_NCCL_PLUGIN (libnccl-net-accord.so), TRANSPORTS (default
#        "nvlink socket accord accord_gpu"; the names of scripts/device/transports.sh), STEPS (40),
#        RUN_TIMEOUT (s per transport, 120), EXTRA_ENV (VAR=value words added to every run)
set -uo pipefail
OUT=${1:?output directory}
mkdir -p "$OUT"
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/transports.sh"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
PLUGIN_DIR=$(mktemp -d)
trap 'rm -rf "$PLUGIN_DIR"' EXIT
[ -n "${ACCORD_NCCL_PLUGIN:-}" ] && ln -s "$(readlink -f "$ACCORD_NCCL_PLUGIN")" "$PLUGIN_DIR/libnccl-net-accord.so"
PORT=$((31200 + RANDOM % 500))
: >"$OUT/ddp.jsonl"
for transport in ${TRANSPORTS:-nvlink socket accord accord_gpu}; do
    read -r -a envs <<<"$(transport_env "$transport" "$PLUGIN_DIR")"
    if [ "${envs[0]:-}" = UNKNOWN ]; then echo "unknown transport $transport"; continue; fi
    PORT=$((PORT + 1))
    env "${envs[@]}" ${EXTRA_ENV:-} timeout "${RUN_TIMEOUT:-120}" python3 -m torch.distributed.run --standalone --nproc_per_node 2 --master_port "$PORT" \
        "$HERE/ddp_transports.py" --label "$transport" --steps "${STEPS:-40}" >"$OUT/ddp_$transport.log" 2>&1
    rc=$?
    grep -h '^{' "$OUT/ddp_$transport.log" >>"$OUT/ddp.jsonl" || echo "{\"label\": \"$transport\", \"rc\": $rc}" >>"$OUT/ddp.jsonl"
done
python3 - "$OUT/ddp.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = next((r for r in rows if r.get("label") == "socket" and "step_ms_median" in r), None)
digests = {r.get("params_sha256") for r in rows if "params_sha256" in r}
print(f"{'transport':<12} {'median ms':>10} {'p10':>8} {'p90':>8} {'vs socket':>10}  params")
for r in rows:
    if "step_ms_median" not in r:
        print(f"{r['label']:<12} failed rc={r.get('rc')}")
        continue
    ratio = f"{base['step_ms_median'] / r['step_ms_median']:.2f}x" if base else "-"
    print(f"{r['label']:<12} {r['step_ms_median']:>10.2f} {r['step_ms_p10']:>8.2f} {r['step_ms_p90']:>8.2f} {ratio:>10}  "
          f"{r['params_sha256']} ranks_agree={r['ranks_agree']}")
print("every transport gave the same parameters:", len(digests) == 1)
for r in rows:
    if r.get("gpu_stats"):
        print(f"{r['label']:<12} plugin GPU-buffer counters (rank 0):", json.dumps(r["gpu_stats"]))
PY
