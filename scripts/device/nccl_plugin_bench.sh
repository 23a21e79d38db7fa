#!/usr/bin/env bash
# Accord NCCL net plugin on one host with 2 GPUs (2x H200):
#   1. builds libnccl-net-accord.so (unless ACCORD_NCCL_PLUGIN points at a built one);
#   2. reference run over NVLink (NCCL's defaults: P2P/SHM allowed);
#   3. the same over the network path with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, five ways:
#      Accord (NCCL_NET_PLUGIN=<.so> NCCL_NET=Accord) with the engine's defaults (shared-memory
#      datapath, workers per rank from LOCAL_WORLD_SIZE and the cores, workers polling while
#      they await traffic), Accord with shared memory off (ACCORD_SHM=0: kernel UDP over
#      loopback, the same-run baseline), Accord with the workers' poll off
#      (ACCORD_AWAIT_POLL_US=0: they sleep at once, the same-run baseline of the poll), Accord
#      with the library's NCCL tuner off (ACCORD_TUNER=0: NCCL's own protocol and channel
#      choices, the same-run baseline of the tuner), Accord with GPU buffers (ACCORD_NET_GPU_BUFFERS=1
#      NCCL_NET_GDR_LEVEL=SYS NCCL_NET_GDR_READ=1: NCCL keeps its buffers in GPU memory and the
#      GPUs' copy engines move the bytes through a shared host bounce pool, no CPU copies),
#      NCCL's Socket transport with defaults, and Socket tuned (NCCL_SOCKET_NTHREADS=4
#      NCCL_NSOCKS_PERTHREAD=4);
#   4. checks NCCL's log shows the plugin loaded (v11 on NCCL >= 2.28) and in use, that every
#      run's all_reduce / all_gather / all_to_all / send-recv results equal the NVLink run's
#      bit for bit, and prints one table:
#        bytes accord_busbw socket_busbw socket_tuned_busbw ratio_vs_tuned
#        bytes accord accord_udp accord_nopoll accord_notuner socket socket_tuned shm_vs_udp
#        vs_nopoll vs_notuner vs_tuned
#      then the targets, on the default run (`accord`) and on the GPU-buffers run (`accord_gpu`):
#      >= 2x tuned Socket at 256 MiB, >= Socket at 1 MiB.
# Every step says what it is doing; a failure names the step and the log to read.
#
# Usage: scripts/device/nccl_plugin_bench.sh [output directory]   (default: target/nccl-bench)
# Knobs: ACCORD_NCCL_PLUGIN=<path to .so>, PYTHON=python3, TORCHRUN=torchrun,
#        BENCH_ARGS="--iters 20 --warmup 5", ACCORD_* engine variables (they apply to every
#        Accord run; e.g. ACCORD_WORKERS_PER_NIC=4 pins the worker count), NOPOLL=0 skips the
#        poll-off run, NOTUNER=0 the tuner-off run, GPU=0 the GPU-buffers run, SOCKET=0 skips both Socket runs (to fit a time limit: run once with
#        SOCKET=0 and once with NOPOLL=0 if one call is too long).
set -uo pipefail

. "$(dirname "$0")/plugin_env.sh" "${1:-}" nccl-bench
TORCHRUN=${TORCHRUN:-torchrun}
BENCH=$ROOT/scripts/device/nccl_plugin_bench.py
BENCH_ARGS=${BENCH_ARGS:-}
STEP="start"

fail() {
    echo "FAILED at step: $STEP: $*" >&2
    exit 1
}

step() {
    STEP="$1"
    echo "=== $STEP"
}

step "check the host (2 GPUs, python, torch, torchrun)"
command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: run on the GPU host"
GPUS=$(nvidia-smi -L | wc -l)
[ "$GPUS" -ge 2 ] || fail "need 2 GPUs, nvidia-smi lists $GPUS"
"$PYTHON" -c "import torch, torch.distributed; assert torch.cuda.device_count() >= 2; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())" \
    || fail "python with CUDA torch and 2 visible GPUs is needed (set PYTHON)"
command -v "$TORCHRUN" >/dev/null || fail "torchrun not found (set TORCHRUN)"
NCCL_VERSION=$("$PYTHON" -c "import torch; print('.'.join(map(str, torch.cuda.nccl.version())))")
echo "NCCL bundled with torch: $NCCL_VERSION"
"$ROOT/scripts/device/host_copy_bandwidth.sh" | tee "$OUT/copy_bandwidth_before.txt"

step "build the plugin"
accord_plugin
# (binutils' nm is not on every GPU host: ask the dynamic loader instead.)
"$PYTHON" -c 'import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); getattr(lib, "ncclNetPlugin_v11")' "$PLUGIN" \
    || fail "$PLUGIN does not load or does not export ncclNetPlugin_v11"
# NCCL takes a path in NCCL_NET_PLUGIN; the directory on LD_LIBRARY_PATH lets it find the
# name `accord` (libnccl-net-accord.so) as well.
PLUGIN_DIR=$(mktemp -d)
ln -sf "$PLUGIN" "$PLUGIN_DIR/libnccl-net-accord.so"

# Accord's engine on a single host: loopback NIC and several paths (override freely). Workers
# per rank follow the engine's default (half the rank's share of the cores, 1..=8, from
# torchrun's LOCAL_WORLD_SIZE, or mpirun's and srun's equivalents; one rank per GPU when none
# is set) unless ACCORD_WORKERS_PER_NIC is set.
export ACCORD_NET_IFS=${ACCORD_NET_IFS:-127.0.0.1}
export ACCORD_PATHS=${ACCORD_PATHS:-4}
export ACCORD_SHARD_BYTES=${ACCORD_SHARD_BYTES:-262144}

PORT=$((29500 + RANDOM % 1000))
run() { # label, log, env assignments...
    local label=$1 log=$2
    shift 2
    PORT=$((PORT + 1))
    env "$@" "$TORCHRUN" --standalone --nproc_per_node 2 --master_port "$PORT" \
        "$BENCH" --label "$label" --out "$OUT/$label.json" $BENCH_ARGS >"$log" 2>&1
}

NET_ONLY=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET)
SOCKET_IF=(NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}")

step "reference run over NVLink (NCCL defaults)"
run nvlink "$OUT/nvlink.log" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT \
    || fail "NVLink run failed, see $OUT/nvlink.log"

ACCORD_RUN=("${NET_ONLY[@]}" NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=Accord LD_LIBRARY_PATH="$PLUGIN_DIR:${LD_LIBRARY_PATH:-}")

step "Accord plugin run, engine defaults (NCCL_NET=Accord, NCCL's P2P and SHM off, ACCORD_SHM=1)"
df -h /dev/shm | tail -1
run accord "$OUT/accord.log" "${ACCORD_RUN[@]}" ACCORD_SHM=1 \
    || fail "Accord run failed, see $OUT/accord.log (grep 'NET/Accord' for the plugin's reasons)"
# The plugin logs its engine's counters at finalize: datagrams through shared memory must be > 0.
grep -h "engine statistics" "$OUT/accord.log" | tail -2
grep -Eq "through shared memory [1-9]" "$OUT/accord.log" \
    || echo "WARNING: the shm run logged no datagrams through shared memory (see $OUT/accord.log: grep -i shared)"

step "Accord plugin run, UDP only (ACCORD_SHM=0): the same-run baseline of the shm datapath"
run accord_udp "$OUT/accord_udp.log" "${ACCORD_RUN[@]}" ACCORD_SHM=0 \
    || fail "Accord UDP run failed, see $OUT/accord_udp.log"

RUNS="nvlink accord accord_udp socket socket_tuned"
if [ "${GPU:-1}" != 0 ]; then
    step "Accord plugin run, GPU buffers (ACCORD_NET_GPU_BUFFERS=1 NCCL_NET_GDR_LEVEL=SYS NCCL_NET_GDR_READ=1)"
    run accord_gpu "$OUT/accord_gpu.log" "${ACCORD_RUN[@]}" ACCORD_SHM=1 ACCORD_NET_GPU_BUFFERS=1 \
        NCCL_NET_GDR_LEVEL=SYS NCCL_NET_GDR_READ=1 \
        || fail "Accord GPU-buffers run failed, see $OUT/accord_gpu.log (grep 'NET/Accord' for the plugin's reasons)"
    grep -q "via NET/Accord/0/GDRDMA" "$OUT/accord_gpu.log" \
        || echo "WARNING: NCCL did not hand the plugin GPU memory (no GDRDMA channel in $OUT/accord_gpu.log)"
    RUNS="$RUNS accord_gpu"
fi
if [ "${NOPOLL:-1}" != 0 ]; then
    step "Accord plugin run, shared memory, workers sleep at once (ACCORD_AWAIT_POLL_US=0)"
    run accord_nopoll "$OUT/accord_nopoll.log" "${ACCORD_RUN[@]}" ACCORD_SHM=1 ACCORD_AWAIT_POLL_US=0 \
        || fail "Accord poll-off run failed, see $OUT/accord_nopoll.log"
    RUNS="$RUNS accord_nopoll"
fi

if [ "${NOTUNER:-1}" != 0 ]; then
    step "Accord plugin run, the library's NCCL tuner off (ACCORD_TUNER=0): NCCL's own choices"
    run accord_notuner "$OUT/accord_notuner.log" "${ACCORD_RUN[@]}" ACCORD_SHM=1 ACCORD_TUNER=0 \
        || fail "Accord tuner-off run failed, see $OUT/accord_notuner.log"
    RUNS="$RUNS accord_notuner"
fi

step "check NCCL loaded the plugin and used it"
grep -E "NET/Accord|Accord" "$OUT/accord.log" | head -5
grep -Eq "Using network Accord" "$OUT/accord.log" \
    || fail "NCCL did not use network Accord, see $OUT/accord.log (grep -i plugin)"
case "$NCCL_VERSION" in
    2.2[8-9].*|2.[3-9][0-9].*) WANT_VERSION=v11 ;;
    *) WANT_VERSION=v10 ;;
esac
if grep -Eqi "plugin.*Accord.*\(?$WANT_VERSION\)?|Accord.*$WANT_VERSION" "$OUT/accord.log"; then
    echo "plugin loaded at $WANT_VERSION (NCCL $NCCL_VERSION)"
else
    grep -i "plugin" "$OUT/accord.log" | head -10
    fail "NCCL $NCCL_VERSION did not report loading Accord at $WANT_VERSION, see $OUT/accord.log"
fi

if [ "${SOCKET:-1}" != 0 ]; then
    step "Socket transport run, defaults"
    run socket "$OUT/socket.log" "${NET_ONLY[@]}" "${SOCKET_IF[@]}" NCCL_NET=Socket \
        || fail "Socket run failed, see $OUT/socket.log"

    step "Socket transport run, tuned (NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4)"
    run socket_tuned "$OUT/socket_tuned.log" "${NET_ONLY[@]}" "${SOCKET_IF[@]}" NCCL_NET=Socket \
        NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4 \
        || fail "tuned Socket run failed, see $OUT/socket_tuned.log"
else
    RUNS=${RUNS/ socket socket_tuned/}
fi

step "compare results with the NVLink run and print the table"
"$PYTHON" - "$OUT" $RUNS <<'EOF' || fail "comparison failed (see above)"
import json, sys
out = sys.argv[1]
runs = {name: json.load(open(f"{out}/{name}.json")) for name in sys.argv[2:]}
ok = True
reference = runs["nvlink"]["digests"]
for name in [n for n in runs if n != "nvlink"]:
    if runs[name]["digests"] != reference:
        ok = False
        for rank, (got, want) in enumerate(zip(runs[name]["digests"], reference)):
            bad = [op for op in want if got.get(op) != want[op]]
            if bad:
                print(f"MISMATCH {name} rank {rank}: {bad} differ from the NVLink run")
    else:
        print(f"{name}: all_reduce, all_gather, all_to_all, send/recv identical to the NVLink run")
print()
print("all_reduce busbw, GB/s (accord = plugin with the engine's defaults, accord_udp = ACCORD_SHM=0,")
print("accord_nopoll = ACCORD_AWAIT_POLL_US=0, accord_notuner = ACCORD_TUNER=0, accord_gpu = GPU buffers)")
cols = [n for n in ("accord", "accord_udp", "accord_nopoll", "accord_notuner", "accord_gpu", "socket", "socket_tuned")
        if n in runs]
def ratio(a, b):
    return a / b if b else float("nan")
print(f"{'bytes':>12} " + " ".join(f"{c:>13}" for c in cols) + f" {'shm_vs_udp':>11} {'vs_nopoll':>10} {'vs_notuner':>11} {'vs_tuned':>9} {'gpu_vs_tuned':>13}")
sizes = sorted(int(s) for s in runs["accord"]["all_reduce"])
for size in sizes:
    v = {n: runs[n]["all_reduce"].get(str(size), {}).get("busbw", float("nan")) for n in cols}
    vs_udp = ratio(v["accord"], v["accord_udp"])
    vs_nopoll = ratio(v["accord"], v.get("accord_nopoll", float("nan")))
    vs_notuner = ratio(v["accord"], v.get("accord_notuner", float("nan")))
    vs_tuned = ratio(v["accord"], v.get("socket_tuned", float("nan")))
    gpu_vs_tuned = ratio(v.get("accord_gpu", float("nan")), v.get("socket_tuned", float("nan")))
    print(f"{size:>12} " + " ".join(f"{v[c]:>13.2f}" for c in cols)
          + f" {vs_udp:>11.2f} {vs_nopoll:>10.2f} {vs_notuner:>11.2f} {vs_tuned:>9.2f} {gpu_vs_tuned:>13.2f}")
nv = runs["nvlink"]["all_reduce"].get(str(sizes[-1]), {}).get("busbw")
if nv:
    print(f"(NVLink reference at {sizes[-1]} B: {nv:.2f} GB/s)")
big, small = str(256 << 20), str(1 << 20)
def bw(n, s):
    return runs[n]["all_reduce"].get(s, {}).get("busbw", 0.0) if n in runs else 0.0
# The targets are judged on the default run and on the GPU-buffers run (a mode the user turns on
# with three variables), each line saying which.
for name in [n for n in ("accord", "accord_gpu") if n in runs]:
    if big in runs[name]["all_reduce"] and "socket_tuned" in runs:
        target = 2 * bw("socket_tuned", big)
        b = bw(name, big)
        verdict = "met" if b >= target else "NOT met"
        print(f"target 256 MiB: {name} {b:.2f} >= 2 x tuned socket {target:.2f} GB/s: {verdict}")
    if small in runs[name]["all_reduce"] and "socket" in runs:
        b = bw(name, small)
        verdict = "met" if b >= bw("socket", small) else "NOT met"
        print(f"target 1 MiB: {name} {b:.2f} >= socket {bw('socket', small):.2f} GB/s: {verdict}")
sys.exit(0 if ok else 1)
EOF
rm -rf "$PLUGIN_DIR"
"$ROOT/scripts/device/host_copy_bandwidth.sh" | tee "$OUT/copy_bandwidth_after.txt"
echo "done: JSON and logs in $OUT"
