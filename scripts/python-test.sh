#!/usr/bin/env bash
# Builds and installs the `accord` Python package into a virtualenv under target/pyenv (created
# once, reused after), then runs the Python tests (tests/python, including the stubtest check).
#
#   scripts/python-test.sh [pytest args...]
#
# Environment: PYTHON (default python3) picks the interpreter; ACCORD_PYENV (default
# target/pyenv) the virtualenv. Needs a Rust toolchain (cargo) and network access to PyPI the
# first time. torch is not installed: the tests that need it skip.
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

# Build a release wheel (abi3) and install it, replacing any previous build of the package.
WHEELS="$ROOT/target/pywheels"
rm -rf "$WHEELS"
(cd "$ROOT" && "$VENV/bin/maturin" build --release --quiet --out "$WHEELS" --interpreter "$PY")
"$PY" -m pip install --quiet --force-reinstall --no-deps "$WHEELS"/accord-*.whl

cd "$ROOT"
export MYPY_CACHE_DIR="$ROOT/target/mypy-cache"
"$PY" -m pytest tests/python -q "$@"
