"""scripts/device/ddp_transports_table.py (issue 21): the DDP loop's table over rounds. Checked on
made-up rows: each round's ratio is against Socket's median of the same round, the summary takes
the median over rounds of those ratios, a failed run is shown as failed, and differing final
parameters are reported."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("ddp_table", ROOT / "scripts" / "device" / "ddp_transports_table.py")
assert SPEC is not None and SPEC.loader is not None
ddp_table = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(ddp_table)


def run(label: str, rnd: int, median: float, digest: str = "abc") -> dict[str, object]:
    return {
        "label": label,
        "round": rnd,
        "step_ms_median": median,
        "step_ms_p10": median - 1,
        "step_ms_p90": median + 1,
        "params_sha256": digest,
        "ranks_agree": True,
    }


def test_ratios_pair_each_round_with_its_own_socket_run_and_the_summary_takes_their_median() -> None:
    rows = [
        run("socket", 1, 20.0),
        run("accord", 1, 10.0),  # 2.00x
        run("socket", 2, 30.0),
        run("accord", 2, 20.0),  # 1.50x
        run("socket", 3, 18.0),
        run("accord", 3, 10.0),  # 1.80x
    ]
    out = ddp_table.table(rows)
    assert "2.00x" in out and "1.50x" in out and "1.80x" in out
    summary = [line for line in out.splitlines() if line.startswith("accord") and "1.80x" in line]
    assert summary, out  # median of 2.00, 1.50, 1.80
    assert "2.00 1.50 1.80" in summary[0]
    assert "every transport gave the same parameters: True" in out


def test_a_failed_run_and_differing_parameters_are_reported() -> None:
    rows = [run("socket", 1, 20.0), {"label": "accord", "round": 1, "rc": 124}, run("nvlink", 1, 3.0, digest="zzz")]
    out = ddp_table.table(rows)
    assert "accord             failed rc=124" in out
    assert "every transport gave the same parameters: False" in out
