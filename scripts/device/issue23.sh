#!/usr/bin/env bash
# Issue 23's whole measurement in one device call, from a carried bundle (made here by
# scripts/device/issue23_pack.sh): the GPU tests of the copy shapes, accord.kv per copy shape
# against the copy ceiling (kv_gpu.sh), NIXL and Mooncake on the same requests (kv_nixl.sh,
# kv_mooncake.sh), the weight push
# per copy shape against the ceiling and NCCL (weights_gpu.sh), and the network route of both.
# Runs the bundle's own copies of the scripts and benches, so it measures the bundle's code
# whatever the checkout holds.
#
# Usage (GPU host, repo root), the bundle carried as .carry/h23k say:
#   BUNDLE=.carry/h23k bash .carry/h23k/repo/scripts/device/issue23.sh
# STEPS (default "tests kv nixl mooncake weights network") picks steps; KV_SHAPES (default 1/0,4/1,8/1)
# and WEIGHT_SHAPES (default 1/0,4/1) the copy shapes (STREAMS/BATCH; 1/0 is the route before
# ACCORD_DEVICE_COPY_STREAMS and ACCORD_DEVICE_COPY_BATCH_2D, the same-run baseline); KV_CASE
# (default ipc: two processes, as NIXL runs) the kv_gpu.sh case of the shape sweep; GB (default
# 16) the weights; KV_S (140), NIXL_S (80), MOONCAKE_S (90), WEIGHT_RUN_S (100 a shape), WEIGHTS_S
# (200), NETWORK_S (50 for each of KV and weights) each step's seconds: every step at its cap is
# over 600 s, so pick STEPS, shapes and caps for one call, e.g. the defaults' route only:
#   STEPS="tests kv nixl mooncake weights network" KV_SHAPES=1/0 WEIGHT_SHAPES=1/0 KV_S=60 WEIGHTS_S=100
# (about 230 s by the 2026-11-26 run's step times plus an estimate for Mooncake; the caps allow
# more, so keep the call's timeout at 600 s).
# What comes back under $OUT (at most 8 files): all.log (every step's output), kv.jsonl and
# weights.jsonl (the rows), tests.txt. Exits non-zero when a step failed.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
BUNDLE="$(cd "${BUNDLE:?set BUNDLE to the carried folder}" && pwd)"
DEV="$BUNDLE/repo/scripts/device"
OUT="${OUT:?set OUT}"
WORK=$(mktemp -d) || { echo "issue23: cannot make a work folder"; exit 1; }
STEPS=${STEPS:-tests kv nixl mooncake weights network}
WHEEL=$(ls "$BUNDLE"/accord-*.whl | head -1)
NIXL_TREE=$(ls "$BUNDLE"/nixl*.tar.xz 2>/dev/null | head -1)
MOONCAKE_TREE=$(ls "$BUNDLE"/mooncake*.tar.xz 2>/dev/null | head -1)
FAILED=0 PY=${PYTHON:-python3}
step() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# show NAME LOG: the log's lines that are not per-phase diagnostics, last 25, and the whole log into all.log.
show() { echo "######## $1"; grep -v '^\[kv_gpu_bench\|NIXL INFO\|^\[kv_mooncake_bench' "$2" | tail -25; { echo "######## $1"; cat "$2"; } >> "$OUT/all.log"; }
nvidia-smi -L
"$PY" -m pip install --quiet --no-deps --force-reinstall "$WHEEL" || { echo "cannot install $WHEEL"; exit 1; }
if step tests; then
  { timeout 60 "$BUNDLE/bin/gpu" --test-threads=1 --nocapture batched two_d
    timeout 90 "$BUNDLE/bin/accord_engine" --test-threads=1 device::tests::kv_shaped device::tests::same_process_paged
  } > "$OUT/tests.txt" 2>&1 || FAILED=1
  echo "######## GPU tests"; grep -E "^test |test result|panicked|2D batches" "$OUT/tests.txt"
fi
if step kv; then
  OUT=$WORK/kv CASES=${KV_CASE:-ipc} SHAPES=${KV_SHAPES:-1/0,4/1,8/1} ITERS=${ITERS:-3} IPC_CAP_S=${KV_S:-140} \
    INPROC_CAP_S=${KV_S:-140} BUDGET_S=$(( ${KV_S:-140} + 5 )) bash "$DEV/kv_gpu.sh" > "$WORK/kv.log" 2>&1 || FAILED=1
  show "accord.kv per copy shape (${KV_CASE:-ipc})" "$WORK/kv.log"
fi
if step nixl && [ -n "$NIXL_TREE" ]; then
  OUT=$WORK/nixl NIXL_TREE=$NIXL_TREE ITERS=${ITERS:-3} BUDGET_S=${NIXL_S:-80} bash "$DEV/kv_nixl.sh" > "$WORK/nixl.log" 2>&1 || FAILED=1
  show "NIXL (UCX)" "$WORK/nixl.log"
fi
if step mooncake; then
  if [ -n "$MOONCAKE_TREE" ]; then
    OUT=$WORK/mooncake MOONCAKE_TREE=$MOONCAKE_TREE NIXL_TREE=$NIXL_TREE ITERS=${ITERS:-3} BUDGET_S=${MOONCAKE_S:-90} \
      bash "$DEV/kv_mooncake.sh" > "$WORK/mooncake.log" 2>&1 || FAILED=1
    show "Mooncake (transfer engine)" "$WORK/mooncake.log"
  else
    echo "######## Mooncake: skipped, no mooncake*.tar.xz in $BUNDLE"; FAILED=1
  fi
fi
if step weights; then
  OUT=$WORK/w SHAPES=${WEIGHT_SHAPES:-1/0,4/1} GB=${GB:-16} ITERS=${ITERS:-3} IPC_CAP_S=${WEIGHT_RUN_S:-100} NETWORK_GB=0 \
    BUDGET_S=${WEIGHTS_S:-200} bash "$DEV/weights_gpu.sh" > "$WORK/weights.log" 2>&1 || FAILED=1
  show "weight push per copy shape" "$WORK/weights.log"
fi
if step network; then
  OUT=$WORK/kvnet CASES=network NETWORK_BLOCKS=${NETWORK_BLOCKS:-128} NETWORK_CAP_S=${NETWORK_S:-50} \
    BUDGET_S=$(( ${NETWORK_S:-50} + 5 )) bash "$DEV/kv_gpu.sh" > "$WORK/kvnet.log" 2>&1 || FAILED=1
  show "KV, network route (ACCORD_DEVICE_IPC=0 ACCORD_SHM=0)" "$WORK/kvnet.log"
  OUT=$WORK/wnet SKIP_IPC=1 NETWORK_GB=${NETWORK_GB:-1} NETWORK_CAP_S=${NETWORK_S:-50} \
    BUDGET_S=$(( ${NETWORK_S:-50} + 5 )) bash "$DEV/weights_gpu.sh" > "$WORK/wnet.log" 2>&1 || FAILED=1
  show "weights, network route" "$WORK/wnet.log"
fi
cat "$WORK"/kv/kv_gpu.jsonl "$WORK"/nixl/kv_gpu.jsonl "$WORK"/mooncake/kv_gpu.jsonl "$WORK"/kvnet/kv_gpu.jsonl > "$OUT/kv.jsonl" 2>/dev/null
cat "$WORK"/w/weights_gpu.jsonl "$WORK"/wnet/weights_gpu.jsonl > "$OUT/weights.jsonl" 2>/dev/null
echo "######## all KV rows (ratio: GB/s over the copy ceiling of the same run)"
"$PY" "$BUNDLE/repo/examples/kv_gpu_bench.py" --table "$OUT/kv.jsonl"
echo "######## all weight rows"
"$PY" "$BUNDLE/repo/examples/weight_push_gpu_bench.py" --table "$OUT/weights.jsonl"
rm -rf "$WORK"
exit $FAILED
