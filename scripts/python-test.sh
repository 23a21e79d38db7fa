#!/usr/bin/env bash
# Builds and installs the `accord` Python package into a virtualenv under target/pyenv (created
# once, reused after), then runs the Python tests (tests/python, including the stubtest check).
#
#   scripts/python-test.sh [pytest args...]
#
# Environment: PYTHON (default python3) picks the interpreter; ACCORD_PYENV (default
# target/pyenv) the virtualenv. Needs a Rust toolchain (cargo) and network access to PyPI the
# first time. torch comes from PyPI where the disk has room (see below); ACCORD_TEST_TORCH=0
# leaves it out, and the tests that need it then skip.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="${ACCORD_PYENV:-$ROOT/target/pyenv}"

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "python-test: creating virtualenv $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

"$PY" -m pip install --quiet --upgrade pip
"$PY" -m pip install --quiet "maturin>=1.5,<2" numpy pytest pytest-timeout mypy typing_extensions ml_dtypes

# torch for the torch.distributed backend tests (tests/python/test_torch_backend.py). PyPI serves
# only the CUDA build of torch for Linux x86_64 (PyTorch's CPU-only index is not reachable here);
# it runs on CPU where no GPU is present. Measured on the 2-core test machine: the torch 2.15
# wheel is 539 MB (`pip download torch --no-deps`, 7 s), the CUDA libraries and triton it
# requires another 2.45 GB (`time pip install torch` over it: 1 min 48 s); 5.4 GB installed,
# once per virtualenv.
#
# A CI machine's disk is shared and its free space varies (one CI run ran out of space in this
# install), so torch is installed only where the virtualenv's disk has TORCH_NEEDS_GIB free: the
# 5.4 GB installed plus the ~3 GB of wheels pip unpacks from, with room for the build. Without the
# room the install is skipped, loudly, and the torch tests skip; ACCORD_TEST_TORCH=1 makes the
# lack of room an error instead. --no-cache-dir keeps pip from keeping a second copy of the wheels.
TORCH_NEEDS_GIB=10
free_gib() { df -Pk "$VENV" | awk 'NR==2 { print int($4 / 1048576) }'; }
if [[ "${ACCORD_TEST_TORCH:-auto}" != "0" ]] && ! "$PY" -c "import torch" 2>/dev/null; then
    FREE_GIB="$(free_gib)"
    if (( FREE_GIB >= TORCH_NEEDS_GIB )); then
        echo "python-test: installing torch from PyPI (${FREE_GIB} GiB free; once per virtualenv; set ACCORD_TEST_TORCH=0 to skip)"
        "$PY" -m pip install --quiet --no-cache-dir torch
    elif [[ "${ACCORD_TEST_TORCH:-auto}" == "1" ]]; then
        echo "python-test: torch needs ${TORCH_NEEDS_GIB} GiB free under $VENV, only ${FREE_GIB} GiB are" >&2
        exit 1
    else
        echo "python-test: NOT installing torch: ${FREE_GIB} GiB free under $VENV, it needs ${TORCH_NEEDS_GIB};"
        echo "python-test: the torch.distributed backend tests will SKIP (ACCORD_TEST_TORCH=1 makes this an error)"
    fi
fi

# Build a release wheel (abi3) and install it, replacing any previous build of the package.
WHEELS="$ROOT/target/pywheels"
rm -rf "$WHEELS"
(cd "$ROOT" && "$VENV/bin/maturin" build --release --quiet --out "$WHEELS" --interpreter "$PY")
"$PY" -m pip install --quiet --force-reinstall --no-deps "$WHEELS"/accord-*.whl

cd "$ROOT"
export MYPY_CACHE_DIR="$ROOT/target/mypy-cache"
"$PY" -m pytest tests/python -q "$@"
