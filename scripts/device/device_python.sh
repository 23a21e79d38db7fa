#!/usr/bin/env bash
# accord.device from Python on a host with 2 GPUs (issue 19's Python side): runs
# examples/device_api/torch_ring_shift.py as two processes (accord.run, one GPU each), torch CUDA
# tensors as windows, the ring_shift.cu kernel launched on torch's current stream; each rank
# checks its result and the proxies' error list. Once per compiler: NVRTC (cuda.bindings) always,
# nvcc (a torch C++/CUDA extension through load_inline) where nvcc is found. Exits non-zero when
# any run failed or a compiler could not be used.
#
# Usage (GPU host, repo root): WHEEL=/path/to/accord-*.whl OUT=/path/to/out scripts/device/device_python.sh
# WHEEL: an accord wheel built where Rust is (`maturin build --release`, or
#   scripts/python-test.sh's target/pywheels/); installed with --no-deps into $OUT/site, which
#   goes first on PYTHONPATH. Without WHEEL, the `accord` python3 already imports is used.
# COMPILERS (default: "nvrtc", plus "nvcc" when nvcc is on PATH or CUDA_HOME is set) picks the
# runs; LIMIT_S (default 240) bounds each run; ELEMENTS / LAUNCHES go to the example.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
LIMIT_S=${LIMIT_S:-240}

fail() {
    echo "device_python: FAILED: $*" >&2
    exit 1
}

if [ -n "${WHEEL:-}" ]; then
    [ -f "$WHEEL" ] || fail "WHEEL=$WHEEL is not a file"
    "$PYTHON" -m pip install --quiet --no-deps --force-reinstall --target "$OUT/site" "$WHEEL" \
        || fail "pip could not install $WHEEL into $OUT/site"
    export PYTHONPATH="$OUT/site${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PYTHON" -c "import accord, accord.device; print('accord', accord.__version__, 'from', accord.__file__); print('header', accord.device.include_dir())" \
    || fail "python cannot import accord.device (set WHEEL to an accord wheel)"
"$PYTHON" -c "import torch; assert torch.cuda.device_count() >= 2, torch.cuda.device_count(); print('torch', torch.__version__, torch.cuda.device_count(), 'GPUs')" \
    || fail "need torch with CUDA and 2 GPUs"
nvidia-smi --query-gpu=index,name --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not available"

if [ -z "${COMPILERS:-}" ]; then
    COMPILERS=nvrtc
    if command -v nvcc >/dev/null || [ -n "${CUDA_HOME:-}" ]; then COMPILERS="nvrtc nvcc"; else echo "device_python: no nvcc on PATH and no CUDA_HOME: the nvcc run is skipped"; fi
fi
export TORCH_EXTENSIONS_DIR="$OUT/torch_extensions"
FAILED=0
for compiler in $COMPILERS; do
    echo "== $compiler (at most $LIMIT_S s)"
    timeout "$LIMIT_S" "$PYTHON" "$ROOT/examples/device_api/torch_ring_shift.py" --nprocs 2 --compiler "$compiler" \
        --timeout $((LIMIT_S - 15)) ${ELEMENTS:+--elements "$ELEMENTS"} ${LAUNCHES:+--launches "$LAUNCHES"} \
        >"$OUT/$compiler.txt" 2>&1
    rc=$?
    cat "$OUT/$compiler.txt"
    echo "   exit $rc"
    [ "$rc" -eq 0 ] || FAILED=1
done
echo "results in $OUT"
exit $FAILED
