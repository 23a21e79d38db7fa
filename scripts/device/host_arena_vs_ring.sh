#!/usr/bin/env bash
# Issue 20 (CPU DDP needs a faster same-host all_reduce): the shared-arena protocol of
# host_arena_probe.c (a standalone C program: the protocol's first form, its own speed),
# Accord's all_reduce through the arena (`ACCORD_COLL_ARENA=1 accord bench all-reduce`,
# crates/accord-coll/src/arena/), the same with the arena off (`ACCORD_COLL_ARENA=0`: the
# engine's schedules chosen by size) and gloo, at the same rank counts and sizes, alternated run
# by run.
# Usage: [RANKS="4 8"] [SIZES="4194304 16777216 67108864"] [CHUNKS="1048576"] [ROUNDS=2]
#        scripts/device/host_arena_vs_ring.sh ACCORD_BIN
# Prints one row per (round, ranks, size): the probe's µs per call for each chunk size, accord µs
# (out of place) with ACCORD_COLL_ARENA=1 and =0, gloo µs where $PY imports torch
# (gloo_bench.py under torchrun), and the ratios off/default and gloo/default (above 1: the
# arena is faster). BUDGET_S (default 300 s) caps the whole command; each
# run is cut to 60 s and skipped when under 20 s are left. Accord's runs check every value
# (`-c 1`); a row with a wrong value prints "failed".
set -uo pipefail
DEFAULT_BUDGET_S=300
. "$(dirname "$0")/budget.sh"
BIN=${1:?accord binary}
PROBE="$OUT/host_arena_probe"
cc -O2 -march=x86-64 -o "$PROBE" "$HERE/host_arena_probe.c" || { echo "host_arena_probe.c did not build"; exit 1; }
host_facts 2>/dev/null || true
CHUNKS=${CHUNKS:-1048576}
HAVE_TORCH=0
"$PY" -c "import torch.distributed" 2>/dev/null && HAVE_TORCH=1
printf "%-5s %5s %10s %s %10s %10s %10s %8s %8s\n" round ranks bytes "$(for c in $CHUNKS; do printf "%12s " "probe_${c}"; done)" \
  accord_us arena_off gloo_us off/acc gloo/acc
for round in $(seq "${ROUNDS:-2}"); do
  for n in ${RANKS:-4 8}; do
    for s in ${SIZES:-4194304 16777216 67108864}; do
      row=""
      for c in $CHUNKS; do
        t=$(capped 60 20) || { echo "skipped: $(left) s left"; exit 0; }
        us=$(timeout -k 5 "$t" "$PROBE" "$n" "$s" "$c" 10 | awk '$NF == 0 {for (i = 1; i < NF; i++) if ($i == "time_us") print $(i + 1)}')
        row="$row$(printf "%12s " "${us:-failed}")"
      done
      t=$(capped 60 20) || { echo "skipped: $(left) s left"; exit 0; }
      acc=$(ACCORD_COLL_ARENA=1 timeout -k 5 "$t" "$BIN" bench all-reduce --ranks "$n" -b "$s" -e "$s" -w 2 -n 10 -c 1 | awk '/^ +[0-9]/ && $9 == 0 {print $6}')
      t=$(capped 60 20) || { echo "skipped: $(left) s left"; exit 0; }
      off=$(ACCORD_COLL_ARENA=0 timeout -k 5 "$t" "$BIN" bench all-reduce --ranks "$n" -b "$s" -e "$s" -w 2 -n 10 -c 1 | awk '/^ +[0-9]/ && $9 == 0 {print $6}')
      gloo=""
      if [ "$HAVE_TORCH" = 1 ] && t=$(capped 60 20); then
        gloo=$(timeout -k 5 "$t" "$PY" -m torch.distributed.run --standalone --nproc_per_node "$n" "$HERE/gloo_bench.py" \
          --sizes "$s" --warmup 2 --iters 10 2>/dev/null | "$PY" -c 'import json,sys; print("%.1f" % json.loads(sys.stdin.readline())["rows"][0]["time_us"])' 2>/dev/null)
      fi
      ratio() { awk -v a="${1:-0}" -v b="${acc:-0}" 'BEGIN {if (a > 0 && b > 0) printf "%.2f", a / b; else print "-"}'; }
      printf "%-5s %5s %10s %s %10s %10s %10s %8s %8s\n" "$round" "$n" "$s" "$row" "${acc:-failed}" "${off:-failed}" "${gloo:--}" \
        "$(ratio "$off")" "$(ratio "$gloo")"
    done
  done
done
