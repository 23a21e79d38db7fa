#!/usr/bin/env bash
# Issue 24's expert-parallel measurement on a host with two GPUs: accord.ep's dispatch and
# combine against the naive dispatcher (permute + NCCL all_to_all_single) and DeepEP, checked
# against the naive reference first (examples/ep_bench.py). Runs, each a torchrun of 2 ranks:
#   normal    DeepSeek-V3 shape, 4096 tokens a rank (hidden 7168, top-8 of 256, bf16);
#   lowlat    128 tokens a rank, plus dispatch+combine captured in a CUDA graph and replayed
#             with new routing (num_worst_tokens: no host synchronisation at all), and the
#             low-latency mode (per-expert buffers, per-token direct stores), checked, timed and
#             graph-replayed the same way;
#   network   the normal shape with ACCORD_DEVICE_IPC=0 ACCORD_SHM=0: the proxies move the
#             segments over the engine's UDP route (loopback), accord.ep only (NETWORK_TOKENS,
#             default 1024, tokens a rank).
# DeepEP is built first from its public source (DEEPEP_SRC: a tarball of tag v1.2.1, carried in):
# intranode only, NVSHMEM disabled and -rdc=true dropped in its setup.py (there is no NVSHMEM it
# accepts here, and without a device-link step -rdc leaves an undefined symbol). Its build log
# is $OUT/deepep_build.txt; if it fails, the runs go on without it.
#
# Usage (GPU host, repo root; python3.12 + torch with CUDA + the accord wheel):
#   [WHEEL=accord-*.whl] [DEEPEP_SRC=/abs/deepep.tar.gz] OUT=/path/to/out scripts/device/ep.sh
# BUDGET_S (default 420) caps the whole command; NORMAL_RUNS (default 1) repeats the normal run
# (ep_normal_N.txt), so one call shows how far the ratios move between runs. Exits non-zero when a
# run failed or a check did.
set -uo pipefail
DEFAULT_BUDGET_S=420
. "$(dirname "$0")/budget.sh"
BENCH="$ROOT/examples/ep_bench.py"
install_wheel
"$PY" -c "import accord.ep, torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())" \
  || { echo "ep: python3 cannot import accord.ep and torch"; exit 1; }
host_facts

PEERS_PATH=""
if [ -n "${DEEPEP_SRC:-}" ] && [ -f "$DEEPEP_SRC" ] && [ "${SKIP_DEEPEP:-0}" != 1 ]; then
  BUILD=$(mktemp -d)
  tar -xzf "$DEEPEP_SRC" -C "$BUILD"
  sed -i 's/^    if not disable_nvshmem:$/    disable_nvshmem = True  # accord: intranode only\n    if not disable_nvshmem:/' "$BUILD/setup.py"
  sed -i "s/'-rdc=true', //" "$BUILD/setup.py"
  t0=$SECONDS
  (cd "$BUILD" && TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 timeout 240 "$PY" setup.py build_ext --inplace) \
    > "$OUT/deepep_build.txt" 2>&1
  rc=$?
  echo "DeepEP build: exit $rc in $((SECONDS - t0)) s"
  if [ "$rc" -eq 0 ] && (cd "$BUILD" && "$PY" -c "import deep_ep") >> "$OUT/deepep_build.txt" 2>&1; then
    PEERS_PATH="$BUILD"
  else
    tail -5 "$OUT/deepep_build.txt"
  fi
fi

# GPU-side waits need eager module loading (accord/ep.py says why); EP_WAIT=host runs without it.
export CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-EAGER}
FAILED=0
run() {  # run NAME CAP ENV... -- ARGS...
  run_args "$@" || return
  echo "== $RUN_NAME (at most $RUN_CAP s)"
  env "${RUN_ENVS[@]}" PYTHONPATH="$PEERS_PATH${PYTHONPATH:+:$PYTHONPATH}" timeout -k 10 "$RUN_CAP" \
    "$PY" -m torch.distributed.run --nproc-per-node 2 "$BENCH" "${RUN_ARGS[@]}" > "$OUT/ep_$RUN_NAME.txt" 2>&1
  local rc=$?
  grep -E '^(#|\|)' "$OUT/ep_$RUN_NAME.txt"
  [ "$rc" -eq 0 ] || { echo "   exit $rc"; tail -15 "$OUT/ep_$RUN_NAME.txt"; FAILED=1; }
}
for n in $(seq 1 "${NORMAL_RUNS:-1}"); do
  suffix=$([ "${NORMAL_RUNS:-1}" = 1 ] || echo "_$n")
  run "normal$suffix" "${NORMAL_CAP_S:-150}" ACCORD_LOG=warn -- --wait "${EP_WAIT:-auto}" \
    --label "normal mode, one host, CUDA_MODULE_LOADING=$CUDA_MODULE_LOADING${suffix:+, run $n}"
done
run lowlat "${LOWLAT_CAP_S:-90}" ACCORD_LOG=warn -- --tokens 128 --graph --low-latency --profile --trace-dir "$OUT" --iters 50 --wait "${EP_WAIT:-auto}" --label "128 tokens a rank"
run network "${NETWORK_CAP_S:-120}" ACCORD_DEVICE_IPC=0 ACCORD_SHM=0 ACCORD_LOG=warn -- \
  --tokens "${NETWORK_TOKENS:-1024}" --no-peers --iters 5 --timeout "${NETWORK_WAIT_S:-60}" --wait "${EP_WAIT:-auto}" \
  --label "network route (IPC and shm off)"
exit $FAILED
