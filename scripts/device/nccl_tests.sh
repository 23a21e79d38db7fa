#!/usr/bin/env bash
# NVIDIA's nccl-tests, built on the GPU host from its public source, run through NCCL's Socket
# transport and the Accord net plugin in both launch shapes users try first (issue 21):
#   g2: one process drives every GPU (`all_reduce_perf -g 2`, how nccl-tests runs without MPI);
#   mp: one process per GPU, launched by MPICH's mpiexec (`-n 2 ... -g 1`), the environment a
#       launcher gives (MPI_LOCALNRANKS and friends).
# Nothing of nccl-tests or MPICH is in this repository: the caller carries nccl-tests' source (a
# `git archive` tarball of github.com/NVIDIA/nccl-tests) and the `mpich` wheel from PyPI (its
# .data/data folder holds mpiexec, mpi.h and libmpi), and this script builds against the NCCL that
# PyTorch ships (the nvidia-nccl wheel).
#
# Usage: scripts/device/nccl_tests.sh OUT_DIR
# Env:   NCCL_TESTS_SRC   nccl-tests tarball or folder (required)
#        MPICH_WHEEL      mpich-*.whl (required for the mp shape; without it mp is skipped)
#        ACCORD_NCCL_PLUGIN  libnccl-net-accord.so (required for the accord transports)
#        SHAPES      default "g2 mp"
#        TRANSPORTS  default "socket accord accord_gpu"; the names of scripts/device/transports.sh
#        COLLS       default "all_reduce"; any of all_reduce all_gather alltoall sendrecv
#        BYTES_MIN / BYTES_MAX (1M / 256M), ITERS (-n, 20), WARMUP (-w, 5), RUN_TIMEOUT (s, 120)
#        EXTRA_ENV   VAR=value words added to every run (NCCL_DEBUG=INFO, say)
#        NCCL_TESTS_BUILD  a folder to build into and reuse (a second call with the same folder
#                    skips the build); default a temporary one
# Output: one nccl-tests log per run in OUT_DIR (its stderr beside it, .stderr: the plugin's
# ACCORD_ENGINE_DEBUG lines would otherwise split nccl-tests' rows), and a summary table on stdout: out-of-place busbw
# (GB/s) at each size, the #wrong column summed, nccl-tests' own "Out of bounds" verdict, and
# (with NCCL_DEBUG=INFO) how many of NCCL's "via NET/" channel lines say /GDRDMA.
set -uo pipefail
OUT=${1:?output directory}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
SHAPES=${SHAPES:-g2 mp}
TRANSPORTS=${TRANSPORTS:-socket accord accord_gpu}
COLLS=${COLLS:-all_reduce}
WORK=$(mktemp -d /tmp/nccl-tests.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# NCCL from PyTorch's wheel: headers and libnccl.so.2; nccl-tests links -lnccl, so give it a link.
# The wheel's folder is nvidia/nccl or nvidia/cu13 depending on the CUDA major; find the library.
NCCL_PKG=$(python3 - <<'PY'
import glob, os, sys
for root in sys.path:
    for lib in sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnccl.so.2"))):
        pkg = os.path.dirname(os.path.dirname(lib))
        if os.path.exists(os.path.join(pkg, "include", "nccl.h")):
            print(pkg)
            sys.exit(0)
sys.exit(1)
PY
) || { echo "nccl_tests: no libnccl.so.2 with nccl.h under nvidia/*/ in python3's path"; exit 1; }
mkdir -p "$WORK/nccl/lib"
ln -s "$NCCL_PKG/include" "$WORK/nccl/include"
ln -s "$NCCL_PKG/lib/libnccl.so.2" "$WORK/nccl/lib/libnccl.so"
export LD_LIBRARY_PATH="$NCCL_PKG/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "nccl_tests: NCCL $(python3 -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())))') from $NCCL_PKG"

MPI_HOME=""
if [ -n "${MPICH_WHEEL:-}" ] && [ -f "$MPICH_WHEEL" ]; then
    (cd "$WORK" && python3 -m zipfile -e "$MPICH_WHEEL" mpich) || { echo "nccl_tests: cannot unpack $MPICH_WHEEL"; exit 1; }
    MPI_HOME=$(ls -d "$WORK"/mpich/mpich-*.data/data)
    chmod +x "$MPI_HOME"/bin/* 2>/dev/null
    export PATH="$MPI_HOME/bin:$PATH" LD_LIBRARY_PATH="$MPI_HOME/lib:$LD_LIBRARY_PATH"
fi

SRC=${NCCL_TESTS_SRC:?set NCCL_TESTS_SRC to the nccl-tests source tarball or folder}
mkdir -p "$WORK/src"
if [ -d "$SRC" ]; then cp -r "$SRC"/. "$WORK/src/"; else tar -xf "$SRC" -C "$WORK/src"; fi
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
CC_MAJOR=$(python3 -c "import torch; print(''.join(map(str, torch.cuda.get_device_capability(0))))")
BIN=${NCCL_TESTS_BUILD:-$WORK}
mkdir -p "$BIN"
build() {  # build NAME MPI(0|1): the perf binaries of COLLS into $BIN/NAME (kept ones are reused)
    local t0=$SECONDS targets=() coll
    for coll in $COLLS; do [ -x "$BIN/$1/${coll}_perf" ] || targets+=("$BIN/$1/${coll}_perf"); done
    if [ ${#targets[@]} = 0 ]; then echo "nccl_tests: reusing $BIN/$1"; return 0; fi
    make -C "$WORK/src/src" -j16 MPI="$2" ${MPI_HOME:+MPI_HOME=$MPI_HOME} NCCL_HOME="$WORK/nccl" CUDA_HOME="$CUDA_HOME" \
        NVCC_GENCODE="-gencode=arch=compute_${CC_MAJOR},code=sm_${CC_MAJOR}" BUILDDIR="$BIN/$1" "${targets[@]}" \
        >"$OUT/build_$1.log" 2>&1 || { echo "nccl_tests: build $1 failed (see build_$1.log)"; tail -5 "$OUT/build_$1.log"; return 1; }
    echo "nccl_tests: built $1 (MPI=$2) in $((SECONDS - t0)) s"
}
build plain 0 || exit 1
HAVE_MP=0
if [ -n "$MPI_HOME" ]; then build mpi 1 && HAVE_MP=1; fi

PLUGIN_DIR=""
if [ -n "${ACCORD_NCCL_PLUGIN:-}" ]; then
    PLUGIN_DIR="$WORK/plugin" && mkdir -p "$PLUGIN_DIR"
    ln -s "$(readlink -f "$ACCORD_NCCL_PLUGIN")" "$PLUGIN_DIR/libnccl-net-accord.so"
fi
source "$(dirname "$0")/transports.sh"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
printf "%-6s %-15s %-11s %s\n" shape transport coll "busbw GB/s out-of-place by size | #wrong | verdict" | tee -a "$SUMMARY"
for shape in $SHAPES; do
    if [ "$shape" = mp ] && [ "$HAVE_MP" != 1 ]; then echo "nccl_tests: mp shape skipped: no MPICH_WHEEL"; continue; fi
    for transport in $TRANSPORTS; do
        read -r -a envs <<<"$(transport_env "$transport" "$PLUGIN_DIR")"
        if [ "${envs[0]:-}" = UNKNOWN ]; then echo "nccl_tests: unknown transport $transport"; continue; fi
        case "$transport" in accord*) [ -z "$PLUGIN_DIR" ] && { echo "nccl_tests: $transport skipped: no ACCORD_NCCL_PLUGIN"; continue; } ;; esac
        for coll in $COLLS; do
            log="$OUT/${shape}_${transport}_${coll}.log"
            args=(-b "${BYTES_MIN:-1M}" -e "${BYTES_MAX:-256M}" -f 4 -n "${ITERS:-20}" -w "${WARMUP:-5}" -c 1)
            if [ "$shape" = g2 ]; then
                env "${envs[@]}" ${EXTRA_ENV:-} timeout "${RUN_TIMEOUT:-120}" "$BIN/plain/${coll}_perf" -g 2 "${args[@]}" >"$log" 2>"${log%.log}.stderr"
            else
                # Hydra forwards this environment to both ranks; -launcher fork keeps it on this host.
                env "${envs[@]}" ${EXTRA_ENV:-} timeout "${RUN_TIMEOUT:-120}" mpiexec -launcher fork -n 2 "$BIN/mpi/${coll}_perf" -g 1 "${args[@]}" >"$log" 2>"${log%.log}.stderr"
            fi
            rc=$?
            [ "$rc" = 0 ] || tail -3 "${log%.log}.stderr" | sed "s/^/nccl_tests: $shape $transport $coll stderr: /"
            row=$(python3 - "$log" <<'PY'
import re, sys
bw, wrong, verdict, net, gdr = [], 0, "no verdict", 0, 0
for line in open(sys.argv[1], errors="replace"):
    if " via NET/" in line:
        net += 1
        gdr += "/GDRDMA" in line
    f = line.split()
    if len(f) >= 13 and f[0].isdigit() and f[2] in ("float", "half", "int8", "bfloat16", "double", "int32"):
        size = int(f[0])
        # columns: size count type redop root | time algbw busbw #wrong (out-of-place) | in-place
        bw.append(f"{size >> 20}M:{float(f[7]):.2f}" if size >= 1 << 20 else f"{size >> 10}K:{float(f[7]):.2f}")
        for w in (f[8], f[12]):
            wrong += int(w) if w.isdigit() else 0
    if "Out of bounds values" in line:
        verdict = line.split(":", 1)[1].strip()
print(" ".join(bw) + f" | {wrong} | {verdict}" + (f" | GDRDMA {gdr}/{net} NET channels" if net else ""))
PY
)
            printf "%-6s %-15s %-11s %s rc=%s\n" "$shape" "$transport" "$coll" "$row" "$rc" | tee -a "$SUMMARY"
        done
    done
done
