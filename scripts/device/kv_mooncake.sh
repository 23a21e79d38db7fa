#!/usr/bin/env bash
# Issue 23's second anchor: the KV transfer of kv_gpu.sh and kv_nixl.sh (GPU0 -> GPU1,
# Llama-3-70B-like layout, 128 and 2048 scattered blocks, WRITE and READ, bytes checked) through
# Mooncake's transfer engine (examples/kv_mooncake_bench.py: two processes, P2PHANDSHAKE, its
# intra-node NVLink transport), its rows in $OUT/kv_gpu.jsonl beside accord's and NIXL's
# (kv_gpu_bench.py --table prints them all).
#
# Mooncake comes from a carried wheel: MOONCAKE_WHEEL (a .whl, pip --target) or MOONCAKE_TREE (a
# .tar.xz of the files `mooncake.engine` loads, which scripts/device/issue23_pack.sh makes: the
# cp312 wheel is 50 MB, the tree 6.5 MB) into MOONCAKE_SITE (default
# $TMPDIR/accord-mooncake-site), put on PYTHONPATH. The engine links against libcudart.so.13
# (torch's, loaded first), and libibverbs, libmlx5, libnuma and libcurl from the system; where
# the system lacks one, the copies of an unpacked NIXL wheel (NIXL_TREE, or NIXL_SITE as
# kv_nixl.sh left it) are linked under their sonames in MOONCAKE_SITE/syslibs and put on
# LD_LIBRARY_PATH, and the log says so.
#
# Usage (GPU host, repo root):
#   MOONCAKE_WHEEL=mooncake_*.whl | MOONCAKE_TREE=mooncake-*.tar.xz  [NIXL_TREE=...] OUT=/path/to/out \
#     scripts/device/kv_mooncake.sh
# BUDGET_S (default 120) caps the run; BLOCKS (default 128,2048), POOL (2560), ITERS (3) as
# kv_gpu.sh; PROTOCOLS (default: the bench's, nvlink_intra) the transports tried in order.
set -uo pipefail
DEFAULT_BUDGET_S=120
. "$(dirname "$0")/budget.sh"
BENCH="$ROOT/examples/kv_mooncake_bench.py"
JSON="$OUT/kv_gpu.jsonl"
SITE="${MOONCAKE_SITE:-${TMPDIR:-/tmp}/accord-mooncake-site}"
NIXL_SITE="${NIXL_SITE:-${TMPDIR:-/tmp}/accord-nixl-site}"
mkdir -p "$SITE"
if [ -n "${MOONCAKE_WHEEL:-}" ]; then
  "$PY" -m pip install --quiet --no-deps --target "$SITE" "$MOONCAKE_WHEEL" \
    || { echo "kv_mooncake: cannot install $MOONCAKE_WHEEL"; exit 1; }
elif [ -n "${MOONCAKE_TREE:-}" ]; then
  tar -xJf "$MOONCAKE_TREE" -C "$SITE" || { echo "kv_mooncake: cannot unpack $MOONCAKE_TREE"; exit 1; }
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
probe() { "$PY" -c "import torch, mooncake.engine; print('mooncake from', mooncake.engine.__file__, 'torch', torch.__version__)" 2>&1; }

# syslibs: the system libraries the engine needs, from an unpacked NIXL wheel, under their sonames.
syslibs() {
  local libs="$NIXL_SITE/nixl_cu13.libs" dir="$SITE/syslibs" f
  if [ ! -d "$libs" ] && [ -n "${NIXL_TREE:-}" ]; then
    mkdir -p "$NIXL_SITE" && tar -xJf "$NIXL_TREE" -C "$NIXL_SITE"
  fi
  [ -d "$libs" ] || { echo "kv_mooncake: no NIXL libraries at $libs to borrow"; return 1; }
  mkdir -p "$dir"
  for f in "$libs"/libibverbs-* "$libs"/libmlx5-* "$libs"/libnl-* "$libs"/libnuma-* "$libs"/libcurl-* "$libs"/libzstd-*; do
    [ -e "$f" ] || continue
    ln -sf "$f" "$dir/$(basename "$f")"
    case "$(basename "$f")" in
      libibverbs-*) ln -sf "$f" "$dir/libibverbs.so.1" ;;
      libmlx5-*) ln -sf "$f" "$dir/libmlx5.so.1" ;;
      libnuma-*) ln -sf "$f" "$dir/libnuma.so.1" ;;
      libcurl-*) ln -sf "$f" "$dir/libcurl.so.4" ;;
    esac
  done
  # Only what the system lacks: a system library found by the loader stays the one used.
  for so in libibverbs.so.1 libmlx5.so.1 libnuma.so.1 libcurl.so.4; do
    if ldconfig -p 2>/dev/null | grep -q -E "^[[:space:]]*$so "; then rm -f "$dir/$so"; else echo "kv_mooncake: $so from NIXL's wheel"; fi
  done
  export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

if ! out=$(probe); then
  echo "kv_mooncake: first import: $(echo "$out" | tail -1)"
  syslibs && out=$(probe) || { echo "kv_mooncake: python3 cannot import mooncake.engine and torch: $(echo "$out" | tail -1)"; exit 2; }
fi
echo "$out"
host_facts
CAP=$(capped "$BUDGET" 20) || { echo "kv_mooncake: no time left"; exit 1; }
protocols=()
[ -z "${PROTOCOLS:-}" ] || protocols=(--protocols "$PROTOCOLS")
echo "== mooncake (at most $CAP s): $BENCH --blocks ${BLOCKS:-128,2048} --pool ${POOL:-2560} --iters ${ITERS:-3} ${protocols[*]+${protocols[*]}}"
# The bench stops starting rows 15 s before the cap, and writes each row as it is done.
GLOG_logtostderr=1 timeout -k 10 "$CAP" "$PY" "$BENCH" --blocks "${BLOCKS:-128,2048}" --pool "${POOL:-2560}" \
  --iters "${ITERS:-3}" --budget-s $(( CAP - 15 )) ${protocols[@]+"${protocols[@]}"} --json "$JSON" \
  > "$OUT/mooncake.txt" 2>&1
rc=$?
echo "   exit $rc"
echo "-- the engines' transport lines:"
grep -i -E "using .* transport|nvlink|cuda_?ipc|install" "$OUT/mooncake.txt" | grep -v '^{' | sort | uniq -c | sort -rn | head -20
echo "-- the bench:"
grep -v -E '^[IWEF][0-9]{4} ' "$OUT/mooncake.txt" | tail -25
echo "results in $OUT; $(( SECONDS - START )) s"
exit $rc
