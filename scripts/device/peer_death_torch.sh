#!/usr/bin/env bash
# Peer death under NCCL and PyTorch on one host with 2 GPUs: two ranks (plain processes, not
# torchrun, whose agent would end the survivor) run all_reduces over the network path
# (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1); rank 1 kills itself (SIGKILL) between all_reduces;
# rank 0's next all_reduce must fail. Measured twice in one call: through the Accord plugin
# (NCCL_NET=Accord) and through NCCL's Socket transport. Prints one table:
#   transport  raised  seconds_after_death  error
# Target (issue 18): Accord errors within 3 s; Socket's figure is the same call's baseline.
#
# Usage: scripts/device/peer_death_torch.sh [output directory]   (default: target/peer-death)
# Knobs: ACCORD_NCCL_PLUGIN=<path to libnccl-net-accord.so> (default: build it), PYTHON,
#        LIMIT_S (the survivor's bounded wait, default 120), ACCORD_* engine variables.
set -uo pipefail

. "$(dirname "$0")/plugin_env.sh" "${1:-}" peer-death
LIMIT_S=${LIMIT_S:-120}
SCRIPT=$ROOT/scripts/device/peer_death_torch.py

fail() {
    echo "FAILED: $*" >&2
    exit 1
}

echo "=== check the host"
command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: run on the GPU host"
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] || fail "need 2 GPUs"
"$PYTHON" -c "import torch; assert torch.cuda.device_count() >= 2" || fail "python with CUDA torch and 2 GPUs needed"

echo "=== the plugin"
accord_plugin
export ACCORD_NET_IFS=${ACCORD_NET_IFS:-127.0.0.1}

NET_ONLY=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=WARN TORCH_NCCL_ASYNC_ERROR_HANDLING=1)
PORT=$((29500 + RANDOM % 1000))

run() { # label, env assignments...
    local label=$1
    shift
    PORT=$((PORT + 1))
    local death=$OUT/$label.death
    rm -f "$death" "$OUT/$label.json"
    local pids=()
    for rank in 0 1; do
        env "$@" RANK=$rank WORLD_SIZE=2 LOCAL_RANK=$rank MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT \
            timeout $((LIMIT_S + 60)) "$PYTHON" "$SCRIPT" --label "$label" --out "$OUT/$label.json" \
            --death-file "$death" --limit-s "$LIMIT_S" >"$OUT/$label.rank$rank.log" 2>&1 &
        pids+=($!)
    done
    wait "${pids[0]}"
    kill -9 "${pids[1]}" 2>/dev/null
    wait "${pids[1]}" 2>/dev/null
    [ -f "$OUT/$label.json" ] || echo "{\"label\": \"$label\", \"raised\": null, \"error\": \"rank 0 wrote nothing, see $OUT/$label.rank0.log\", \"seconds_after_death\": null}" >"$OUT/$label.json"
}

echo "=== Accord plugin (NCCL_NET=Accord)"
run accord "${NET_ONLY[@]}" NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=Accord
echo "=== NCCL Socket transport"
run socket "${NET_ONLY[@]}" NCCL_NET=Socket NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"

echo "=== result"
"$PYTHON" - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
print(f"{'transport':>10} {'raised':>7} {'seconds_after_death':>20}  error")
for label in ("accord", "socket"):
    r = json.loads((out / f"{label}.json").read_text())
    s = r.get("seconds_after_death")
    print(f"{label:>10} {str(r.get('raised')):>7} {('%.2f' % s) if s is not None else '-':>20}  {(r.get('error') or '')[:120]}")
a = json.loads((out / "accord.json").read_text())
ok = a.get("raised") and a.get("seconds_after_death") is not None and a["seconds_after_death"] < 3.0
print("target (Accord errors within 3 s):", "met" if ok else "NOT met")
PY
