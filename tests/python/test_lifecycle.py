"""Process lifecycle and bounds of the Python API: ``accord.run`` passes SIGINT, SIGTERM and
SIGHUP on to its ranks and leaves none behind (also when killed outright); blocking calls on a
closed engine raise ``ShutdownError`` at once; ``Engine.alloc`` refuses sizes past the limit
with a message.

Ranks are found in /proc by a marker variable in their environment, unique per test. Every
wait is bounded; a wait that missed a shutdown ends at its (long) timeout with another error,
so the tests fail on the error type, never on a clock.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import accord
from accord import _run

MARKER_VAR = "ACCORD_PY_LIFECYCLE_TEST"
HERE = Path(__file__).resolve().parent
#: Far longer than anything here needs when it works.
PATIENCE_S = 60.0

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def marked(marker: str, ranks_only: bool) -> list[int]:
    """Live processes carrying ``marker``; with ``ranks_only``, only accord.run's ranks
    (multiprocessing's spawned children), not the parent or its resource tracker."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0") and (not ranks_only or b"spawn_main" in cmdline):
            found.append(int(entry))
    return found


GONE_S = 3.0


def eventually(done: Callable[[], bool], limit_s: float = PATIENCE_S) -> bool:
    end = time.monotonic() + limit_s
    while not done():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def gone_soon(marker: str) -> bool:
    """No rank carrying ``marker`` is left within ``GONE_S`` of its parent's exit. The parent
    reaps every rank it started; the bound covers a rank whose start the signal interrupted
    before the parent held its pid, which the kernel kills (PR_SET_PDEATHSIG) or which exits on
    its own once its parent's pipe closes, a moment after the parent."""
    return eventually(lambda: marked(marker, True) == [], GONE_S)


@pytest.fixture
def job() -> Iterator[Callable[[str, int], tuple[subprocess.Popen[bytes], str]]]:
    """Starts ``lifecycle_roles.py BODY N`` as a parent with a fresh marker, once its N ranks
    run; kills whatever still carries the marker afterwards."""
    markers: list[str] = []

    def start(body: str, nprocs: int) -> tuple[subprocess.Popen[bytes], str]:
        marker = uuid.uuid4().hex
        markers.append(marker)
        env = dict(os.environ, **{MARKER_VAR: marker})
        parent = subprocess.Popen(
            [sys.executable, str(HERE / "lifecycle_roles.py"), body, str(nprocs)],
            env=env,
            cwd=HERE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        assert eventually(lambda: len(marked(marker, True)) >= nprocs), "the ranks never started"
        return parent, marker

    yield start
    for marker in markers:
        for pid in marked(marker, False):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@linux_only
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_run_passes_a_signal_on_and_leaves_no_rank(job: Any, signum: int) -> None:
    parent, marker = job("sleep", 2)
    parent.send_signal(signum)
    parent.wait(timeout=PATIENCE_S)
    stderr = parent.stderr.read().decode() if parent.stderr else ""
    # The parent ends as the signal's default action would have ended it, after its ranks.
    assert parent.returncode == -signum, stderr
    assert gone_soon(marker), "ranks outlived accord.run"


@linux_only
def test_run_kills_ranks_that_ignore_the_signal_after_the_grace_period(job: Any) -> None:
    parent, marker = job("ignore", 2)
    parent.send_signal(signal.SIGTERM)
    parent.wait(timeout=PATIENCE_S)
    assert parent.returncode == -signal.SIGTERM
    assert gone_soon(marker), marked(marker, True)


@linux_only
def test_a_killed_parent_takes_its_ranks_with_it(job: Any) -> None:
    parent, marker = job("sleep", 2)
    parent.kill()
    parent.wait(timeout=PATIENCE_S)
    gone = eventually(lambda: marked(marker, True) == [], _run.TERMINATE_GRACE_S + 10)
    assert gone, f"ranks {marked(marker, True)} outlived a killed accord.run"


def test_a_rank_that_cannot_start_stops_those_started(monkeypatch: pytest.MonkeyPatch) -> None:
    # The second start fails as fork does under a process limit (EAGAIN); the first rank,
    # already sleeping, must be stopped before run raises.
    import errno
    import multiprocessing

    import lifecycle_roles

    spawn = multiprocessing.get_context("spawn").Process
    real_start = spawn.start
    starts = []

    def start(self: Any) -> None:
        starts.append(self)
        if len(starts) == 2:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        real_start(self)

    monkeypatch.setattr(spawn, "start", start)
    with pytest.raises(accord.AccordError, match=r"could not start rank 1 of 3: .*already started were stopped"):
        accord.run(lifecycle_roles.sleep, 3)
    assert starts[0].exitcode is not None, "rank 0 outlived the failed launch"
    assert multiprocessing.active_children() == []


# Closed engines: every blocking call raises ShutdownError at once.


def test_recv_on_a_closed_engine_raises_shutdown() -> None:
    e = accord.Engine(ignore_env=True)
    e.post_recvs(64, 4)
    e.close()
    with pytest.raises(accord.ShutdownError, match="recv: the engine is closed"):
        e.recv()
    with pytest.raises(accord.ShutdownError):
        e.recv(timeout=PATIENCE_S)


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[BaseException | Any], threading.Event]:
    """Runs ``call`` on a thread; its outcome lands in the list. The event is set just before
    the call starts."""
    outcome: list[BaseException | Any] = []
    started = threading.Event()

    def body() -> None:
        started.set()
        try:
            outcome.append(call())
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            outcome.append(e)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, outcome, started


def test_a_recv_in_progress_raises_shutdown_when_the_engine_closes() -> None:
    e = accord.Engine(ignore_env=True)
    e.post_recvs(64, 4)
    t, outcome, started = in_thread(lambda: e.recv(timeout=PATIENCE_S))
    started.wait()
    e.close()
    t.join(PATIENCE_S)
    assert len(outcome) == 1 and isinstance(outcome[0], accord.ShutdownError), outcome


def test_counter_waits_on_a_closed_engine_raise_shutdown() -> None:
    e = accord.Engine(ignore_env=True)
    counter = e.imm_counter(5)
    e.close()
    with pytest.raises(accord.ShutdownError, match="ImmCounter.wait: the engine is closed"):
        counter.wait(1)
    with pytest.raises(accord.ShutdownError):
        counter.wait(1, timeout=PATIENCE_S)
    assert counter.wait(0) == 0, "a target already reached is no error"


def test_a_counter_wait_in_progress_raises_shutdown_when_the_engine_closes() -> None:
    e = accord.Engine(ignore_env=True)
    counter = e.imm_counter(6)
    t, outcome, started = in_thread(lambda: counter.wait(1, timeout=PATIENCE_S))
    started.wait()
    e.close()
    t.join(PATIENCE_S)
    assert len(outcome) == 1 and isinstance(outcome[0], accord.ShutdownError), outcome


def test_a_pending_transfer_raises_shutdown_when_its_engine_closes() -> None:
    # The peer is gone before the write, and the connection would wait long for it: only the
    # close can end the transfer.
    a = accord.Engine(ignore_env=True, force_network=True, idle_timeout=PATIENCE_S * 10)
    b = accord.Engine(ignore_env=True, force_network=True)
    with a.alloc(4096) as src:
        dst = b.alloc(4096)
        a.add_peer(b.address)
        descriptor = dst.descriptor
        b.close()
        transfer = a.write(src, descriptor)
        a.close()
        with pytest.raises(accord.ShutdownError):
            transfer.wait(timeout=PATIENCE_S)


# Sizes past the limits.


def test_alloc_past_the_region_limit_is_refused_with_a_message() -> None:
    with accord.Engine(ignore_env=True) as e:
        with pytest.raises(accord.InvalidBufferError, match=r"alloc\(1099511627777\): a region holds 1\.\.=1099511627776"):
            e.alloc(2**40 + 1)
        with pytest.raises(accord.InvalidBufferError, match="a region holds"):
            e.alloc(0)


@linux_only
def test_alloc_beyond_memory_raises_memory_error_with_a_message() -> None:
    # Under a 4 GiB address-space limit an 8 GiB region cannot be had: a child process, so
    # the limit binds nothing else.
    code = (
        "import resource, accord\n"
        "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
        "e = accord.Engine(ignore_env=True)\n"
        "try:\n"
        "    e.alloc(8 << 30)\n"
        "except MemoryError as err:\n"
        "    print('MemoryError:', err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=PATIENCE_S)
    assert "MemoryError: alloc(8589934592): could not allocate 8589934592 bytes" in out.stdout, out.stderr
