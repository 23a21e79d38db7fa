#!/usr/bin/env bash
# Issue 23's weight-push measurement on a host with two GPUs: accord.weights pushing a
# Llama-70B-like TP-8 shard (723 bf16 tensors scaled to GB gigabytes, default 16) from a trainer
# process on GPU 0 to an inference process on GPU 1, every byte checked after each version,
# against the copy ceiling (one contiguous torch copy_ of the same bytes GPU0 -> GPU1) and a
# torch.distributed.broadcast loop over NCCL, in the same run (examples/weight_push_gpu_bench.py).
# Two runs:
#   ipc      the route the engine picks on one host (device writes through CUDA IPC), and NCCL;
#   network  ACCORD_DEVICE_IPC=0 ACCORD_SHM=0 (staged, loopback UDP, landed), NETWORK_GB
#            gigabytes (default 1), no NCCL.
# Each run's output is kept in $OUT/<run>.txt, its row in $OUT/weights_gpu.jsonl; the table of
# both is printed at the end (ms per update, GB/s, accord over the ceiling, NCCL over accord).
#
# Usage (GPU host, repo root; python3 + torch with CUDA + the accord wheel):
#   [WHEEL=accord-*.whl] OUT=/path/to/out scripts/device/weights_gpu.sh
# WHEEL, when set, is installed first (pip --no-deps --force-reinstall). BUDGET_S (default 280)
# caps the whole command; each run gets at most IPC_CAP_S / NETWORK_CAP_S (default 200 / 70) and
# what is left; ITERS (default 3) timed updates after a warm-up; SHAPES (STREAMS/BATCH,
# comma-separated, e.g. 1/0,4/1) runs ipc once per copy shape (ACCORD_DEVICE_COPY_STREAMS /
# ACCORD_DEVICE_COPY_BATCH_2D; 1/0: the route before those knobs), NCCL with the last only;
# NETWORK_GB=0 skips the network run, SKIP_IPC=1 the ipc runs. Exits 2 when there is no
# CUDA (skipped), non-zero when a run failed or a byte was wrong.
set -uo pipefail
DEFAULT_BUDGET_S=280
. "$(dirname "$0")/budget.sh"
BENCH="$ROOT/examples/weight_push_gpu_bench.py"
JSON="$OUT/weights_gpu.jsonl"
: > "$JSON"

install_wheel
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else 2)" 2>/dev/null; then
  echo "weights_gpu: skipped: needs python3 with torch and two CUDA devices"
  exit 2
fi
"$PY" -c "import accord, accord.weights, torch; print('accord', accord.__version__, 'torch', torch.__version__, 'gpus', torch.cuda.device_count())" \
  || { echo "weights_gpu: python3 cannot import accord and accord.weights"; exit 1; }
host_facts

FAILED=0
# run NAME CAP ENV... -- ARGS...: one bench run (bench_run), then the end of its output.
run() {
  bench_run "$@" && tail -20 "$OUT/$1.txt"
}

ITERS=${ITERS:-3}
if [ "${SKIP_IPC:-0}" = 1 ]; then
  echo "== ipc: skipped (SKIP_IPC=1)"
elif [ -z "${SHAPES:-}" ]; then
  run ipc "${IPC_CAP_S:-200}" ACCORD_DEVICE_IPC=1 -- --case ipc --gb "${GB:-16}" --iters "$ITERS"
else
  # One ipc run per copy shape (STREAMS/BATCH), each capped at IPC_CAP_S; NCCL in the last only.
  IFS=, read -ra SHAPE_LIST <<< "$SHAPES"
  for i in "${!SHAPE_LIST[@]}"; do
    shape=${SHAPE_LIST[$i]} nccl=(--no-nccl)
    [ "$i" -eq $(( ${#SHAPE_LIST[@]} - 1 )) ] && nccl=()
    run "ipc-${shape/\//-}" "${IPC_CAP_S:-200}" ACCORD_DEVICE_IPC=1 ACCORD_DEVICE_COPY_STREAMS="${shape%/*}" \
      ACCORD_DEVICE_COPY_BATCH_2D="${shape#*/}" -- --case ipc --gb "${GB:-16}" --iters "$ITERS" ${nccl[@]+"${nccl[@]}"}
  done
fi
[ "${NETWORK_GB:-1}" = 0 ] || run network "${NETWORK_CAP_S:-70}" ACCORD_DEVICE_IPC=0 ACCORD_SHM=0 -- --case network --gb "${NETWORK_GB:-1}" \
  --iters 2 --no-nccl

echo
echo "######## all runs (x ceiling: accord's time over the ceiling's; nccl/accord: NCCL's time over accord's)"
"$PY" "$BENCH" --table "$JSON" || FAILED=1
echo
echo "results in $OUT; $(( SECONDS - START )) s"
exit $FAILED
