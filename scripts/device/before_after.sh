#!/usr/bin/env bash
# Speed before and after a structural change, in one call: the same benches with two sets of
# binaries, alternated (base, new, base, new) so the difference can be read against the
# run-to-run spread of each. Issue 17 (the route layer) uses it.
#
#   scripts/device/before_after.sh BASE_DIR NEW_DIR OUT_DIR
#
# Each DIR holds `accord`, `accord-engine-gpu-bench` and `accord-gpu-bench` (built with
# `cargo build --release --workspace --bins`; the benches are bins of accord-bench; before
# it existed, `accord-engine-gpu-bench` was a bin of accord-engine and `accord-gpu-bench` one
# of accord-coll).
# Benches: the engine's GPU0 -> GPU1 write through CUDA IPC (`--ipc`, one write at a time and
# with a window, against the copy ceiling measured in the same run); the GPU collectives
# (`accord-gpu-bench` under torchrun, 1-256 MiB, NCCL measured once in the same call as the
# anchor); `accord bench p2p` between two host processes. Prints one table at the end
# (before_after_join.py) and leaves every raw line in OUT_DIR.
# Env: ROUNDS (default 2), P2P (default 1: run the host p2p bench).
set -u
BASE="$1"; NEW="$2"; OUT="$3"
HERE="$(cd "$(dirname "$0")" && pwd)"
ROUNDS="${ROUNDS:-2}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT"
RAW="$OUT/raw.jsonl"; : >"$RAW"
tag() { python3 -c 'import json,sys
v,r,b=sys.argv[1],sys.argv[2],sys.argv[3]
for line in sys.stdin:
    line=line.strip()
    if not line.startswith("{"): continue
    try: d=json.loads(line)
    except ValueError: continue
    d.update(variant=v, round=int(r), source=b); print(json.dumps(d))' "$@" >>"$RAW"; }
for round in $(seq 1 "$ROUNDS"); do
  for variant in base new; do
    DIR="$BASE"; [ "$variant" = new ] && DIR="$NEW"
    echo "== round $round, $variant ($DIR)"
    timeout 180 "$DIR/accord-engine-gpu-bench" --ipc --sizes-mib 1,64,256 --iters 20 2>>"$OUT/stderr.txt" \
      | tee -a "$OUT/engine.txt" | tag "$variant" "$round" engine
    timeout 240 torchrun --standalone --nproc_per_node 2 --no-python "$HERE/accord_under_torchrun.sh" \
      "$DIR/accord-gpu-bench" --min-bytes 1048576 --max-bytes 268435456 --order hostfn 2>>"$OUT/stderr.txt" \
      | tag "$variant" "$round" coll
    if [ "${P2P:-1}" = 1 ]; then
      timeout 180 "$DIR/accord" bench p2p --json 2>>"$OUT/stderr.txt" | tag "$variant" "$round" p2p
    fi
  done
done
echo "== NCCL (anchor, once)"
timeout 240 torchrun --standalone --nproc_per_node 2 "$HERE/gpu_vs_nccl.py" 2>>"$OUT/stderr.txt" \
  | tag nccl 1 nccl
python3 "$HERE/before_after_join.py" "$RAW" | tee "$OUT/table.txt"
