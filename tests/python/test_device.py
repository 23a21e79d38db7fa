"""accord.device on the host placement, two ranks in two processes (accord.run): puts and
signals land exactly once and byte for byte through a full ring, malformed descriptors become
errors and write nothing, bad arguments are refused, and the packaged header is the repo's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import accord
import accord.device as ad
import device_roles

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "crates" / "accord-device" / "include" / "accord" / "device.cuh"


def test_puts_and_signals_land_exactly_once_through_a_full_ring() -> None:
    results = accord.run(device_roles.puts_and_signals, 2, timeout=90)
    for out in results:
        assert "handed to an accord.device.DeviceComm" in str(out["handed_over"]), out
        closed, text = out["comm_state"]  # type: ignore[misc]
        assert closed is True and "handed over to a DeviceComm" in text, out
        # Exactly once: PUTS adds of 1 and one set of 7 from the one peer, no more.
        assert out["signals"] == (device_roles.PUTS, 7), out
        assert out["counter"] == device_roles.PUTS, out
        assert out["executed"] == device_roles.PUTS + 1, out
        assert out["bytes_put"] == device_roles.PUTS * device_roles.CHUNK + 8, out
        assert out["errors"] == [], out
        assert out["after_reset"] == 0, out
        assert "closed" in str(out["after_close"]), out
        assert "push: the device communicator is closed" in str(out["push_after_close"]), out
    # 40 pushes into 8 slots: some producer found the ring full and waited (never dropped).
    assert sum(int(out["ring_full_events"]) for out in results) > 0, results  # type: ignore[call-overload]


def test_malformed_descriptors_are_errors_and_write_nothing() -> None:
    sender, receiver = accord.run(device_roles.malformed, 2, timeout=90)
    errors = sender["errors"]
    assert isinstance(errors, list) and len(errors) == 12, errors
    expected = [
        "peer 2 is not a rank",
        "window 5 is not registered",
        "src_window 9 is not registered",
        "dst_offset 4086 + bytes 11 runs past window 0",
        f"dst_offset {2**64 - 3} + bytes 8",
        "src_offset 4096 + bytes 1 runs past src_window 1",
        "a Put of 0 bytes",
        "op 9 is not Put",
        "signal_op 7 is not",
        "signal_id 99 is not a signal",
        "counter_id 5 is not a counter",
        "a PutValue of 9 bytes",
    ]
    for message, want in zip(errors, expected):
        assert want in message and re.match(r"ring 0, ticket \d+: ", message), (message, want)
    assert sender["ring_error_word"] != 0 and sender["stats_errors"] == 12, sender
    # Only the good put's 16 bytes at offset 100 were written; its signal counted once.
    window = receiver["window"]
    assert isinstance(window, bytes)
    assert window[100:116] == b"\xee" * 16
    assert window[:100] == bytes(100) and window[116:] == bytes(len(window) - 116)
    assert receiver["signal"] == 1, receiver
    timeout = str(receiver["timeout"])
    assert "signal 1 reached 0, not 1" in timeout and "did not move during the wait: [0, 1]" in timeout, timeout
    for out in (sender, receiver):
        bad = out["bad_ids"]
        assert isinstance(bad, list) and len(bad) == 4, bad
        assert "signal 99" in bad[0] and "counter 2" in bad[1] and "ring 3" in bad[2], bad
        assert f"{2**62} bytes at offset 4092 run past window 0" in bad[3], bad
        assert "not C-contiguous" in str(out["strided"]), out


def test_arguments_refused_before_the_hand_over_leave_the_communicator_usable() -> None:
    for messages in accord.run(device_roles.refused_before_hand_over, 2, timeout=60):
        assert len(messages) == 6, messages
        assert "rings 0: give 1..=" in messages[0], messages
        assert "slot_count 12: give a power of two" in messages[1], messages
        assert "counters 0: give 1..=" in messages[2], messages
        assert "descriptors_per_turn 0: give 1..=" in messages[3], messages
        assert "cannot open GPU 4095" in messages[4] and "gpu=None" in messages[4], messages
        assert "a CUDA tensor (GPU 1) needs a DeviceComm built with gpu=1" in messages[5], messages


def test_the_packaged_header_is_the_repository_header() -> None:
    packaged = Path(ad.include_dir()) / "accord" / "device.cuh"
    if not HEADER.is_file():
        pytest.fail(f"run from the repository: {HEADER} is missing")
    assert packaged.read_bytes() == HEADER.read_bytes()
    version = re.search(rb"#define ACCORD_DEVICE_LAYOUT_VERSION (\d+)", packaged.read_bytes())
    assert version is not None and int(version.group(1)) == ad.DEVICE_LAYOUT_VERSION


def test_the_torch_example_says_what_is_missing_without_cuda() -> None:
    # CUDA_VISIBLE_DEVICES="" hides every GPU, so this holds on a GPU host too.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "device_api" / "torch_ring_shift.py")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "torch_ring_shift: needs" in run.stderr and ("torch" in run.stderr or "CUDA" in run.stderr), run.stderr


def test_a_torch_cpu_tensor_is_a_window() -> None:
    pytest.importorskip("torch")
    (_, kind0, _), (value, kind1, signal) = accord.run(device_roles.torch_cpu_window, 2, timeout=90)
    assert (kind0, kind1) == ("host", "host")
    assert value == 0xA5A5 and signal == 1
