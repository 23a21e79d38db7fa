"""The typed stubs match the native module (mypy.stubtest), and the package, the examples and
these tests type-check against them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _mypy_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("MYPY_CACHE_DIR", str(ROOT / "target" / "mypy-cache"))
    return env


def test_stubs_match_the_native_module() -> None:
    pytest.importorskip("mypy")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy.stubtest",
            "accord",
            "--allowlist",
            str(ROOT / "tests" / "python" / "stubtest-allowlist.txt"),
            "--ignore-unused-allowlist",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=_mypy_env(),
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_package_and_examples_type_check() -> None:
    pytest.importorskip("mypy")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--ignore-missing-imports",
            "--python-version",
            "3.10",
            str(ROOT / "python" / "accord"),
            str(ROOT / "examples"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=_mypy_env(),
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout + run.stderr
