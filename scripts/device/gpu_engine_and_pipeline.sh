#!/usr/bin/env bash
# Issue #6 remainder on one host with 2 GPUs: GPU tests of the engine's device route and of the
# pipelined all_reduce, the engine's GPU0->GPU1 write against the raw copy ceiling (same process
# and across processes through CUDA IPC), and an all_reduce sweep of pipeline chunk sizes.
# Usage: scripts/device/gpu_engine_and_pipeline.sh BIN_DIR
#   BIN_DIR holds accord-engine-gpu-bench, accord-gpu-bench, and the unit-test binaries
#   accord-engine-tests and accord-coll-tests (cargo test --release --no-run, copied).
# Env: CHUNK_SWEEP (default "4194304 8388608 16777216"), STREAMS_SWEEP (default "1 2"),
#      ENGINE_ITERS (default 30).
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
BIN="${1:-target/release}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
RC=0
echo "== engine device tests =="
timeout 120 "$BIN/accord-engine-tests" device --test-threads=1 --nocapture 2>&1 | grep -E "test |skipped|result|panicked" || RC=1
echo "== coll GPU tests (pipelined all_reduce, many chunks and rounds) =="
timeout 180 "$BIN/accord-coll-tests" gpu::gpu_tests --test-threads=1 --nocapture 2>&1 | grep -E "test |skipped|result|panicked|rank" | tail -30 || RC=1
echo "== engine write, same process =="
timeout 90 "$BIN/accord-engine-gpu-bench" --iters "${ENGINE_ITERS:-30}" || RC=1
echo "== engine write, receiver in another process (CUDA IPC) =="
timeout 90 "$BIN/accord-engine-gpu-bench" --ipc --iters "${ENGINE_ITERS:-30}" || RC=1
for streams in ${STREAMS_SWEEP:-1 2}; do
  for chunk in ${CHUNK_SWEEP:-4194304 8388608 16777216}; do
    echo "== all_reduce, ACCORD_GPU_PIPELINE_CHUNK_BYTES=$chunk ACCORD_GPU_STREAMS_PER_PEER=$streams =="
    ACCORD_GPU_PIPELINE_CHUNK_BYTES=$chunk ACCORD_GPU_STREAMS_PER_PEER=$streams timeout 120 \
      torchrun --standalone --nproc_per_node 2 --no-python "$HERE/accord_under_torchrun.sh" "$BIN/accord-gpu-bench" \
      --collectives all_reduce --order hostfn --min-bytes 16777216 --max-bytes 268435456 2>&1 |
      grep '^{' || RC=1
  done
done
exit $RC
