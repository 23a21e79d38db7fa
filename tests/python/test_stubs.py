"""The typed stubs match the native module (mypy.stubtest), and the package, the examples and
these tests type-check against them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run_mypy(*args: str) -> None:
    """Runs `python -m <args>` (mypy or stubtest) from the repository root, with its cache
    under target/, and fails the test with mypy's output unless it passed."""
    pytest.importorskip("mypy")
    env = dict(os.environ)
    env.setdefault("MYPY_CACHE_DIR", str(ROOT / "target" / "mypy-cache"))
    run = subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_stubs_match_the_native_module() -> None:
    _run_mypy(
        "mypy.stubtest",
        "accord",
        "--allowlist",
        str(ROOT / "tests" / "python" / "stubtest-allowlist.txt"),
        "--ignore-unused-allowlist",
    )


def test_package_and_examples_type_check() -> None:
    _run_mypy(
        "mypy",
        "--strict",
        "--ignore-missing-imports",
        "--python-version",
        "3.10",
        str(ROOT / "python" / "accord"),
        str(ROOT / "examples"),
    )
