#!/usr/bin/env bash
# Issue 20: where CPU DDP's step time goes with the torch.distributed backend "accord", on the
# 32-core host: DDP-only runs of scripts/device/torch_backend_bench.py (~50M parameters, 25 MB
# buckets) at each rank count in RANKS for "accord" under each environment variant of VARIANTS
# and for "gloo", then scripts/ddp_timeline_probe.py once per rank count; one table at the end
# (variant, ranks, threads, local step, DDP accord, DDP gloo, gloo/accord, and each backend's
# all_reduce busbw alone at OP_SIZES).
#
# Usage (repo root): BIN_DIR=dir-with-lib_accord.so scripts/device/ddp_cpu_variants.sh
# Env:
#   VARIANTS  ";"-separated variants, each a space-separated list of VAR=value words, or
#             "default" (nothing set). A word "threads-spare=K" is not an environment variable:
#             it runs torch with cores/ranks - K intra-op threads per rank (cores left for the
#             communication). Default:
#             "default;ACCORD_COLL_BLOCK_SEGMENTS_MAX=16;ACCORD_CMA=1;ACCORD_WORKERS_PER_NIC=1;threads-spare=1"
#             (the default segments every all_reduce block in 128 KiB pieces; =16 caps a block at
#             16 segments, larger ones for larger blocks: the cap, off since stop 35's host run).
#   OP_SIZES  all_reduce sizes (bytes, comma list; default 16 and 64 MiB) each run also times alone
#             after its DDP steps (busbw columns: the op's own speed under the same variant).
#   ROUNDS    how many times (default 1) the variants run in turn at each rank count, round by
#             round (default, variant, default, variant, ...), so a host whose load drifts moves
#             every variant alike; the table has a row per round.
#   RANKS     rank counts (default "4 8"); ITERS / WARMUP (default 10 / 2) timed / untimed steps;
#             BENCH_ARGS more arguments for the bench and the probe (e.g. "--width 2048").
#   GLOO_EACH gloo runs again under every variant that sets something other than ACCORD_*
#             variables (default 1): those change both backends' conditions; ACCORD_* ones only
#             accord's, so gloo's default row is their baseline.
#   PROBE     1 (default): the timeline probe once per rank count (default variant);
#             PROBE_BACKENDS (default "accord"; "accord gloo" adds gloo's) which backends it runs for.
#   BIN_DIR   a prebuilt lib_accord.so (the host has no Rust); else cargo builds it.
#   BUDGET_S  the whole command's budget (default 540 s); a run that would start with under
#             30 s left is skipped and said so.
#   THREADS   1 (default): per-thread CPU use (scripts/device/thread_cpu.py) during the default
#             variant's accord run, per rank count.
# Files in $OUT: rows.jsonl (every bench row, tagged with its variant), probe_<backend>_<n>.txt,
# threads_<n>.txt, errors.txt (the stderr tail of failed runs).
set -uo pipefail
DEFAULT_BUDGET_S=540
. "$(dirname "$0")/budget.sh"

stage_package "${BIN_DIR:-}"
# At exit: the staged package, and a thread watcher still running (a run cut by the caller).
WATCHER=""
trap 'rm -rf "$STAGED_PKG"; [ -z "$WATCHER" ] || kill "$WATCHER" 2>/dev/null' EXIT
host_facts
CORES=$(nproc)
VARIANTS="${VARIANTS:-default;ACCORD_COLL_BLOCK_SEGMENTS_MAX=16;ACCORD_CMA=1;ACCORD_WORKERS_PER_NIC=1;threads-spare=1}"
ITERS="${ITERS:-10}" WARMUP="${WARMUP:-2}" OP_SIZES="${OP_SIZES:-16777216,67108864}"
ROWS="$OUT/rows.jsonl" ERRS="$OUT/errors.txt"
: > "$ROWS"; : > "$ERRS"
PORT=$((29600 + RANDOM % 300))

# bench VARIANT N BACKEND ROUND: one DDP-only run; its rows go to rows.jsonl tagged with the
# variant and the round.
bench() {
  local variant=$1 n=$2 backend=$3 round=$4 envs=() args=() word t
  [ "$variant" = default ] || for word in $variant; do
    case $word in
      threads-spare=*) args+=(--threads $(( CORES / n - ${word#threads-spare=} > 0 ? CORES / n - ${word#threads-spare=} : 1 ))) ;;
      *) envs+=("$word") ;;
    esac
  done
  t=$(capped 120) || { echo "skipped for the budget: $backend n=$n [$variant]"; return; }
  PORT=$((PORT + 1))
  local log; log=$(mktemp)
  WATCHER=""
  if [ "$variant" = default ] && [ "$backend" = accord ] && [ "$round" = 1 ] && [ "${THREADS:-1}" = 1 ]; then
    # Per-thread CPU use of the ranks (threads by name: accord-w* engine workers, python = the
    # main, torch's intra-op and the backend's worker threads), sampled every second.
    "$PY" "$HERE/thread_cpu.py" torch_backend_bench.py --interval 1 --samples 120 --top 0 --wait 30 \
      > "$OUT/threads_${n}.txt" 2>&1 &
    WATCHER=$!
  fi
  env CUDA_VISIBLE_DEVICES= ${envs[@]+"${envs[@]}"} timeout -k 10 "$t" "$PY" -m torch.distributed.run --standalone \
    --nproc_per_node "$n" --master_port "$PORT" "$HERE/torch_backend_bench.py" --backend "$backend" --device cpu \
    --skip sms,fsdp2 --ops all_reduce --sizes "$OP_SIZES" --iters "$ITERS" --warmup "$WARMUP" \
    ${args[@]+"${args[@]}"} ${BENCH_ARGS:-} > "$log" 2>&1
  local rc=$?
  [ -z "$WATCHER" ] || wait "$WATCHER"
  WATCHER=""
  grep '^{' "$log" | sed "s|^{|{\"variant\": \"$variant\", \"round\": $round, |" >> "$ROWS"
  if [ "$rc" -ne 0 ]; then
    echo "FAILED (exit $rc): $backend n=$n [$variant]"
    { echo "== $backend n=$n [$variant] exit $rc"; tail -n 20 "$log"; } >> "$ERRS"
  fi
  rm -f "$log"
}

# Whether a variant changes gloo's conditions too (anything but ACCORD_* variables).
touches_gloo() {
  local word
  for word in $1; do case $word in ACCORD_*=*) ;; *) return 0 ;; esac; done
  return 1
}

IFS=';' read -r -a VARS <<< "$VARIANTS"
for n in ${RANKS:-4 8}; do
  for round in $(seq 1 "${ROUNDS:-1}"); do
    for variant in "${VARS[@]}"; do
      variant=$(echo "$variant" | xargs)
      [ -n "$variant" ] || continue
      echo "== n=$n round $round [$variant] ($(left) s left)"
      bench "$variant" "$n" accord "$round"
      if [ "$variant" = default ] || { [ "${GLOO_EACH:-1}" = 1 ] && touches_gloo "$variant"; }; then
        bench "$variant" "$n" gloo "$round"
      fi
    done
  done
  if [ "${PROBE:-1}" = 1 ]; then
    for b in ${PROBE_BACKENDS:-accord}; do
      t=$(capped 120) || { echo "probe $b n=$n skipped for the budget"; continue; }
      PORT=$((PORT + 1))
      echo "== probe $b n=$n ($(left) s left)"
      CUDA_VISIBLE_DEVICES= timeout -k 10 "$t" "$PY" -m torch.distributed.run --standalone --nproc_per_node "$n" \
        --master_port "$PORT" "$ROOT/scripts/ddp_timeline_probe.py" --backend "$b" --iters 5 --warmup 2 \
        ${BENCH_ARGS:-} > "$OUT/probe_${b}_${n}.txt" 2>&1 || echo "probe $b n=$n FAILED (see probe_${b}_${n}.txt)"
    done
  fi
done
echo "load at the end: $(uptime)"

"$PY" - "$ROWS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def get(variant, n, backend, kind, rnd):
    return next((r for r in rows if r["variant"] == variant and r["ranks"] == n and r["backend"] == backend
                 and r["kind"] == kind and r.get("round", 1) == rnd), None)
sizes = sorted({r["bytes"] for r in rows if r["kind"] == "op"})
def busbw(variant, n, backend, rnd):
    cells = []
    for size in sizes:
        r = next((r for r in rows if r["variant"] == variant and r["ranks"] == n and r["backend"] == backend
                  and r["kind"] == "op" and r["bytes"] == size and r.get("round", 1) == rnd), None)
        cells.append(f"{r['busbw_gbps']:.2f}" if r else "-")
    return "/".join(cells) or "-"
shown = "/".join(f"{s >> 20}M" for s in sizes)
print(f"\n{'variant':<40} {'ranks':>5} {'round':>5} {'threads':>7} {'local_s':>8} {'accord_s':>9} {'gloo_s':>8} {'gloo/accord':>11}"
      f"  all_reduce busbw GB/s {shown} accord | gloo")
seen = []
for r in rows:
    key = (r["variant"], r["ranks"], r.get("round", 1))
    if key in seen:
        continue
    seen.append(key)
    v, n, rnd = key
    local, acc = get(v, n, "accord", "local", rnd), get(v, n, "accord", "ddp", rnd)
    gloo = get(v, n, "gloo", "ddp", rnd) or get("default", n, "gloo", "ddp", rnd)
    same = "" if get(v, n, "gloo", "ddp", rnd) or v == "default" else " (gloo: default)"
    f = lambda x: f"{x['step_s']:.4f}" if x else "-"
    ratio = f"{gloo['step_s'] / acc['step_s']:.2f}" if gloo and acc else "-"
    threads = (acc or local or {}).get("threads", "-")
    gloo_ops = busbw(v, n, "gloo", rnd) if get(v, n, "gloo", "ddp", rnd) else busbw("default", n, "gloo", rnd)
    print(f"{v:<40} {n:>5} {rnd:>5} {threads:>7} {f(local):>8} {f(acc):>9} {f(gloo):>8} {ratio:>11}  "
          f"{busbw(v, n, 'accord', rnd)} | {gloo_ops}{same}")
print("\nissue 20's bar: gloo/accord >= 1.5 at 4 and 8 ranks (default variant)")
PY
for f in "$OUT"/threads_*.txt; do
  [ -e "$f" ] || continue
  echo; echo "#### $(basename "$f") (the default accord run's busiest second)"; sed -n '/^busiest/,$p' "$f"
done
for f in "$OUT"/probe_*.txt; do
  [ -e "$f" ] || continue
  echo; echo "#### $(basename "$f")"; grep -v "Warning\|warn(\|^\*\*\*\|OMP_NUM_THREADS" "$f" | tail -n 40
done
echo "files: $OUT"
