#!/usr/bin/env bash
# Issue 4's peer comparison: Accord (`accord bench`, host buffers) and Gloo (torch.distributed,
# CPU tensors, TCP over loopback) on the same host, same sizes, 4 and 8 ranks, one run. Accord
# runs twice: with its same-host shared-memory datapath (the default) and with ACCORD_SHM=0
# (kernel UDP over loopback, as Gloo's TCP), so both comparisons come from the same call.
# Prints every JSON line; `compare_gloo.py` turns them into the side-by-side table.
# Usage (on the GPU host, from the repo root): scripts/device/compare_gloo.sh ACCORD_BIN OUT_DIR
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BIN=${1:?accord binary}; OUT=${2:?output dir}; mkdir -p "$OUT"
SIZES=1048576,4194304,16777216,67108864
for n in 4 8; do
  for c in all_reduce all_gather all_to_all; do
    flag=${c//_/-}
    echo "== accord $c n=$n" >&2
    timeout 240 "$BIN" bench "$flag" --ranks "$n" -b 1M -e 64M -f 4 -w 2 -n 5 -c 1 --json > "$OUT/accord_${c}_${n}.json" || echo "accord $c n=$n FAILED" >&2
    echo "== accord (ACCORD_SHM=0) $c n=$n" >&2
    ACCORD_SHM=0 timeout 240 "$BIN" bench "$flag" --ranks "$n" -b 1M -e 64M -f 4 -w 2 -n 5 -c 1 --json > "$OUT/accordudp_${c}_${n}.json" || echo "accord udp $c n=$n FAILED" >&2
    echo "== gloo $c n=$n" >&2
    timeout 240 torchrun --standalone --nproc_per_node "$n" scripts/device/gloo_bench.py --collective "$c" --sizes "$SIZES" --warmup 2 --iters 5 > "$OUT/gloo_${c}_${n}.json" 2> "$OUT/gloo_${c}_${n}.err" || echo "gloo $c n=$n FAILED" >&2
  done
done
python3 scripts/device/compare_gloo.py "$OUT"
