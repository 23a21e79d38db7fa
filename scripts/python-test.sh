#!/usr/bin/env bash
# Builds and installs the `accord` Python package into a virtualenv under target/pyenv (created
# once, reused after), then runs the Python tests (tests/python, including the stubtest check).
#
#   scripts/python-test.sh [pytest args...]
#
# Environment: PYTHON (default python3) picks the interpreter; ACCORD_PYENV (default
# target/pyenv) the virtualenv. Needs a Rust toolchain (cargo) and network access to PyPI the
# first time. torch comes from PyPI (see below); ACCORD_TEST_TORCH=0 leaves it out, and the tests
# that need it then skip.
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
if [[ "${ACCORD_TEST_TORCH:-1}" != "0" ]] && ! "$PY" -c "import torch" 2>/dev/null; then
    echo "python-test: installing torch from PyPI (once per virtualenv; set ACCORD_TEST_TORCH=0 to skip)"
    "$PY" -m pip install --quiet torch
fi

# Build a release wheel (abi3) and install it, replacing any previous build of the package.
WHEELS="$ROOT/target/pywheels"
rm -rf "$WHEELS"
(cd "$ROOT" && "$VENV/bin/maturin" build --release --quiet --out "$WHEELS" --interpreter "$PY")
"$PY" -m pip install --quiet --force-reinstall --no-deps "$WHEELS"/accord-*.whl

cd "$ROOT"
export MYPY_CACHE_DIR="$ROOT/target/mypy-cache"
"$PY" -m pytest tests/python -q "$@"
