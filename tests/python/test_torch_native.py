"""accord.torch's compiled backend (accord._torch_native): it builds against the torch that
imports it, runs synchronous CPU all_reduce, all_gather_into_tensor, reduce_scatter_tensor and
all_to_all_single of registered tensors without Python with Gloo's results, keeps call order with the Python backend's queued and deferred ops, and is left out
when ACCORD_TORCH_NATIVE=0. Skipped where torch is not installed; the CUDA path runs on the
device (scripts/device/torch_native.sh)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

import accord  # noqa: E402
import torch_native_roles  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    """Builds the backend once for this module (about 15 s on a 2-core machine), so a rank
    does not spend its rendezvous time compiling; skips where it cannot build here."""
    from accord import _torch_native

    if _torch_native.mode() == "0":
        pytest.skip("ACCORD_TORCH_NATIVE=0")
    try:
        _torch_native._built()
    except _torch_native.NativeBuildError as e:
        if _torch_native.mode() == "1":
            raise
        pytest.skip(f"the compiled backend does not build here: {e}")


def test_host_all_reduce_runs_compiled_with_gloos_results() -> None:
    results = accord.run(torch_native_roles.host_all_reduce_matches_gloo, 2, timeout=240)
    for r in results:
        assert r["compared"] == 2 * r["calls"] and r["calls"] >= 28, r
        # Every second call of each (dtype, op) ran compiled; the first registered the tensor.
        assert r["native"] == r["calls"], r


def test_host_tensor_ops_run_compiled_with_gloos_results() -> None:
    results = accord.run(torch_native_roles.host_tensor_ops_match_gloo, 3, timeout=240)
    for r in results:
        assert r["compared"] == 2 * r["calls"] and r["calls"] >= 60, r
        # Every second call of each case ran compiled; the first registered the tensors.
        assert r["native"] == r["calls"], r
        assert r["refused"] == 3, r
        assert r["half_registered"] == [True, True], r
        # Ranks 0 and 2 gathered 4 elements, rank 1 five: every rank's compiled call raised.
        assert "compiled=True" in r["mismatch"] and "rank" in r["mismatch"], r["mismatch"]


def test_compiled_ops_keep_order_with_python_ops() -> None:
    results = accord.run(torch_native_roles.order_with_python_ops, 3, timeout=240)
    for r in results:
        assert r["native"] > 50, r


def test_a_compiled_call_names_the_rank_it_waited_for() -> None:
    outcomes = accord.run(torch_native_roles.compiled_call_names_the_missing_rank, 2, timeout=120)
    assert outcomes[1] == "slept"
    assert outcomes[0].startswith(("TimeoutError", "PeerError")) and "rank(s) [1]" in outcomes[0], outcomes[0]


def _probe(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = "from accord import _torch_native as n; m = n.load(); print('loaded' if m else 'off')"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_the_knob_turns_it_off_and_refuses_bad_values() -> None:
    env = dict(os.environ, ACCORD_TORCH_NATIVE="0")
    assert _probe(env).stdout.strip() == "off"
    env["ACCORD_TORCH_NATIVE"] = "1"
    assert _probe(env).stdout.strip() == "loaded"
    env["ACCORD_TORCH_NATIVE"] = "yes"
    bad = _probe(env)
    assert bad.returncode != 0 and "ACCORD_TORCH_NATIVE='yes' is not valid" in bad.stderr


def test_a_build_that_fails_is_reported_and_left_out(tmp_path: object) -> None:
    """A compiler that fails: auto warns and the Python backend runs every op; 1 raises."""
    env = dict(os.environ, CXX="false", ACCORD_TORCH_NATIVE_CACHE=str(tmp_path), ACCORD_TORCH_NATIVE="auto")
    code = (
        "import warnings\n"
        "from accord import _torch_native as n\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    m = n.load()\n"
        "print('off' if m is None else 'loaded', any('did not build' in str(x.message) for x in w))\n"
    )
    auto = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert auto.stdout.split() == ["off", "True"], auto
    env["ACCORD_TORCH_NATIVE"] = "1"
    required = _probe(env)
    assert required.returncode != 0 and "NativeBuildError" in required.stderr, required


def test_it_can_be_built_ahead_of_time() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "accord._torch_native"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "accord_torch_native-" in done.stdout, done


def test_a_build_past_its_time_stops_the_compiler_and_what_it_started(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiler that hangs, and has started a process of its own (as the driver starts the
    compiler proper): the build fails after its time, and neither process is left behind."""
    import pathlib
    import time

    from accord import _torch_native

    base = pathlib.Path(str(tmp_path))
    child_pid = base / "child.pid"
    cxx = base / "hanging-cxx"
    cxx.write_text(f"#!/bin/sh\nsleep 600 &\necho $! > {child_pid}\nsleep 600\n")
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.setattr(_torch_native, "_BUILD_WAIT_S", 2.0)
    with pytest.raises(_torch_native.NativeBuildError, match="ran past 2 s and was stopped"):
        _torch_native._build(base / "never.so")
    pid = int(child_pid.read_text())
    # Killed with the group; reaped by init (or a zombie for a moment): gone or a zombie.
    for _ in range(100):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the compiler's child {pid} still runs")
    assert not list(base.glob("*.partial.so"))
