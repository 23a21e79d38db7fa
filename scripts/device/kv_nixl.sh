#!/usr/bin/env bash
# Issue 23's anchor: the KV transfer of kv_gpu.sh (GPU0 -> GPU1, Llama-3-70B-like layout, 128 and
# 2048 scattered blocks, WRITE and READ, bytes checked) through NIXL's UCX backend
# (examples/kv_nixl_bench.py: two processes, two agents, descriptor lists prepared once), its
# rows in $OUT/kv_gpu.jsonl beside accord's (kv_gpu_bench.py --table prints both).
#
# NIXL comes from a carried wheel: NIXL_WHEEL (a .whl, installed with pip --target) or
# NIXL_TREE (a .tar.xz of the wheel's unpacked files, for a carry limit the whole wheel does not
# fit: nixl-cu13 1.5.1's cp312 wheel is 59 MB; without its nixl_ep_cu13 package and UCX's perftest
# it packs to 18 MB) into NIXL_SITE (default $TMPDIR/accord-nixl-site, outside $OUT), put on PYTHONPATH.
# Its Python dependencies (numpy; torch for the GPU caches) must be installed already.
#
# Usage (GPU host, repo root):
#   NIXL_WHEEL=nixl_cu13-*.whl | NIXL_TREE=nixl-*.tar.xz  OUT=/path/to/out scripts/device/kv_nixl.sh
# BUDGET_S (default 120) caps the run; BLOCKS (default 128,2048), POOL (2560), ITERS (3) as kv_gpu.sh.
# UCX says which transports it chose: UCX_PROTO_INFO=y (default here) prints its protocol
# selection tables, UCX_LOG_LEVEL=info (default here) its transport set-up; the run's summary
# counts the lines naming each transport (cuda_ipc, cuda_copy, tcp, ...). The 2026-11-26 run had
# neither, so its log could not tell whether cuda_ipc moved the bytes. Set UCX_TLS (e.g.
# cuda_ipc,cuda_copy,tcp) to pin the transports; it is printed with the rest.
set -uo pipefail
DEFAULT_BUDGET_S=120
. "$(dirname "$0")/budget.sh"
BENCH="$ROOT/examples/kv_nixl_bench.py"
JSON="$OUT/kv_gpu.jsonl"
SITE="${NIXL_SITE:-${TMPDIR:-/tmp}/accord-nixl-site}"
mkdir -p "$SITE"
if [ -n "${NIXL_WHEEL:-}" ]; then
  "$PY" -m pip install --quiet --no-deps --target "$SITE" "$NIXL_WHEEL" || { echo "kv_nixl: cannot install $NIXL_WHEEL"; exit 1; }
elif [ -n "${NIXL_TREE:-}" ]; then
  tar -xJf "$NIXL_TREE" -C "$SITE" || { echo "kv_nixl: cannot unpack $NIXL_TREE"; exit 1; }
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export UCX_PROTO_INFO="${UCX_PROTO_INFO:-y}" UCX_LOG_LEVEL="${UCX_LOG_LEVEL:-info}"
echo "UCX settings: $(env | grep '^UCX_' | sort | tr '\n' ' ')"
"$PY" -c "import nixl_cu13, torch; print('nixl_cu13 from', nixl_cu13.__file__, 'torch', torch.__version__)" \
  || { echo "kv_nixl: python3 cannot import nixl_cu13 and torch"; exit 2; }
host_facts
CAP=$(capped "$BUDGET" 20) || { echo "kv_nixl: no time left"; exit 1; }
echo "== nixl (at most $CAP s): $BENCH --blocks ${BLOCKS:-128,2048} --pool ${POOL:-2560} --iters ${ITERS:-3}"
timeout -k 10 "$CAP" "$PY" "$BENCH" --blocks "${BLOCKS:-128,2048}" --pool "${POOL:-2560}" --iters "${ITERS:-3}" \
  --json "$JSON" > "$OUT/nixl.txt" 2>&1
rc=$?
echo "   exit $rc"
echo "-- UCX's transports: lines of its log naming each (UCX_PROTO_INFO / UCX_LOG_LEVEL)"
for tl in cuda_ipc cuda_copy gdr_copy tcp posix sysv cma rc_mlx5 dc_mlx5 ud_mlx5; do
  n=$(grep -v '^{' "$OUT/nixl.txt" | grep -c -w "$tl")
  [ "$n" -eq 0 ] || echo "   $tl: $n lines"
done
grep -i -E "cuda_ipc|proto.*(put|get)|rma" "$OUT/nixl.txt" | grep -v '^{' | head -12
grep -v -E "NIXL INFO|^\[[0-9.]+\] *\[|UCX  INFO|^ *[|+]" "$OUT/nixl.txt" | tail -25
echo "results in $OUT; $(( SECONDS - START )) s"
exit $rc
