# Sourced by the device scripts (algo_sweep.sh, ddp_cpu_variants.sh, ddp_gpu_variants.sh, device_api.sh, ep.sh, kv_gpu.sh,
# torch_backend_bench.sh, weights_gpu.sh): the
# environment every run on the GPU host needs, the paths, and the time budget, in one place.
# The caller sets DEFAULT_BUDGET_S first; BUDGET_S overrides it. Defines START, BUDGET, HERE
# (scripts/device), ROOT (the repository), OUT (made), PY, and:
#   left        seconds left of the budget;
#   capped      a run's time limit within what is left;
#   host_facts  the load and the GPUs, printed at a run's start;
#   install_wheel  installs $WHEEL first, when it is set;
#   stage_package  the accord package of this tree with a prebuilt extension, on PYTHONPATH;
#   stage_into  the same into a folder of the caller's;
#   stage_builds  several builds staged side by side, once each (the before/after scripts);
#   run_args    a run's name, capped time, environment and arguments (kv_gpu.sh, weights_gpu.sh, ep.sh);
#   bench_run   one run of the Python bench $BENCH under `timeout` (kv_gpu.sh, weights_gpu.sh).
START=$SECONDS BUDGET=${BUDGET_S:-${DEFAULT_BUDGET_S:-480}}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"

left() { echo $((BUDGET - (SECONDS - START))); }

# capped CAP [FLOOR]: CAP seconds, or what is left of the budget if less; fails (prints nothing)
# when under FLOOR (default 30) seconds are left, too little to start a run, and for a CAP of 0,
# which skips the run (`timeout 0` would run it with no limit at all).
capped() {
  local t; t=$(left)
  [ "${1:-0}" -gt 0 ] || return 1
  [ "$t" -ge "${2:-30}" ] || return 1
  if [ "$t" -lt "$1" ]; then echo "$t"; else echo "$1"; fi
}

host_facts() {
  echo "load at the start: $(uptime)"
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not available"
}

# install_wheel: installs $WHEEL (pip --no-deps --force-reinstall) when it is set; exits the
# script when that fails, so no run measures a stale install.
install_wheel() {
  [ -n "${WHEEL:-}" ] || return 0
  "$PY" -m pip install --quiet --no-deps --force-reinstall "$WHEEL" || { echo "cannot install $WHEEL"; exit 1; }
}

# stage_into BIN_DIR DEST: copies python/accord (or BIN_DIR/python/accord where BIN_DIR holds
# one: an earlier build's Python sources beside its extension, for a before/after run in one
# call) and BIN_DIR/lib_accord.so into DEST/accord, checks that accord and torch import from
# DEST, and builds accord.torch's compiled backend once there (about 30 s the first time) rather
# than inside a timed run's init_process_group; where it does not build, runs use the Python
# backend. Fails (returns 1, saying why) where the package cannot be staged or imported.
stage_into() {
  local bin_dir=$1 dest=$2
  local sources="$ROOT/python/accord"
  [ -d "$bin_dir/python/accord" ] && sources="$bin_dir/python/accord"
  echo "staging the accord package from $sources with $bin_dir/lib_accord.so"
  mkdir -p "$dest" && cp -r "$sources" "$dest/" && cp "$bin_dir/lib_accord.so" "$dest/accord/_accord.abi3.so" \
    || { echo "cannot stage the accord package from $bin_dir"; return 1; }
  PYTHONPATH="$dest${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c \
    "import accord, torch; print('accord', accord.VERSION, 'torch', torch.__version__)" || return 1
  [ "${ACCORD_TORCH_NATIVE:-auto}" = 0 ] || PYTHONPATH="$dest${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m accord._torch_native \
    || echo "accord.torch compiled backend NOT built: the runs use the Python backend"
}

# stage_builds BIN_DIR...: stages each build once (stage_into) into $STAGES/<its folder's name>
# (STAGES: a folder made here, removed at exit), its log in $OUT/<name>.stage; a run then puts
# "$STAGES/<name>" first on PYTHONPATH. Exits the script where one cannot be staged.
stage_builds() {
  local b name
  STAGES=$(mktemp -d)
  trap 'rm -rf "$STAGES"' EXIT
  for b in "$@"; do
    name=$(basename "$b")
    stage_into "$b" "$STAGES/$name" > "$OUT/$name.stage" 2>&1 \
      || { echo "cannot stage $b:"; tail -n 5 "$OUT/$name.stage"; exit 1; }
  done
}

# stage_package BIN_DIR: stages the package (stage_into; BIN_DIR/lib_accord.so built with cargo
# when BIN_DIR is empty: the GPU host has no Rust; STAGED_BIN_DIR says which folder was used)
# into a folder outside $OUT (whose files come back from the device), removed at exit
# (STAGED_PKG; a caller's own EXIT trap must remove it too), and puts it first on PYTHONPATH;
# exits the script where it cannot be staged.
stage_package() {
  local bin_dir=$1
  if [ -z "$bin_dir" ]; then
    (cd "$ROOT" && cargo build --release -q -p accord-py -p accord-cli) || { echo "cargo build failed"; exit 1; }
    bin_dir="$ROOT/target/release"
  fi
  STAGED_BIN_DIR=$bin_dir STAGED_PKG=$(mktemp -d)
  trap 'rm -rf "$STAGED_PKG"' EXIT
  stage_into "$bin_dir" "$STAGED_PKG" || exit 1
  export PYTHONPATH="$STAGED_PKG${PYTHONPATH:+:$PYTHONPATH}"
}

# run_args NAME CAP ENV... -- ARGS...: the parts of a run (kv_gpu.sh, weights_gpu.sh, ep.sh) into
# RUN_NAME, RUN_CAP (CAP capped by what is left), RUN_ENVS and RUN_ARGS; a CAP of 0 skips the run
# as asked (returns 1), and when too little is left it says the run is skipped for the budget,
# sets FAILED=1 and returns 1.
run_args() {
  RUN_NAME=$1 RUN_CAP=$2; shift 2
  RUN_ENVS=()
  while [ "$1" != "--" ]; do RUN_ENVS+=("$1"); shift; done
  shift
  RUN_ARGS=("$@")
  [ "$RUN_CAP" -gt 0 ] || { echo "== $RUN_NAME: skipped (cap 0)"; return 1; }
  RUN_CAP=$(capped "$RUN_CAP") || { echo "== $RUN_NAME: skipped, $(left) s left of the budget"; FAILED=1; return 1; }
}

# bench_run NAME CAP ENV... -- ARGS...: one run of `$PY $BENCH --json $JSON ARGS` with ENV under
# `timeout`, capped by what is left, its output in $OUT/NAME.txt; a skipped or failed run sets
# FAILED=1. With BENCH_MARGIN_S set, the bench is also given `--budget-s` (the cap less that
# margin) so it stops itself before the timeout cuts it.
bench_run() {
  run_args "$@" || return
  echo "== $RUN_NAME (at most $RUN_CAP s): ${RUN_ENVS[*]} $BENCH ${RUN_ARGS[*]}"
  local budget=()
  [ -z "${BENCH_MARGIN_S:-}" ] || budget=(--budget-s $((RUN_CAP - BENCH_MARGIN_S)))
  env "${RUN_ENVS[@]}" timeout -k 10 "$RUN_CAP" "$PY" "$BENCH" ${budget[@]+"${budget[@]}"} --json "$JSON" \
    ${RUN_ARGS[@]+"${RUN_ARGS[@]}"} > "$OUT/$RUN_NAME.txt" 2>&1
  local rc=$?
  echo "   exit $rc"
  [ "$rc" -eq 0 ] || FAILED=1
}
