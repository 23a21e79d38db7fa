#!/usr/bin/env bash
# The torch layer's share of each CPU op, for two or more builds alternated in one call (issue
# 20's "under 10% at 1 MiB and above"): every round runs, per rank count and build, the op rows
# of torch_backend_bench.py (torch.distributed "accord" against the group's own Communicator
# called directly on the same tensors, torch and direct alternating which goes first), and the
# table gives direct / torch (py/dir: 1.0 is no overhead) per build and round.
# Usage (GPU host or any Linux host with torch, repo root):
#   BUILDS=".carry/before .carry/after" scripts/device/torch_ops_before_after.sh
# Each build is a BIN_DIR (lib_accord.so; an earlier build's Python sources in BIN_DIR/python/
# accord), staged once (budget.sh's stage_builds). RANKS (default "4 8"), ROUNDS (default 2),
# SIZES (default 1, 4 and 16 MiB), OP_ITERS (default 20), OUT (JSON lines kept there), BUDGET_S
# (default 400 s for the whole command).
set -uo pipefail
DEFAULT_BUDGET_S=400
. "$(dirname "$0")/budget.sh"
[ -n "${BUILDS:-}" ] || { echo "set BUILDS to two or more BIN_DIRs"; exit 2; }
stage_builds $BUILDS
for round in $(seq 1 "${ROUNDS:-2}"); do
  for n in ${RANKS:-4 8}; do
    for b in $BUILDS; do
      name="$(basename "$b")_n${n}_r${round}"
      t=$(capped 150 15) || { echo "skipped for the time budget: $name"; continue; }
      PYTHONPATH="$STAGES/$(basename "$b")${PYTHONPATH:+:$PYTHONPATH}" CUDA_VISIBLE_DEVICES= \
        timeout -k 5 "$t" "$PY" -m torch.distributed.run --standalone --nproc_per_node "$n" \
        "$HERE/torch_backend_bench.py" --backend accord --device cpu --skip local,ddp,fsdp2,sms \
        --op-warmup 5 --op-iters "${OP_ITERS:-20}" --op-rounds 2 --sizes "${SIZES:-1048576,4194304,16777216}" \
        > "$OUT/$name.jsonl" 2> "$OUT/$name.err" || { echo "$name FAILED"; tail -n 5 "$OUT/$name.err"; }
    done
  done
done
"$PY" - "$OUT" $BUILDS <<'PY'
import json, pathlib, sys, collections
out, builds = pathlib.Path(sys.argv[1]), [pathlib.Path(b).name for b in sys.argv[2:]]
ratios = collections.defaultdict(list)  # (n, op, bytes, build) -> [direct / torch per round]
for f in sorted(out.glob("*.jsonl")):
    build = f.name.rsplit("_n", 1)[0]  # <build>_n<ranks>_r<round>.jsonl
    for line in f.read_text().splitlines():
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if row.get("kind") == "op" and row.get("direct_us"):
            ratios[(row["ranks"], row["op"], row["bytes"], build)].append(row["direct_us"] / row["time_us"])
print("py/dir (direct / torch.distributed time; 1.0 is no overhead), one figure per round")
print(f"{'ranks':>5} {'op':>15} {'MiB':>5} " + " ".join(f"{b:>24}" for b in builds))
for n, op, nbytes in sorted({k[:3] for k in ratios}):
    cells = [",".join(f"{r:.2f}" for r in ratios.get((n, op, nbytes, b), [])) or "-" for b in builds]
    print(f"{n:>5} {op:>15} {nbytes / 2**20:>5.0f} " + " ".join(f"{c:>24}" for c in cells))
PY
