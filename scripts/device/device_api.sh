#!/usr/bin/env bash
# Issue 19's device acceptance run for the device API (accord/device.cuh), in one command, on a
# host with two GPUs:
#   1. accord-device-bench --route ipc: kernel-to-kernel ping-pong (put, put_value, put_direct),
#      many-peer puts checked byte for byte, a graph-captured ping-pong replayed 100 times, the
#      descriptor rate of one proxy thread, and large-put bandwidth against the IPC copy ceiling
#      and the engine's host-initiated writes, with the SMs spent copying;
#   1b. the same with the stream lanes off (--lane off: every descriptor an engine write), the
#      baseline the lanes are compared with (skip it with ENGINE_BASELINE=0);
#   2. the same with the network forced (--route network: ACCORD_DEVICE_IPC=0 ACCORD_SHM=0, so
#      puts take the cross-host routes over loopback UDP);
#   3. the NVSHMEM anchor (scripts/device/nvshmem_anchor.sh: NVSHMEM from PyTorch's wheel, built
#      with nvcc; it says why not where it cannot run), its rows beside the ipc run's.
# Each run's full output is kept in $OUT/<run>.txt and its JSON rows in $OUT/<run>.jsonl; the
# tables are printed at the end. Exits non-zero when any run failed (a wrong byte, a proxy
# error, a timeout).
#
# Usage (GPU host, repo root): BIN_DIR=/path/to/bins OUT=/path/to/out scripts/device/device_api.sh
# BIN_DIR holds a prebuilt `accord-device-bench` (the GPU host has no Rust: build it where Rust
# is with `cargo build --release -p accord-bench --bin accord-device-bench`,
# strip it, and carry it). Without BIN_DIR the script builds it with cargo.
# BUDGET_S (default 480 s, from the start) caps the whole command; each run is cut to what is
# left, and to IPC_CAP_S / NETWORK_CAP_S (default 200 s each); IPC_ARGS / NETWORK_ARGS add bench
# flags to a run (e.g. IPC_ARGS="--iters 300"). NVRTC must be loadable (ACCORD_CUDA_LIB_DIRS, the CUDA toolkit, or the nvidia-cuda-nvrtc
# wheel, which accord-cuda finds in Python's site-packages).
set -uo pipefail
DEFAULT_BUDGET_S=480
. "$(dirname "$0")/budget.sh"

BIN_DIR="${BIN_DIR:-}"
if [ -z "$BIN_DIR" ]; then
  (cd "$ROOT" && cargo build --release -q -p accord-bench --bin accord-device-bench) \
    || { echo "cargo build failed"; exit 1; }
  BIN_DIR="$ROOT/target/release"
fi
BIN="$BIN_DIR/accord-device-bench"
[ -x "$BIN" ] || { echo "no accord-device-bench in $BIN_DIR"; exit 1; }
host_facts

FAILED=0
# run NAME SECONDS ARGS...: one bench run under `timeout`, capped by what is left of the budget.
run() {
  local name=$1 cap=$2; shift 2
  cap=$(capped "$cap" 20) || { echo "== $name: skipped, $(left) s left of the budget"; FAILED=1; return; }
  echo "== $name (at most $cap s): $BIN $*"
  timeout "$cap" "$BIN" --timeout-s $((cap - 15)) "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  grep '^{' "$OUT/$name.txt" > "$OUT/$name.jsonl"
  echo "   exit $rc"
  [ "$rc" -eq 0 ] || FAILED=1
}

run ipc "${IPC_CAP_S:-200}" --route ipc ${IPC_ARGS:-}
# The baseline in the same call: the same run with the stream lanes off (every descriptor an
# engine write, as before the lanes existed).
[ "${ENGINE_BASELINE:-1}" = 1 ] && run ipc-engine "${ENGINE_CAP_S:-120}" --route ipc --lane off --iters 300 --replays 100 ${IPC_ARGS:-}
run network "${NETWORK_CAP_S:-200}" --route network --sizes-mib 1,4,16,64 --bw-iters 4 --iters 300 --replays 100 ${NETWORK_ARGS:-}

echo "== nvshmem anchor (scripts/device/nvshmem_anchor.sh; its rows beside the ipc run's)"
# The anchor's own script finds NVSHMEM (PyTorch's nvidia-nvshmem wheel), builds its
# put-with-signal program with nvcc and prints "not available"/"not run" (exit 0) where it
# cannot; a failed check or run makes this command fail too.
if NV_CAP=$(capped "${NVSHMEM_CAP_S:-120}" 30); then
  # Both paths first: a prefix assignment of OUT would change what "$OUT" means in the next one.
  NV_OUT="$OUT/nvshmem" IPC_ROWS="$OUT/ipc.jsonl"
  OUT="$NV_OUT" BUDGET_S="$NV_CAP" BESIDE="$IPC_ROWS" bash "$HERE/nvshmem_anchor.sh" \
    > "$OUT/nvshmem.txt" 2>&1 || FAILED=1
  tail -n 40 "$OUT/nvshmem.txt"
else
  echo "== nvshmem anchor: skipped, $(left) s left of the budget"; FAILED=1
fi

for name in ipc ipc-engine network; do
  [ -f "$OUT/$name.txt" ] || continue
  echo
  echo "######## $name"
  grep -v '^{' "$OUT/$name.txt"
done
echo
echo "results in $OUT; $(( SECONDS - START )) s"
exit $FAILED
