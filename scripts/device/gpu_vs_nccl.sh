#!/usr/bin/env bash
# Accord GPU collectives vs torch.distributed NCCL on one host, same call.
# Usage: scripts/device/gpu_vs_nccl.sh [BIN_DIR] [NPROC]
#   BIN_DIR holds accord-gpu-bench (default target/release); NPROC GPUs (default 2).
# Env: BENCH_MIN_BYTES, BENCH_MAX_BYTES (default 4096 .. 256 MiB), ACCORD_GPU_CHECK=1 adds --check.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
BIN_DIR="${1:-target/release}"
NPROC="${2:-2}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export BENCH_MIN_BYTES="${BENCH_MIN_BYTES:-4096}" BENCH_MAX_BYTES="${BENCH_MAX_BYTES:-268435456}"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
CHECK=""
[ "${ACCORD_GPU_CHECK:-0}" = "1" ] && CHECK="--check"
echo "== accord-gpu-bench ($NPROC ranks) =="
torchrun --standalone --nproc_per_node "$NPROC" --no-python "$HERE/accord_under_torchrun.sh" "$BIN_DIR/accord-gpu-bench" $CHECK \
  --min-bytes "$BENCH_MIN_BYTES" --max-bytes "$BENCH_MAX_BYTES" >"$OUT/accord.jsonl" 2>"$OUT/accord.err"
RC_A=$?
grep -v '^{' "$OUT/accord.jsonl"; tail -n 20 "$OUT/accord.err"
echo "accord rc=$RC_A"
echo "== torch.distributed NCCL ($NPROC ranks) =="
torchrun --standalone --nproc_per_node "$NPROC" "$HERE/gpu_vs_nccl.py" >"$OUT/nccl.jsonl" 2>"$OUT/nccl.err"
RC_N=$?
tail -n 5 "$OUT/nccl.err"
echo "nccl rc=$RC_N"
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())" 2>/dev/null
python3 "$HERE/gpu_vs_nccl_join.py" "$OUT/accord.jsonl" "$OUT/nccl.jsonl"
exit $(( RC_A | RC_N ))
