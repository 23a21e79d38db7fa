#!/usr/bin/env bash
# NIC failover under a real NCCL job on one host with 2 GPUs (issue 18): each rank runs in a
# network namespace of its own; the two namespaces are joined by two veth pairs, v0
# (10.231.0.0/24) and v1 (10.231.1.0/24), the rank's two Accord devices
# (ACCORD_NET_IFS=<its v0 address>,<its v1 address>), plus a control pair c0 (10.231.9.0/24)
# for torch's store and NCCL's bootstrap only. The ranks run all_reduces over the plugin
# (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Accord, ACCORD_SHM=0 so bytes cross the
# veths) for SECONDS; CUT_AFTER_S into the timed part this script takes v1 down in rank 0's
# namespace. Every result is checked exactly. Prints bandwidth per 100 ms window and the
# mean before the cut, during the failover (until the first all_reduce that started after the
# cut finished), and after it, as a share of before (VCCL reports keeping about 77%).
#
# It first probes whether this host lets it make namespaces and veths (root, CAP_NET_ADMIN,
# an `ip` that runs); if not it prints why and exits 0 having done nothing. The namespaces are
# deleted on every exit (trap), and the ranks are bounded by `timeout`.
#
# A host without iproute2 (the GPU hosts): carry a copy from a machine that has it,
#   scripts/device/carry_iproute.sh .carry/iproute      (there; then, on the host:)
#   IP_BIN=.carry/iproute/ip IP_LIB_DIR=.carry/iproute scripts/device/nic_failover.sh OUT
# With IP_LIB_DIR holding a dynamic loader (ld-linux-x86-64.so.2, as carry_iproute.sh copies)
# `ip` runs through it with that directory as its only library path, so it needs nothing of
# the host's C library; without one, with LD_LIBRARY_PATH=IP_LIB_DIR for `ip` alone. Either
# way the ranks that `ip netns exec` starts get this script's own environment.
#
# Usage: scripts/device/nic_failover.sh [output directory]   (default: target/nic-failover)
# Knobs: ACCORD_NCCL_PLUGIN=<path to libnccl-net-accord.so> (default: build it), PYTHON,
#        SECONDS_RUN (timed part, default 20), CUT_AFTER_S (default 5), BYTES (all_reduce size,
#        default 67108864), LIMIT_S (bound of one all_reduce, default 120),
#        ACCORD_IDLE_TIMEOUT_MS (how long a lane with nothing acknowledged is given before its
#        writes move to the other NIC; default here 1000, the engine's own default is 5000),
#        other ACCORD_* engine variables; IP_BIN (the `ip` to run, default: the one on PATH)
#        and IP_LIB_DIR (its libraries, see above).
set -uo pipefail

# Paths given relative to where the script was started from.
IP_BIN=${IP_BIN:-ip}
case $IP_BIN in */*) IP_BIN=$(readlink -m "$IP_BIN") ;; esac
IP_LIB_DIR=${IP_LIB_DIR:+$(readlink -m "$IP_LIB_DIR")}
IP_LOADER=${IP_LIB_DIR:+$IP_LIB_DIR/ld-linux-x86-64.so.2}

cd "$(dirname "$0")/../.."
ROOT=$(pwd)
OUT=${1:-$ROOT/target/nic-failover}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
SECONDS_RUN=${SECONDS_RUN:-20}
CUT_AFTER_S=${CUT_AFTER_S:-5}
BYTES=${BYTES:-67108864}
LIMIT_S=${LIMIT_S:-120}
SCRIPT=$ROOT/scripts/device/nic_failover.py
NS_A=accord-nf-a-$$
NS_B=accord-nf-b-$$

fail() {
    echo "FAILED: $*" >&2
    exit 1
}

skip() {
    echo "SKIP: $*"
    exit 0
}

# `ip`, as IP_BIN and IP_LIB_DIR say. Every `ip` below is this function.
ip() {
    if [ -z "$IP_LIB_DIR" ]; then
        command "$IP_BIN" "$@"
    elif [ -x "$IP_LOADER" ]; then
        "$IP_LOADER" --library-path "$IP_LIB_DIR" "$IP_BIN" "$@"
    else
        LD_LIBRARY_PATH="$IP_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$IP_BIN" "$@"
    fi
}
# What `ip netns exec NS env "${OWN_ENV[@]}" ...` restores: the library path this script had.
if [ -n "${LD_LIBRARY_PATH+set}" ]; then
    OWN_ENV=("LD_LIBRARY_PATH=$LD_LIBRARY_PATH")
else
    OWN_ENV=(-u LD_LIBRARY_PATH)
fi

cleanup() {
    for ns in "$NS_A" "$NS_B" "accord-nf-probe-$$"; do
        ip netns del "$ns" 2>/dev/null
    done
}
trap cleanup EXIT

# Every environment this script starts keeps NVLink SHARP / multicast off.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

echo "=== probe: network namespaces and veth pairs on this host"
if [ "$IP_BIN" = ip ] && [ -z "$IP_LIB_DIR" ] && ! type -P ip >/dev/null; then
    skip "no 'ip' (iproute2) on this host (carry one: IP_BIN and IP_LIB_DIR, scripts/device/carry_iproute.sh)"
fi
ip -V >"$OUT/probe.err" 2>&1 || skip "IP_BIN=$IP_BIN${IP_LIB_DIR:+ (IP_LIB_DIR=$IP_LIB_DIR)} does not run here: $(cat "$OUT/probe.err")"
echo "ip: $IP_BIN${IP_LIB_DIR:+ with the libraries of $IP_LIB_DIR}: $(cat "$OUT/probe.err")"
[ "$(id -u)" -eq 0 ] || skip "not root (uid $(id -u)): cannot make network namespaces"
PROBE=accord-nf-probe-$$
ip netns add "$PROBE" 2>"$OUT/probe.err" || skip "ip netns add failed: $(cat "$OUT/probe.err")"
ip -n "$PROBE" link add p0 type veth peer name p1 2>"$OUT/probe.err" || skip "no veth in a namespace: $(cat "$OUT/probe.err")"
ip -n "$PROBE" link set p0 down 2>"$OUT/probe.err" || skip "cannot set a link down: $(cat "$OUT/probe.err")"
ip netns exec "$PROBE" env "${OWN_ENV[@]}" true 2>"$OUT/probe.err" || skip "ip netns exec failed: $(cat "$OUT/probe.err")"
ip netns del "$PROBE"
echo "namespaces, veth pairs and ip netns exec work here"

echo "=== check the host"
command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: run on the GPU host"
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] || fail "need 2 GPUs"
"$PYTHON" -c "import torch; assert torch.cuda.device_count() >= 2" || fail "python with CUDA torch and 2 GPUs needed"
ip netns add "$NS_A" || fail "ip netns add $NS_A"
ip netns exec "$NS_A" env "${OWN_ENV[@]}" nvidia-smi -L >/dev/null || fail "the GPUs are not visible inside a network namespace"

echo "=== the plugin"
if [ -n "${ACCORD_NCCL_PLUGIN:-}" ]; then
    PLUGIN=$ACCORD_NCCL_PLUGIN
else
    cargo build --release -p accord-nccl-net >"$OUT/build.log" 2>&1 || fail "cargo build failed, see $OUT/build.log"
    PLUGIN=$ROOT/target/release/libnccl-net-accord.so
fi
PLUGIN=$(readlink -f "$PLUGIN")
[ -f "$PLUGIN" ] || fail "plugin $PLUGIN does not exist"

echo "=== namespaces $NS_A and $NS_B: v0 10.231.0.0/24, v1 10.231.1.0/24, c0 10.231.9.0/24 (control)"
ip netns add "$NS_B" || fail "ip netns add $NS_B"
for pair in "v0 0" "v1 1" "c0 9"; do
    set -- $pair
    ip -n "$NS_A" link add "$1" type veth peer name "$1" netns "$NS_B" || fail "veth $1"
    ip -n "$NS_A" addr add "10.231.$2.1/24" dev "$1" && ip -n "$NS_B" addr add "10.231.$2.2/24" dev "$1" || fail "addresses of $1"
    # Jumbo frames, as on the fabrics the engine's 4 KiB datagrams are sized for.
    ip -n "$NS_A" link set "$1" mtu 9000 up && ip -n "$NS_B" link set "$1" mtu 9000 up || fail "$1 up"
done
ip -n "$NS_A" link set lo up && ip -n "$NS_B" link set lo up || fail "lo up"
ip netns exec "$NS_A" env "${OWN_ENV[@]}" ping -c 1 -W 2 10.231.1.2 >/dev/null 2>&1 || echo "(ping over v1 did not answer; going on)"

PORT=$((29500 + RANDOM % 1000))
READY=$OUT/ready
rm -f "$READY" "$OUT/rank0.json"
COMMON=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=Accord NCCL_DEBUG=WARN
    NCCL_SOCKET_IFNAME=c0 TORCH_NCCL_ASYNC_ERROR_HANDLING=1 ACCORD_SHM=0
    ACCORD_IDLE_TIMEOUT_MS="${ACCORD_IDLE_TIMEOUT_MS:-1000}" WORLD_SIZE=2 MASTER_ADDR=10.231.9.1 MASTER_PORT=$PORT)
pids=()
for rank in 0 1; do
    ns=$NS_A
    [ "$rank" -eq 1 ] && ns=$NS_B
    side=$((rank + 1))
    ip netns exec "$ns" env "${OWN_ENV[@]}" "${COMMON[@]}" RANK=$rank LOCAL_RANK=$rank \
        ACCORD_NET_IFS="10.231.0.$side,10.231.1.$side" \
        timeout $((SECONDS_RUN + LIMIT_S + 120)) "$PYTHON" "$SCRIPT" --out "$OUT/rank0.json" \
        --ready-file "$READY" --bytes "$BYTES" --seconds "$SECONDS_RUN" --limit-s "$LIMIT_S" \
        >"$OUT/rank$rank.log" 2>&1 &
    pids+=($!)
done

echo "=== run: waiting for the timed part to start (at most 300 s)"
for _ in $(seq 1 3000); do
    [ -f "$READY" ] && break
    kill -0 "${pids[0]}" 2>/dev/null || break
    sleep 0.1
done
[ -f "$READY" ] || { kill -9 "${pids[@]}" 2>/dev/null; fail "rank 0 never started timing, see $OUT/rank0.log and $OUT/rank1.log"; }
sleep "$CUT_AFTER_S"
"$PYTHON" -c 'import time; print(repr(time.time()))' >"$OUT/cut"
ip -n "$NS_A" link set v1 down || fail "could not take v1 down"
echo "v1 down in $NS_A at $(cat "$OUT/cut")"
wait "${pids[0]}"
rc0=$?
wait "${pids[1]}"
rc1=$?
echo "rank exit codes: $rc0 $rc1"
[ -f "$OUT/rank0.json" ] || fail "rank 0 wrote no result, see $OUT/rank0.log"

echo "=== result"
"$PYTHON" - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
r = json.loads((out / "rank0.json").read_text())
cut = float((out / "cut").read_text())
start, ends, size = r["start"], r["ends"], r["bytes"]
# all_reduce bus bytes per rank for 2 ranks: 2 * (n - 1) / n * size = size.
window = 0.1
counts = {}
for e in ends:
    counts[int((e - start) / window)] = counts.get(int((e - start) / window), 0) + size
first_after = next((e for e, s in zip(ends, [start] + ends[:-1]) if s >= cut), None)
def phase(w):
    lo, hi = start + w * window, start + (w + 1) * window
    if hi <= cut:
        return "before"
    if first_after is None or lo <= first_after:
        return "during"
    return "after"
last = int((ends[-1] - start) / window) if ends else -1
print(f"{'window':>6} {'t_s':>5} {'busbw_GBps':>10}  phase   (cut at {cut - start:.2f} s; "
      f"first all_reduce begun after the cut ended at {(first_after - start) if first_after else float('nan'):.2f} s)")
sums = {}
for w in range(last + 1):
    b = counts.get(w, 0)
    ph = phase(w)
    sums.setdefault(ph, []).append(b)
    print(f"{w:>6} {w * window:>5.1f} {b / window / 1e9:>10.2f}  {ph}")
before = sums.get("before")
ref = sum(before) / len(before) if before else None
for ph in ("before", "during", "after"):
    v = sums.get(ph)
    if not v:
        print(f"{ph:>7}: no window")
        continue
    m = sum(v) / len(v)
    share = f" ({100 * m / ref:.0f}% of before)" if ref else ""
    print(f"{ph:>7}: {m / window / 1e9:.2f} GB/s{share}")
print(f"all_reduces: {len(ends)}, wrong results: {r['wrong']}, error: {r['error']}")
ok = r["error"] is None and r["wrong"] == 0 and any(e > cut for e in ends)
print("the job kept running through the cut with exact results:", "yes" if ok else "NO")
sys.exit(0 if ok else 1)
PY
