#!/usr/bin/env bash
# Issue #6, device memory between host and device and across processes (branch gpu-staging), on
# one host with 2 GPUs: the engine's device GPU tests (every route: same-process host<->device,
# staged device -> host over the transport, device and host -> a device region over the landing
# rendezvous (same process with force_network, two processes with device_ipc off), two processes
# through IPC and staging, refused destinations, a peer that exits mid-transfer or mid-landing,
# plus the rendezvous' CPU tests), then the GPU write bench (GPU0 -> GPU1 in this
# process and through IPC, with the one-at-a-time split) and the host<->device routes against
# raw pinned copies measured in the same run (staged, staged-d2d: device -> device of another
# process with ACCORD_DEVICE_IPC=0, i.e. the cross-host route), with a staging-slot sweep.
#
# Usage: scripts/device/gpu_staging.sh [BIN_DIR]
#   BIN_DIR (default target/release) holds accord-engine-gpu-bench; the test binaries are taken
#   from BIN_DIR/accord-engine-tests and BIN_DIR/accord-engine-device-mp-tests if present, else
#   the newest target/release/deps/accord_engine-* and device_multiprocess-* executables.
#   Build them with:
#     cargo build --release -p accord-engine --bins
#     cargo test --release -p accord-engine --lib --test device_multiprocess --no-run
# Env: ENGINE_ITERS (default 30), SLOT_SWEEP (default "1048576 4194304 16777216").
set -u
BIN="${1:-target/release}"
export NCCL_NVLS_ENABLE=0
newest() { ls -t $1 2>/dev/null | grep -v '\.d$' | head -1; }
UNIT="$BIN/accord-engine-tests"; [ -x "$UNIT" ] || UNIT="$(newest 'target/release/deps/accord_engine-*')"
MP="$BIN/accord-engine-device-mp-tests"; [ -x "$MP" ] || MP="$(newest 'target/release/deps/device_multiprocess-*')"
cat <<'EOS'
Binaries this script runs (build them where Rust is, then carry them):
  cargo build --release -p accord-engine --bins
      -> target/release/accord-engine-gpu-bench
  cargo test --release -p accord-engine --lib --test device_multiprocess --no-run
      -> the two executables it names: target/release/deps/accord_engine-<hash> (unit tests)
         and target/release/deps/device_multiprocess-<hash>; copy them to
         BIN_DIR/accord-engine-tests and BIN_DIR/accord-engine-device-mp-tests
EOS
echo "using: unit tests $UNIT, multiprocess tests $MP, bench $BIN/accord-engine-gpu-bench"
RC=0
for f in "$UNIT" "$MP" "$BIN/accord-engine-gpu-bench"; do
  [ -x "$f" ] || { echo "missing binary: $f (see the build commands above)"; exit 2; }
done
echo "== engine device unit tests ($UNIT) =="
timeout 180 "$UNIT" device --test-threads=1 --nocapture 2>&1 | grep -E "^test |skipped|test result|panicked" || RC=1
echo "== engine landing rendezvous tests, CPU ($UNIT) =="
timeout 120 "$UNIT" landing --test-threads=1 2>&1 | grep -E "^test |test result|panicked" || RC=1
echo "== engine device tests across two processes ($MP) =="
timeout 150 "$MP" --test-threads=1 --nocapture --skip killed 2>&1 | grep -E "^test |skipped|test result|panicked" || RC=1
# The peer-kill tests one by one, each bounded, so a hang shows which one and costs little.
for t in $("$MP" --list 2>/dev/null | sed -n 's/^\(.*killed.*\): test$/\1/p'); do
  timeout 60 "$MP" "$t" --exact --test-threads=1 2>&1 | grep -E "^test |test result|panicked" \
    || { echo "test $t: failed or did not finish within 60 s"; RC=1; }
done
echo "== GPU0 -> GPU1 write, same process =="
timeout 120 "$BIN/accord-engine-gpu-bench" --iters "${ENGINE_ITERS:-30}" || RC=1
echo "== GPU0 -> GPU1 write, receiver in another process (CUDA IPC) =="
timeout 120 "$BIN/accord-engine-gpu-bench" --ipc --iters "${ENGINE_ITERS:-30}" || RC=1
echo "== pinned host -> device of another process (CUDA IPC) =="
timeout 120 "$BIN/accord-engine-gpu-bench" --route h2d --iters "${ENGINE_ITERS:-30}" || RC=1
for slot in ${SLOT_SWEEP:-1048576 4194304 16777216}; do
  echo "== device -> host region of another process, staged, ACCORD_DEVICE_STAGING_CHUNK_BYTES=$slot =="
  ACCORD_DEVICE_STAGING_CHUNK_BYTES=$slot timeout 180 "$BIN/accord-engine-gpu-bench" --route staged \
    --iters "${ENGINE_ITERS:-30}" || RC=1
done
for slot in ${SLOT_SWEEP:-1048576 4194304 16777216}; do
  echo "== device -> device of another process without IPC (staged here, landed there; the cross-host route), ACCORD_DEVICE_STAGING_CHUNK_BYTES=$slot =="
  ACCORD_DEVICE_IPC=0 ACCORD_DEVICE_STAGING_CHUNK_BYTES=$slot timeout 180 "$BIN/accord-engine-gpu-bench" \
    --route staged-d2d --iters "${ENGINE_ITERS:-30}" || RC=1
done
exit $RC
