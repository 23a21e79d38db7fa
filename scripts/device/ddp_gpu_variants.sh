#!/usr/bin/env bash
# Issue 20's GPU target (a 2-GPU DDP step within 1.1x NCCL's): the DDP step of
# scripts/device/torch_backend_bench.py (~50M parameters, 25 MB buckets) with "accord" on the
# GPU path (its default) under each environment variant of VARIANTS, against "nccl", round by
# round (variant 1, variant 2, ..., nccl; then again), and first, for every variant other than
# "default", the checks that it is right: DDP against Gloo and every op against Gloo
# (tests/python/torch_roles.py) and the blocking read-back probe (torch_gpu_probe.py blocking).
#
# Usage (repo root): BIN_DIR=dir-with-lib_accord.so scripts/device/ddp_gpu_variants.sh
# Env:
#   VARIANTS  ";"-separated variants, each a space-separated list of VAR=value words, or
#             "default" (nothing set); default "default;ACCORD_GPU_REDUCE_ON_CALLER=1".
#   ROUNDS    rounds (default 2); ITERS / WARMUP timed / untimed steps (default 30 / 2).
#   OPS       1 (default): each run also times all_reduce alone at OP_SIZES (default 1 and
#             64 MiB); 0 leaves the op rows out.
#   CHECKS    1 (default): the correctness checks above before the rounds; 0 skips them.
#   CHECKED   ";"-separated variants to check (default: every variant of VARIANTS but
#             "default"); "default" may be named here.
#   TESTS_BIN the accord-coll lib test binary (`cargo test --release -p accord-coll --lib
#             --no-run` builds it; the host has no Rust): when set, its GPU tests matching
#             TESTS (default: the caller-stream reductions' two) run first, into tests.txt.
#   BIN_DIR   a prebuilt lib_accord.so (the host has no Rust); else cargo builds it.
#   BUDGET_S  the whole command's budget (default 540 s); a run that would start with under
#             30 s left is skipped and said so.
# Prints one table (variant, round, DDP step ms, all_reduce µs at each size, step / NCCL's
# step of the same round), then each variant's median step / NCCL's over the rounds; files in
# $OUT: rows.jsonl (every bench row, tagged), checks.txt, tests.txt (with TESTS_BIN),
# errors.txt (the stderr tail of failed runs).
set -uo pipefail
DEFAULT_BUDGET_S=540
. "$(dirname "$0")/budget.sh"

stage_package "${BIN_DIR:-}"
host_facts
VARIANTS="${VARIANTS:-default;ACCORD_GPU_REDUCE_ON_CALLER=1}"
ROUNDS="${ROUNDS:-2}" ITERS="${ITERS:-30}" WARMUP="${WARMUP:-2}" OP_SIZES="${OP_SIZES:-1048576,67108864}"
ROWS="$OUT/rows.jsonl" ERRS="$OUT/errors.txt" CHECKS_OUT="$OUT/checks.txt"
: > "$ROWS"; : > "$ERRS"; : > "$CHECKS_OUT"
PORT=$((29600 + RANDOM % 300))
# The GPU path is accord.torch's default (ACCORD_TORCH_GPU=auto); a variant may set it.

# words VARIANT: the variant's VAR=value words ("default": none).
words() { [ "$1" = default ] || echo "$1"; }

# check VARIANT: the three correctness checks under the variant, their verdicts in checks.txt.
check() {
  local variant=$1 t
  local envs; read -r -a envs <<< "$(words "$variant")"
  t=$(capped 100) || { echo "checks skipped for the budget: [$variant]" | tee -a "$CHECKS_OUT"; return; }
  echo "== checks [$variant]" >> "$CHECKS_OUT"
  env ${envs[@]+"${envs[@]}"} PYTHONPATH="$ROOT/tests/python:$PYTHONPATH" timeout -k 5 "$t" "$PY" -c \
    "import accord, torch_roles; print('ddp_cuda_matches_gloo', accord.run(torch_roles.ddp_cuda_matches_gloo, 2, timeout=90))" \
    >> "$CHECKS_OUT" 2>&1 || echo "ddp_cuda_matches_gloo FAILED (exit $?)" >> "$CHECKS_OUT"
  t=$(capped 120) || return
  env ${envs[@]+"${envs[@]}"} PYTHONPATH="$ROOT/tests/python:$PYTHONPATH" timeout -k 5 "$t" "$PY" -c \
    "import accord, torch_roles; r = accord.run(torch_roles.every_op_cuda, 2, timeout=110); print('every_op_cuda', [(x['path'], x['count'], x.get('native')) for x in r])" \
    >> "$CHECKS_OUT" 2>&1 || echo "every_op_cuda FAILED (exit $?)" >> "$CHECKS_OUT"
  t=$(capped 80) || return
  env ${envs[@]+"${envs[@]}"} N=20 ACCORD_GPU_OP_TIMEOUT_MS=5000 timeout -k 5 "$t" "$PY" "$HERE/torch_gpu_probe.py" blocking \
    2>/dev/null | tail -1 | sed 's/^/blocking /' >> "$CHECKS_OUT" || echo "blocking FAILED" >> "$CHECKS_OUT"
}

# bench VARIANT BACKEND ROUND: one run; its JSON rows go to rows.jsonl tagged.
bench() {
  local variant=$1 backend=$2 round=$3 t skip=fsdp2,sms
  local envs; read -r -a envs <<< "$(words "$variant")"
  [ "${OPS:-1}" = 1 ] || skip=$skip,ops
  t=$(capped 90) || { echo "skipped for the budget: $backend round $round [$variant]"; return; }
  PORT=$((PORT + 1))
  local log; log=$(mktemp)
  env ${envs[@]+"${envs[@]}"} timeout -k 10 "$t" "$PY" -m torch.distributed.run --standalone --nproc_per_node 2 \
    --master_port "$PORT" "$HERE/torch_backend_bench.py" --backend "$backend" --device cuda --skip "$skip" \
    --ops all_reduce --sizes "$OP_SIZES" --iters "$ITERS" --warmup "$WARMUP" > "$log" 2>&1
  local rc=$?
  grep '^{' "$log" | "$PY" -c '
import json, sys
variant, round_ = sys.argv[1], int(sys.argv[2])
for line in sys.stdin:
    row = json.loads(line)
    row.update(variant=variant, round=round_)
    print(json.dumps(row))' "$variant" "$round" >> "$ROWS"
  if [ "$rc" -ne 0 ]; then
    { echo "== $backend round $round [$variant]: exit $rc"; tail -20 "$log"; } >> "$ERRS"
  fi
  rm -f "$log"
}

if [ -n "${TESTS_BIN:-}" ]; then
  if t=$(capped 200); then
    # shellcheck disable=SC2086 # TESTS is a list of filters
    timeout -k 10 "$t" "$TESTS_BIN" ${TESTS:-gpu::gpu_tests::reductions_on_the_callers_stream gpu::gpu_tests::a_peer_gone_lets} \
      --test-threads=1 --nocapture > "$OUT/tests.txt" 2>&1
    echo "== GPU tests: exit $?"
    grep -E "^test |test result|panicked|skipped" "$OUT/tests.txt" | head -20
  else
    echo "GPU tests skipped for the budget"
  fi
fi
if [ "${CHECKS:-1}" = 1 ]; then
  if [ -n "${CHECKED:-}" ]; then
    IFS=';' read -r -a LIST <<< "$CHECKED"
    for v in "${LIST[@]}"; do check "$v"; done
  else
    IFS=';' read -r -a LIST <<< "$VARIANTS"
    for v in "${LIST[@]}"; do [ "$v" = default ] || check "$v"; done
  fi
  cat "$CHECKS_OUT"
fi
IFS=';' read -r -a LIST <<< "$VARIANTS"
for round in $(seq 1 "$ROUNDS"); do
  for v in "${LIST[@]}"; do bench "$v" accord "$round"; done
  bench default nccl "$round"
done

"$PY" - "$ROWS" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
nccl = {r["round"]: r["step_s"] for r in rows if r["backend"] == "nccl" and r["kind"] == "ddp"}
sizes = sorted({r["bytes"] for r in rows if r["kind"] == "op"})
print(f"{'variant':42s} {'round':>5s} {'DDP ms':>8s} " + " ".join(f"{'AR ' + str(s >> 10) + 'K us':>12s}" for s in sizes) + "  step/NCCL")
keys = []
for r in rows:
    k = (r["backend"], r["variant"], r["round"])
    if k not in keys:
        keys.append(k)
for backend, variant, rnd in keys:
    mine = [r for r in rows if (r["backend"], r["variant"], r["round"]) == (backend, variant, rnd)]
    ddp = next((r["step_s"] for r in mine if r["kind"] == "ddp"), None)
    ops = {r["bytes"]: r["time_us"] for r in mine if r["kind"] == "op"}
    name = "nccl" if backend == "nccl" else f"accord [{variant}]"
    ratio = f"{ddp / nccl[rnd]:.2f}" if ddp and rnd in nccl and backend != "nccl" else ""
    step = f"{ddp * 1e3:8.3f}" if ddp else f"{'-':>8s}"
    print(f"{name:42s} {rnd:5d} {step} " + " ".join(f"{ops.get(s, float('nan')):12.1f}" for s in sizes) + f"  {ratio}")
# The DDP step's spread between rounds on this host is as large as the differences sought
# (docs/results/2026-11-27-direct-gpu-calls.md): per variant, the median and range of its
# step / NCCL's over the rounds.
ratios = {}
for r in rows:
    if r["backend"] == "accord" and r["kind"] == "ddp" and r["round"] in nccl:
        ratios.setdefault(r["variant"], []).append(r["step_s"] / nccl[r["round"]])
for variant, rs in ratios.items():
    rs.sort()
    mid = len(rs) // 2
    median = rs[mid] if len(rs) % 2 else (rs[mid - 1] + rs[mid]) / 2
    print(f"step/NCCL over {len(rs)} rounds [{variant}]: median {median:.2f}, {rs[0]:.2f}-{rs[-1]:.2f}")
EOF
[ -s "$ERRS" ] && { echo "failed runs (tails in $ERRS):"; grep '^== ' "$ERRS"; }
exit 0
