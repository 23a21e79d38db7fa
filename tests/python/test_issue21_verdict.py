"""scripts/device/issue21_verdict.py (issue 21): the acceptance targets read off nccl-tests'
summaries and the DDP loop's rows. Checked on made-up rows: a target is met only when every round
meets it, a missing or failed run is not met, wrong values or a failed verification fail the
correctness line, and the DDP target takes the median of per-round ratios."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("issue21_verdict", ROOT / "scripts" / "device" / "issue21_verdict.py")
assert SPEC is not None and SPEC.loader is not None
verdict = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(verdict)

HEADER = "shape  transport       coll        busbw GB/s out-of-place by size | #wrong | verdict\n"


def summary(rows: dict[tuple[str, str], tuple[float, float]], wrong: int = 0, ok: str = "0 OK") -> str:
    """A summary.txt with 1M and 256M busbw per (shape, transport)."""
    lines = [HEADER]
    for (shape, transport), (small, large) in rows.items():
        lines.append(
            f"{shape:<6} {transport:<15} all_reduce  1M:{small:.2f} 256M:{large:.2f} | {wrong} | {ok} | GDRDMA 0/16 NET channels rc=0\n"
        )
    return "".join(lines)


def ddp(rounds: list[tuple[float, float]], digest: str = "abc") -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for i, (socket, accord) in enumerate(rounds, start=1):
        for label, median in (("socket", socket), ("accord", accord)):
            rows.append({"label": label, "round": i, "step_ms_median": median, "params_sha256": digest, "ranks_agree": True})
    return rows


def lines_by_target(rounds: list[str], ddp_rows: list[dict[str, object]]) -> dict[str, str]:
    parsed = [verdict.parse_summary(text) for text in rounds]
    return {line[:44].strip(): line for line in verdict.verdicts(parsed, ddp_rows, "accord")}


GOOD = {("g2", "socket"): (4.0, 9.0), ("g2", "accord"): (4.4, 24.0), ("mp", "socket"): (3.5, 8.5), ("mp", "accord"): (4.5, 19.0)}


def test_targets_met_in_every_round_are_met() -> None:
    got = lines_by_target([summary(GOOD), summary(GOOD)], ddp([(21.0, 13.0), (20.0, 13.5)]))
    assert all(line.endswith(" met") for line in got.values()), got
    assert "2.67 2.67" in got["g2 all_reduce 256M >= 2x Socket"]


def test_one_round_under_a_floor_fails_its_target_and_only_that_one() -> None:
    slow = dict(GOOD)
    slow[("mp", "accord")] = (4.5, 15.0)
    got = lines_by_target([summary(GOOD), summary(slow)], ddp([(21.0, 13.0)]))
    assert got["mp all_reduce 256M >= 2x Socket"].endswith("NOT met")
    assert got["g2 all_reduce 256M >= 2x Socket"].endswith(" met")
    assert got["mp all_reduce 1M >= Socket"].endswith(" met")


def test_a_missing_run_is_not_met() -> None:
    partial = {k: v for k, v in GOOD.items() if k != ("g2", "accord")}
    got = lines_by_target([summary(partial)], ddp([(21.0, 13.0)]))
    assert got["g2 all_reduce 256M >= 2x Socket"].endswith("NOT met")
    assert " - " in got["g2 all_reduce 1M >= Socket"] + " "


def test_wrong_values_or_a_failed_verification_fail_correctness() -> None:
    wrong = lines_by_target([summary(GOOD, wrong=3)], ddp([(21.0, 13.0)]))
    assert wrong["zero wrong values, every run verified"].endswith("NOT met")
    failed = lines_by_target([summary(GOOD, ok="12 FAILED")], ddp([(21.0, 13.0)]))
    assert failed["zero wrong values, every run verified"].endswith("NOT met")


def test_ddp_takes_the_median_of_round_ratios_and_checks_parameters() -> None:
    # Ratios 1.40, 1.60, 1.55: median 1.55 meets 1.5 though one round does not.
    got = lines_by_target([summary(GOOD)], ddp([(14.0, 10.0), (16.0, 10.0), (15.5, 10.0)]))
    line = got["DDP step >= 1.5x Socket, median of rounds"]
    assert "median 1.55" in line and line.endswith(" met")
    rows = ddp([(21.0, 13.0)])
    rows[1]["params_sha256"] = "other"
    assert lines_by_target([summary(GOOD)], rows)["DDP: same parameters in every run"].endswith("NOT met")
