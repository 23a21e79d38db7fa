"""The engine's events reach Python's ``logging`` (logger ``accord``), filtered by level; a
full table of immediate counters is an error the receiver sees, and counters can be released."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

import accord

#: How long a record may take to cross from the engine's forwarder thread.
DELIVERY_S = 10.0


def records_matching(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    deadline = time.monotonic() + DELIVERY_S
    while True:
        found = [r for r in caplog.records if r.name == "accord" and text in r.getMessage()]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def test_an_engine_warning_arrives_through_logging(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A malformed launcher variable: the engine warns that it ignores it.
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "banana-warning")
    caplog.set_level(logging.WARNING, logger="accord")
    accord.set_log_level(logging.WARNING)
    with accord.Engine():
        pass
    found = records_matching(caplog, "banana-warning")
    assert found, [r.getMessage() for r in caplog.records]
    assert found[0].levelno == logging.WARNING
    assert "not a rank count" in found[0].getMessage()


def test_events_below_the_level_stay_out(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "banana-filtered")
    caplog.set_level(logging.DEBUG, logger="accord")
    accord.set_log_level(logging.ERROR)
    try:
        with accord.Engine():
            pass
        # A later, enabled event proves the forwarder ran past where the warning would be.
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "banana-after")
        accord.set_log_level(logging.WARNING)
        with accord.Engine():
            pass
        assert records_matching(caplog, "banana-after")
        assert not [r for r in caplog.records if "banana-filtered" in r.getMessage()]
    finally:
        accord.set_log_level(logging.WARNING)


def test_release_imm_and_the_overflow_poll() -> None:
    with accord.Engine(force_network=True) as a, accord.Engine(force_network=True) as b:
        a.add_peer(b.address)
        src, dst = np.ones(64, np.uint8), np.zeros(64, np.uint8)
        with a.register(src) as s, b.register(dst) as d:
            a.write(s, d.descriptor, imm=3).wait(timeout=10)
            assert b.imm_counter(3).wait(1, timeout=10) == 1
            assert b.release_imm(3) == 1
            assert b.release_imm(3) is None
            assert b.imm_overflows() == []
            assert b.imm_counter(3).lost == 0


def test_overflow_is_raised_at_the_receiver(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="accord")
    with accord.Engine(force_network=True) as a, accord.Engine(force_network=True) as b:
        a.add_peer(b.address)
        for imm in range(1 << 16):  # fill the receiver's table of counters
            b.imm_counter(imm)
        late = 1 << 30
        counter = b.imm_counter(late)
        src, dst = np.ones(64, np.uint8), np.zeros(64, np.uint8)
        with a.register(src) as s, b.register(dst) as d:
            a.write(s, d.descriptor, imm=late).wait(timeout=10)  # completes at the sender
            with pytest.raises(accord.AccordError, match="not counted"):
                counter.wait(1, timeout=10)
            assert counter.lost == 1
            assert b.imm_overflows() == [(late, 1)]
        assert records_matching(caplog, "immediate counter table full")
