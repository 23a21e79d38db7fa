#!/usr/bin/env bash
# Issue 21's device call, in one command (its runs end by HARD_S; session 50's calls on the
# 2xH200 host took 65 s to build nccl-tests, 30-40 s for a round of b, 20 s a DDP run): every acceptance
# target with the plugin's defaults, paired in time with tuned Socket and a baseline, then each
# target judged by issue21_verdict.py.
#   b) nccl_tests.sh twice (rounds b1, b2): all_reduce 1M..256M, both shapes (g2: one process
#      for both GPUs; mp: one per GPU), tuned Socket, the defaults (accord) and BASELINE, -c 1;
#   c) ddp_transports.sh: three rounds of socket, accord and BASELINE, the final parameters
#      compared;
#   a) (only when asked, STEPS="a ...") GPUDirect: all_reduce at 256 MiB, g2 and mp, with GPU
#      buffers on and no NCCL_* set by hand (accord_gpu_auto: the plugin sets
#      NCCL_NET_GDR_LEVEL), NCCL_DEBUG=INFO: whether NCCL's channels say /GDRDMA, and the
#      plugin's GPU-buffer counters.
# Runs from its own folder: in the repository (scripts/device/) or from a carried folder that
# holds this script, nccl_tests.sh, transports.sh, ddp_transports.sh, ddp_transports.py, the
# stripped plugin, nccl-tests' source tarball and the mpich wheel side by side.
#
# Usage: issue21.sh OUT_DIR
# Env:   ACCORD_NCCL_PLUGIN (default ./libnccl-net-accord.so beside this script), NCCL_TESTS_SRC
#        (./nccl-tests.tar.gz), MPICH_WHEEL (./mpich-*.whl), STEPS ("b c"), BASELINE (a transport of
#        transports.sh, default accord_ring2m: the plugin's rings before session 50's end), HARD_S (570: every
#        run's timeout is cut so that the last run of a step ends by then; a step whose runs would
#        get less than 20 s each is skipped and said so), DRY_RUN=1 (print each command with its
#        environment instead of running it; needs no GPU)
# Output: OUT_DIR/summary.txt (every table, written as it goes) and OUT_DIR/logs.tar.gz (every log,
# refreshed after each step), both on stdout too. Give the call a 600 s limit.
set -uo pipefail
OUT=${1:?output directory}
HERE="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export ACCORD_NCCL_PLUGIN=${ACCORD_NCCL_PLUGIN:-$HERE/libnccl-net-accord.so}
export NCCL_TESTS_SRC=${NCCL_TESTS_SRC:-$HERE/nccl-tests.tar.gz}
export MPICH_WHEEL=${MPICH_WHEEL:-$(ls "$HERE"/mpich-*.whl 2>/dev/null | head -1)}
HARD_S=${HARD_S:-570}
SUMMARY="$OUT/summary.txt"
# Logs stay outside OUT (only a few files come back from it) and travel as one tarball.
LOGS=$(mktemp -d /tmp/issue21-logs.XXXXXX)
: >"$SUMMARY"
# One build of nccl-tests for steps a and b, outside OUT.
export NCCL_TESTS_BUILD=${NCCL_TESTS_BUILD:-/tmp/issue21-nccl-tests}

say() { echo "$*" | tee -a "$SUMMARY"; }

# run_step NAME RUNS TIMEOUT ENV... -- COMMAND...: runs COMMAND with ENV (VAR=value words) and
# RUN_TIMEOUT = TIMEOUT, cut so that RUNS runs end by HARD_S (less 30 s for a build or the
# tables); skipped when that leaves under 20 s a run. With DRY_RUN=1 prints it instead.
run_step() {
    local name=$1 runs=$2 timeout=$3
    shift 3
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    local fit=$(((HARD_S - 30 - SECONDS) / runs))
    [ "$fit" -lt "$timeout" ] && timeout=$fit
    if [ "${DRY_RUN:-0}" = 1 ]; then
        local shown
        printf -v shown '%q ' RUN_TIMEOUT="$timeout" "${envs[@]}" "$@"
        say "[dry run] step $name ($runs runs): env $shown"
        return 0
    fi
    if [ "$timeout" -lt 20 ]; then
        say "step $name skipped: ${SECONDS} s spent, its $runs runs would get ${timeout} s each before HARD_S=${HARD_S}"
        return 0
    fi
    say "== step $name (start at ${SECONDS} s, ${timeout} s a run): $*"
    local t0=$SECONDS
    env RUN_TIMEOUT="$timeout" "${envs[@]}" "$@" 2>&1 | tee -a "$SUMMARY"
    say "== step $name took $((SECONDS - t0)) s"
    tar -czf "$OUT/logs.tar.gz" -C "$LOGS" . 2>/dev/null
}

check_inputs() {
    local missing=0 f
    for f in "$ACCORD_NCCL_PLUGIN" "$NCCL_TESTS_SRC" "$MPICH_WHEEL" "$HERE/nccl_tests.sh" "$HERE/transports.sh" \
        "$HERE/ddp_transports.sh" "$HERE/ddp_transports.py"; do
        [ -e "$f" ] || { say "issue21: missing ${f:-the mpich wheel}"; missing=1; }
    done
    return $missing
}
check_inputs || [ "${DRY_RUN:-0}" = 1 ] || exit 1
say "issue21: plugin $ACCORD_NCCL_PLUGIN, nccl-tests $NCCL_TESTS_SRC, MPICH $MPICH_WHEEL, runs end by ${HARD_S} s"
[ "${DRY_RUN:-0}" = 1 ] || nvidia-smi --query-gpu=index,name,pci.bus_id --format=csv,noheader 2>&1 | tee -a "$SUMMARY"

BASELINE=${BASELINE:-accord_ring2m}
for step in ${STEPS:-b c}; do
    case "$step" in
        a)
            # The build happens here (counted as a third run); each run is bounded.
            run_step a 3 30 SHAPES="g2 mp" TRANSPORTS="accord_gpu_auto" \
                BYTES_MIN=256M BYTES_MAX=256M ITERS=5 WARMUP=2 \
                EXTRA_ENV="NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,GRAPH" -- \
                bash "$HERE/nccl_tests.sh" "$LOGS/a"
            ;;
        b)
            # The build happens in round b1 (counted as two more runs); each run is bounded.
            for r in b1 b2; do
                run_step "$r" 8 60 SHAPES="g2 mp" TRANSPORTS="socket accord $BASELINE" ITERS=20 WARMUP=5 \
                    EXTRA_ENV="NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV" -- \
                    bash "$HERE/nccl_tests.sh" "$LOGS/$r"
            done
            ;;
        c)
            run_step c 9 60 TRANSPORTS="socket accord $BASELINE" ROUNDS=3 STEPS=30 \
                EXTRA_ENV="NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV" -- \
                bash "$HERE/ddp_transports.sh" "$LOGS/c"
            ;;
        *) say "issue21: unknown step $step (a, b or c)" ;;
    esac
done
if [ "${DRY_RUN:-0}" != 1 ]; then
    for transport in accord "$BASELINE"; do
        summaries=$(ls "$LOGS"/b1/summary.txt "$LOGS"/b2/summary.txt 2>/dev/null)
        [ -n "$summaries" ] || break
        ddp=()
        [ -e "$LOGS/c/ddp.jsonl" ] && ddp=(--ddp "$LOGS/c/ddp.jsonl")
        python3 "$HERE/issue21_verdict.py" --transport "$transport" "${ddp[@]}" $summaries 2>&1 | tee -a "$SUMMARY"
    done
    # What the plugin said about its devices and GPUDirect, once per distinct line (engine ids
    # dropped), and NCCL's own line for an NCCL_BUFFSIZE a transport sets (ENV); then the
    # GPU-buffer counters per run (logged at finalize with NCCL_DEBUG_SUBSYS including NET).
    grep -h "NCCL INFO .*\(Accord net plugin ready\|NCCL_NET_GDR_LEVEL\|GPU Direct RDMA\|NCCL_BUFFSIZE\)" -r "$LOGS" 2>/dev/null |
        sed 's/^.*NCCL INFO //; s/engine [0-9a-f]*, //' | sort | uniq -c | sort -rn | head -40 | tee -a "$SUMMARY"
    grep -r "GPU buffers: bounce_waits" "$LOGS" 2>/dev/null | sed "s|^$LOGS/||; s|:.*NCCL INFO | |" | tee -a "$SUMMARY"
    tar -czf "$OUT/logs.tar.gz" -C "$LOGS" .
fi
rm -rf "$LOGS"
say "issue21: done in ${SECONDS} s"
