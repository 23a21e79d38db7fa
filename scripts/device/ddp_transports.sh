#!/usr/bin/env bash
# DDP step time over each NCCL transport, 2 GPUs, one call (issue 21): scripts/device/ddp_transports.py
# under torchrun once per transport, then a table with each transport's median against tuned Socket
# and a check that every transport ended with the same parameters.
# Usage: scripts/device/ddp_transports.sh OUT_DIR
# Env:   ACCORD_NCCL_PLUGIN (libnccl-net-accord.so), TRANSPORTS (default
#        "nvlink socket accord accord_gpu"; the names of scripts/device/transports.sh), STEPS (40),
#        RUN_TIMEOUT (s per transport, 120), EXTRA_ENV (VAR=value words added to every run),
#        ROUNDS (1): the transports run in turn ROUNDS times, so each round pairs them in time;
#        the table shows every round and each transport's median over the rounds, with its ratio
#        to Socket's round by round (the step time of this loop moves by 10-30% between calls).
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
for round in $(seq 1 "${ROUNDS:-1}"); do
    for transport in ${TRANSPORTS:-nvlink socket accord accord_gpu}; do
        read -r -a envs <<<"$(transport_env "$transport" "$PLUGIN_DIR")"
        if [ "${envs[0]:-}" = UNKNOWN ]; then echo "unknown transport $transport"; continue; fi
        PORT=$((PORT + 1))
        log="$OUT/ddp_${transport}_r$round.log"
        env "${envs[@]}" ${EXTRA_ENV:-} timeout "${RUN_TIMEOUT:-120}" python3 -m torch.distributed.run --standalone --nproc_per_node 2 --master_port "$PORT" \
            "$HERE/ddp_transports.py" --label "$transport" --steps "${STEPS:-40}" >"$log" 2>&1
        rc=$?
        { grep -h '^{' "$log" || echo "{\"label\": \"$transport\", \"rc\": $rc}"; } |
            python3 -c 'import json,sys; [print(json.dumps({**json.loads(l), "round": int(sys.argv[1])})) for l in sys.stdin if l.strip()]' "$round" \
            >>"$OUT/ddp.jsonl"
    done
done
python3 "$HERE/ddp_transports_table.py" "$OUT/ddp.jsonl"
