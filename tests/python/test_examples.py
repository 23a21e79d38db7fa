"""The examples run to completion and verify their own data; the overhead bench prints its
table (no timing is asserted: tests never assert on timing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import accord._bench

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("script", "args", "says"),
    [
        ("kv_cache_transfer.py", ["--requests", "3", "--layers", "4"], "all pages verified"),
        ("weight_push.py", ["--rounds", "2"], "every round verified"),
        ("kv_read.py", ["--requests", "2", "--layers", "3", "--compare"], "all blocks verified"),
    ],
)
def test_example_runs_and_verifies(script: str, args: list[str], says: str) -> None:
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, f"{script} failed:\n{run.stdout}\n{run.stderr}"
    assert says in run.stdout


def test_overhead_bench_prints_its_table(capsys: pytest.CaptureFixture[str]) -> None:
    rows = accord._bench.main(["--iterations", "200", "--network-iterations", "50", "--repeats", "1"])
    out = capsys.readouterr().out
    assert [r.route for r in rows] == ["memcpy", "network"]
    assert "added" in out and "memcpy" in out and "network" in out
    assert all(r.rust_us > 0 and r.python_us > 0 for r in rows)


def test_kv_gpu_bench_says_what_it_needs_and_prints_tables(tmp_path: Path) -> None:
    bench = EXAMPLES / "kv_gpu_bench.py"
    row = {
        "case": "inproc", "op": "read", "blocks": 128, "bytes": 671088640, "first_ms": 90.0, "ms": [80.0],
        "median_ms": 80.0, "gbps": 8.39, "ceiling_gbps": 300.0, "ratio": 0.028, "checked": True, "error": "",
    }
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(row) + "\n" + json.dumps({**row, "op": "write", "checked": False}) + "\n")
    table = subprocess.run([sys.executable, str(bench), "--table", str(rows)], capture_output=True, text=True,
                           timeout=60)
    assert table.returncode == 1, "a row whose bytes were wrong fails the table"
    assert "bytes ok" in table.stdout and "BYTES WRONG" in table.stdout and "0.028" in table.stdout
    try:
        import torch

        has_cuda = bool(torch.cuda.is_available())
    except ImportError:
        has_cuda = False
    if not has_cuda:
        run = subprocess.run([sys.executable, str(bench), "--case", "inproc"], capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 2 and "kv_gpu_bench: needs" in run.stderr
