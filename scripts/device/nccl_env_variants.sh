#!/usr/bin/env bash
# nccl-tests' all_reduce through the Accord plugin (or Socket) under environment variants, one
# process per GPU (mpiexec -n 2 ... -g 1), round by round, so a knob's effect is compared in one
# call on the same host (issue 21: what bounds the one-process-per-GPU host path).
#
# Usage: scripts/device/nccl_env_variants.sh OUT_DIR
# Env:   NCCL_TESTS_SRC, MPICH_WHEEL, ACCORD_NCCL_PLUGIN  as scripts/device/nccl_tests.sh takes them
#        NCCL_TESTS_BUILD  nccl-tests build folder (default /tmp/ntb; built through nccl_tests.sh
#                    when it lacks mpi/all_reduce_perf)
#        VARIANTS    ";"-separated "NAME TRANSPORT [VAR=value ...]" (TRANSPORT: a name of
#                    scripts/device/transports.sh); default: socket, the plugin's defaults, and
#                    ACCORD_WORKERS_PER_NIC=8
#        ROUNDS      rounds (default 2); BYTES_MIN (1M) to BYTES_MAX (256M) by x FACTOR (256);
#                    ITERS (-n, 100);
#                    RUN_TIMEOUT seconds a run (60)
# Output: one line per run (NAME, round, exit status, busbw GB/s and #wrong at each size), each
#         nccl-tests log in OUT_DIR.
set -uo pipefail
OUT=${1:?output directory}
mkdir -p "$OUT"
HERE="$(cd "$(dirname "$0")" && pwd)"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BUILD=$(mkdir -p "${NCCL_TESTS_BUILD:-/tmp/ntb}" && cd "${NCCL_TESTS_BUILD:-/tmp/ntb}" && pwd)
WHEEL=$(readlink -f "${MPICH_WHEEL:?set MPICH_WHEEL to the mpich wheel}")
PLUGIN=$(readlink -f "${ACCORD_NCCL_PLUGIN:?set ACCORD_NCCL_PLUGIN}")
if [ ! -x "$BUILD/mpi/all_reduce_perf" ]; then
    NCCL_TESTS_BUILD=$BUILD SHAPES=mp TRANSPORTS=socket BYTES_MIN=256M ITERS=5 WARMUP=1 \
        "$HERE/nccl_tests.sh" "$OUT/build" >"$OUT/build.txt" 2>&1 || { echo "build failed"; tail -5 "$OUT/build.txt"; exit 1; }
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && python3 -m zipfile -e "$WHEEL" mpich) || exit 1
MPI_HOME=$(ls -d "$WORK"/mpich/mpich-*.data/data) || { echo "no mpich data folder in $WHEEL"; exit 1; }
chmod +x "$MPI_HOME"/bin/*
# The NCCL nccl_tests.sh built against: PyTorch's wheel's, the folder that has nccl.h beside it.
NCCL_LIB=$(python3 - <<'PY'
import glob, os, sys
for root in sys.path:
    for lib in sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnccl.so.2"))):
        if os.path.exists(os.path.join(os.path.dirname(os.path.dirname(lib)), "include", "nccl.h")):
            print(os.path.dirname(lib))
            sys.exit(0)
sys.exit(1)
PY
) || { echo "no libnccl.so.2 with nccl.h under nvidia/*/ in python3's path"; exit 1; }
mkdir -p "$WORK/plugin" && ln -s "$PLUGIN" "$WORK/plugin/libnccl-net-accord.so"
source "$HERE/transports.sh"
VARIANTS=${VARIANTS:-socket socket;accord accord;accord_w8 accord ACCORD_WORKERS_PER_NIC=8}
for round in $(seq 1 "${ROUNDS:-2}"); do
    IFS=';' read -r -a variants <<<"$VARIANTS"
    for variant in "${variants[@]}"; do
        read -r -a words <<<"$variant"
        if [ ${#words[@]} -lt 2 ]; then echo "variant \"$variant\": give NAME TRANSPORT [VAR=value ...]"; continue; fi
        name=${words[0]} transport=${words[1]}
        read -r -a envs <<<"$(transport_env "$transport" "$WORK/plugin")"
        if [ "${envs[0]:-}" = UNKNOWN ]; then echo "$name: unknown transport $transport"; continue; fi
        log="$OUT/${name}_r$round.log"
        env "${envs[@]}" "${words[@]:2}" PATH="$MPI_HOME/bin:$PATH" LD_LIBRARY_PATH="$MPI_HOME/lib:$NCCL_LIB:$WORK/plugin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
            timeout "${RUN_TIMEOUT:-60}" mpiexec -launcher fork -n 2 "$BUILD/mpi/all_reduce_perf" -g 1 \
            -b "${BYTES_MIN:-1M}" -e "${BYTES_MAX:-256M}" -f "${FACTOR:-256}" -n "${ITERS:-100}" -w 5 -c 1 >"$log" 2>&1
        rc=$?
        echo "$name round $round rc=$rc $(awk '$1 ~ /^[0-9]+$/ && NF >= 13 {printf "%s:%s(wrong %s) ", ($1 >= 1048576 ? $1/1048576 "M" : $1), $8, $9}' "$log")"
    done
done
