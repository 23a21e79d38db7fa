#!/usr/bin/env bash
# Busbw of each algorithm of all_reduce and all_to_all on N local ranks, forced with --algo, to
# set the size thresholds of the default choice from measurements on the host that matters.
# Usage: [ROUNDS=R] [SPECS="collective:algo ..."] scripts/device/algo_sweep.sh ACCORD_BIN
# ROUNDS (default 1) repeats the whole list, so algorithms alternate round by round (the host's
# noise spreads over all of them); SPECS defaults to every all_reduce schedule for large
# messages (ring, rabenseifner, direct) and both all_to_all ones. BUDGET_S (default 540 s, from
# the start) caps the whole command; a run is cut to 120 s and to what is left, and skipped when
# under 30 s are left.
set -uo pipefail
DEFAULT_BUDGET_S=540
. "$(dirname "$0")/budget.sh"
BIN=${1:?accord binary}
SPECS=${SPECS:-all-reduce:ring all-reduce:rabenseifner all-reduce:direct all-to-all:pairwise all-to-all:direct}
for round in $(seq "${ROUNDS:-1}"); do
for n in 4 8; do
  for spec in $SPECS; do
    c=${spec%%:*}; a=${spec##*:}
    t=$(capped 120) || { echo "== $c $a n=$n round=$round: skipped, $(left) s left of the budget"; continue; }
    echo "== $c $a n=$n round=$round"
    timeout -k 10 "$t" "$BIN" bench "$c" --ranks "$n" -b 1M -e 64M -f 4 -w 2 -n 5 -c 0 --algo "$a" | grep -E '^ +[0-9]' \
      | awk -v c="$c" -v a="$a" -v n="$n" '{printf "%-11s %-13s %2d %10d %8.3f\n", c, a, n, $1, $8}'
  done
done
done
