#!/usr/bin/env bash
# Issue 23's KV-transfer measurement on a host with two GPUs: accord.kv moving a request's blocks
# GPU0 -> GPU1 in a Llama-3-70B-like layout (80 layers, 8 KV heads, head_dim 128, blocks of 16
# tokens, bf16; 5 MiB per block), requests of 128 and 2048 scattered blocks, as WRITE (paged
# push) and READ (pull), byte-checked, against the copy ceiling (torch copy_ of the same bytes
# GPU0 -> GPU1 as one tensor) measured in the same run (examples/kv_gpu_bench.py). Three runs:
#   inproc   both caches in one process (copy engine);
#   ipc      the prefill cache in a second process (device writes through CUDA IPC; a READ's
#            too, once the decode engine announced its cache to the prefill engine);
#   network  the same with ACCORD_DEVICE_IPC=0 ACCORD_SHM=0: staged, loopback UDP, landed.
# A READ row pulls with batched READs (DecodeCache.pull -> Engine.read_paged): one request names
# up to 409 blocks of all 160 layers' K and V, and the prefill engine writes them back as one
# paged write (through CUDA IPC on one host: one 2D copy-engine copy per block, its 160 layer K/V
# pieces as rows). The network run is
# capped at 128 blocks by default (NETWORK_BLOCKS): that route moves each 32 KiB piece through
# pinned slots. A row that would overrun its share of the budget is cut by its requests' own
# timeout (accord.kv cancels them); a request still not over --stuck-s seconds after it is
# abandoned and reported with both engines' counters. Each process prints per-phase timestamps,
# the engine's log and, while a request is outstanding, its progress (stderr, in $OUT/<run>.txt). Each run's output is kept in $OUT/<run>.txt, its rows in $OUT/kv_gpu.jsonl; the table of
# all rows is printed at the end (time per request, GB/s, ratio to the ceiling).
#
# Usage (GPU host, repo root; python3.12 + torch with CUDA + the accord wheel):
#   [WHEEL=accord-*.whl] OUT=/path/to/out scripts/device/kv_gpu.sh
# WHEEL, when set, is installed first (pip --no-deps --force-reinstall). BUDGET_S (default 280)
# caps the whole command; each run gets at most INPROC_CAP_S / IPC_CAP_S / NETWORK_CAP_S
# (default 110 / 100 / 60) and what is left; ITERS (default 3) timed requests per row after a
# warm-up; BLOCKS (default 128,2048) the request sizes, POOL (default 2560) the blocks of each
# cache (12.5 GiB); CASES (default "inproc ipc network") the runs to make; SHAPES (default: the
# engine's) the copy shapes each run goes through, STREAMS/BATCH comma-separated (kv_gpu_bench.py
# --shapes: ACCORD_DEVICE_COPY_STREAMS / ACCORD_DEVICE_COPY_BATCH_2D; 1/0 is the route before
# those knobs, the same-run baseline). Exits non-zero when a run failed or a byte was wrong.
set -uo pipefail
DEFAULT_BUDGET_S=280
. "$(dirname "$0")/budget.sh"
BENCH="$ROOT/examples/kv_gpu_bench.py"
JSON="$OUT/kv_gpu.jsonl"
: > "$JSON"

install_wheel
"$PY" -c "import accord, accord.kv, torch; print('accord', accord.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'gpus', torch.cuda.device_count())" \
  || { echo "kv_gpu: python3 cannot import accord, accord.kv and torch"; exit 1; }
host_facts

FAILED=0 BENCH_MARGIN_S=25
ITERS=${ITERS:-3} BLOCKS=${BLOCKS:-128,2048} POOL=${POOL:-2560} CASES=${CASES:-inproc ipc network}
SHAPE_ARGS=()
[ -z "${SHAPES:-}" ] || SHAPE_ARGS=(--shapes "$SHAPES")
wanted() { case " $CASES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
wanted inproc && bench_run inproc "${INPROC_CAP_S:-110}" ACCORD_DEVICE_IPC=1 -- --case inproc --blocks "$BLOCKS" \
  --pool "$POOL" --iters "$ITERS" ${SHAPE_ARGS[@]+"${SHAPE_ARGS[@]}"}
wanted ipc && bench_run ipc "${IPC_CAP_S:-100}" ACCORD_DEVICE_IPC=1 -- --case ipc --blocks "$BLOCKS" --pool "$POOL" \
  --read-blocks "${IPC_READ_BLOCKS:-$BLOCKS}" --iters "$ITERS" ${SHAPE_ARGS[@]+"${SHAPE_ARGS[@]}"}
wanted network && bench_run network "${NETWORK_CAP_S:-60}" ACCORD_DEVICE_IPC=0 ACCORD_SHM=0 -- --case network \
  --pool "$POOL" --blocks "${NETWORK_BLOCKS:-128}" --iters 2 --progress-s 2 --stuck-s 5

for name in inproc ipc network; do
  [ -f "$OUT/$name.txt" ] || continue
  echo
  echo "######## $name"
  grep -v '^{' "$OUT/$name.txt" | grep -v '^\[kv_gpu_bench' | tail -40
  # The diagnostics: every phase line, and the last progress lines and log records.
  echo "---- $name: phases and the engine's log (first 40, last 30 lines)"
  grep '^\[kv_gpu_bench' "$OUT/$name.txt" | head -40
  echo "  ..."
  grep '^\[kv_gpu_bench' "$OUT/$name.txt" | tail -30
done
echo
echo "######## all rows (ratio: GB/s over the copy ceiling of the same run)"
"$PY" "$BENCH" --table "$JSON" || FAILED=1
echo
echo "results in $OUT; $(( SECONDS - START )) s"
exit $FAILED
