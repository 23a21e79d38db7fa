#!/usr/bin/env bash
# Busbw of each algorithm of all_reduce and all_to_all on N local ranks, forced with --algo, to
# set the size thresholds of the default choice from measurements on the host that matters.
# Usage: scripts/device/algo_sweep.sh ACCORD_BIN
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BIN=${1:?accord binary}
for n in 4 8; do
  for spec in all-reduce:ring all-reduce:rabenseifner all-to-all:pairwise all-to-all:direct; do
    c=${spec%%:*}; a=${spec##*:}
    echo "== $c $a n=$n"
    timeout 120 "$BIN" bench "$c" --ranks "$n" -b 1M -e 64M -f 4 -w 2 -n 5 -c 0 --algo "$a" | grep -E '^ +[0-9]' \
      | awk -v c="$c" -v a="$a" -v n="$n" '{printf "%-11s %-13s %2d %10d %8.3f\n", c, a, n, $1, $8}'
  done
done
