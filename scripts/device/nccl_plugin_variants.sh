#!/usr/bin/env bash
# NCCL all_reduce through the Accord plugin under several environment variants in one call
# (2 GPUs, NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1), one busbw line per variant, so knobs are
# compared within one call (this host's figures move +-15% between calls).
#
# Usage: scripts/device/nccl_plugin_variants.sh OUT_DIR 'label:VAR=v,VAR=v' ['label2:...' ...]
#   A label with no variables runs the defaults. The label 'socket' (and 'socket_tuned') runs
#   NCCL's Socket transport instead of the plugin (its variables still apply).
# Env: ACCORD_NCCL_PLUGIN (path to the built .so; required), MIN_BYTES (default 1 MiB),
#      MAX_BYTES (default 256 MiB), ITERS (default 10), WARMUP (default 3), NCCL_DEBUG_SUBSYS
#      (default INIT; TUNING adds NCCL's per-collective algorithm/protocol lines).
#      VARIANT_TIMEOUT (seconds per variant, default 180).
# Prints per variant: `label rc=<exit> <size>K:<busbw> ...` and NCCL's channel count line, and
# the host's copy bandwidth before and after (scripts/device/host_copy_bandwidth.sh).
# Used for the fourth session's sweeps (docs/results/2026-11-22-nccl-plugin.md, session 4).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?output directory}
shift
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PLUGIN=$(readlink -f "${ACCORD_NCCL_PLUGIN:?set ACCORD_NCCL_PLUGIN to the built libnccl-net-accord.so}")
mkdir -p "$OUT"
DIR=$(mktemp -d)
ln -sf "$PLUGIN" "$DIR/libnccl-net-accord.so"
PORT=$((30100 + RANDOM % 500))
scripts/device/host_copy_bandwidth.sh
for spec in "$@"; do
    label=${spec%%:*}
    vars=()
    if [ "$spec" != "$label" ] && [ -n "${spec#*:}" ]; then
        IFS=',' read -r -a vars <<<"${spec#*:}"
    fi
    case "$label" in
        socket*) net=(NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo) ;;
        *) net=(NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=Accord LD_LIBRARY_PATH="$DIR:${LD_LIBRARY_PATH:-}"
                ACCORD_NET_IFS="${ACCORD_NET_IFS:-127.0.0.1}") ;;
    esac
    PORT=$((PORT + 1))
    env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS="${NCCL_DEBUG_SUBSYS:-INIT}" \
        "${net[@]}" "${vars[@]}" timeout "${VARIANT_TIMEOUT:-180}" torchrun --standalone --nproc_per_node 2 --master_port "$PORT" \
        scripts/device/nccl_plugin_bench.py --label "$label" --out "$OUT/$label.json" \
        --iters "${ITERS:-10}" --warmup "${WARMUP:-3}" --min-bytes "${MIN_BYTES:-1048576}" \
        --max-bytes "${MAX_BYTES:-268435456}" >"$OUT/$label.log" 2>&1
    rc=$?
    line=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['all_reduce']; print(' '.join(f'{int(k)>>10}K:{v[\"busbw\"]:.2f}' for k,v in sorted(d.items(), key=lambda x:int(x[0]))))" "$OUT/$label.json" 2>&1)
    echo "$label rc=$rc $line"
    grep -h "coll channels" "$OUT/$label.log" | head -1
done
scripts/device/host_copy_bandwidth.sh
rm -rf "$DIR"
