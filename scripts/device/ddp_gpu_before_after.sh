#!/usr/bin/env bash
# Issue 20's DDP step (~50M parameters, 25 MB buckets; torch_backend_bench.py's model) for two or
# more builds and the baseline backend, alternated round by round in one call: build 1,
# build 2, ..., baseline, then again. Prints each run's mean step and step / the baseline's step
# of the same round. By default the 2-GPU step against NCCL; DEVICE=cpu times the CPU step at
# NPROC ranks against Gloo (issue 20's CPU target).
# Usage (GPU host with 2+ GPUs, repo root):
#   BUILDS=".carry/before .carry/after" scripts/device/ddp_gpu_before_after.sh
#   DEVICE=cpu NPROC=8 BUILDS="..." scripts/device/ddp_gpu_before_after.sh
# Each build is a BIN_DIR (lib_accord.so; an earlier build's Python sources in BIN_DIR/python/
# accord), staged once (budget.sh's stage_builds); the baseline's runs use the last build's
# package. ROUNDS (default 3), ITERS / WARMUP steps (default 50 / 5), NPROC (default 2), OUT
# (JSON lines kept there), BUDGET_S (default 400 s for the whole command), RUN_CAP_S (one run's
# cap, default 90 s).
set -uo pipefail
DEFAULT_BUDGET_S=400
. "$(dirname "$0")/budget.sh"
[ -n "${BUILDS:-}" ] || { echo "set BUILDS to one or more BIN_DIRs"; exit 2; }
stage_builds $BUILDS
DEVICE=${DEVICE:-cuda}
BASELINE=nccl
[ "$DEVICE" = cpu ] && BASELINE=gloo
last=""
for round in $(seq 1 "${ROUNDS:-3}"); do
  for b in $BUILDS $BASELINE; do
    backend=accord build=$b
    if [ "$b" = "$BASELINE" ]; then backend=$BASELINE build=$last; fi
    last=$build
    name="$(basename "$b")_r${round}"
    t=$(capped "${RUN_CAP_S:-90}" 20) || { echo "skipped for the time budget: $name"; continue; }
    PYTHONPATH="$STAGES/$(basename "$build")${PYTHONPATH:+:$PYTHONPATH}" \
      timeout -k 5 "$t" "$PY" -m torch.distributed.run --standalone --nproc_per_node "${NPROC:-2}" \
      "$HERE/torch_backend_bench.py" --backend "$backend" --device "$DEVICE" --skip local,fsdp2,ops,sms \
      --warmup "${WARMUP:-5}" --iters "${ITERS:-50}" \
      > "$OUT/$name.jsonl" 2> "$OUT/$name.err" || { echo "$name FAILED"; tail -n 5 "$OUT/$name.err"; }
  done
done
"$PY" - "$OUT" "${ROUNDS:-3}" $BUILDS $BASELINE <<'PY'
import json, pathlib, sys
out, rounds, names = pathlib.Path(sys.argv[1]), int(sys.argv[2]), [pathlib.Path(b).name for b in sys.argv[3:]]
def step(name, r):
    f = out / f"{name}_r{r}.jsonl"
    rows = [json.loads(l) for l in f.read_text().splitlines() if l.startswith("{")] if f.exists() else []
    ddp = [x for x in rows if x.get("kind") == "ddp"]
    return ddp[0]["step_s"] * 1e3 if ddp else None
baseline = names[-1]
print(f"DDP step, ms (step / {baseline}'s of the same round)")
print(f"{'round':>5} " + " ".join(f"{n:>18}" for n in names))
for r in range(1, rounds + 1):
    base = step(baseline, r)
    cells = []
    for n in names:
        s = step(n, r)
        cells.append("-" if s is None else f"{s:.3f}" + ("" if n == baseline or not base else f" ({s / base:.2f})"))
    print(f"{r:>5} " + " ".join(f"{c:>18}" for c in cells))
PY
