"""``accord.run``: a job of local processes, for notebooks and tests.

Each rank is a fresh process (multiprocessing's spawn context) whose environment carries the
torchrun variables, so ``accord.Communicator()`` there joins the job with no arguments.

The parent owns its ranks as ``accord run`` does: SIGINT, SIGTERM or SIGHUP to it is passed on
to every rank, which gets ``TERMINATE_GRACE_S`` to exit before SIGKILL; on Linux each rank
asks the kernel for SIGKILL when the parent dies (PR_SET_PDEATHSIG), so even a parent killed
outright leaves no rank behind.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import queue
import random
import secrets
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from accord.errors import AccordError

__all__ = ["run"]

T = TypeVar("T")

#: Ports tried for the rendezvous store (MASTER_PORT), chosen at random in this range.
PORT_RANGE = range(20000, 30000)
#: Ports tried before giving up on finding a free one.
PORT_TRIES_MAX = 64
#: How long a rank that exited cleanly may take to deliver its result.
RESULT_GRACE_S = 5.0
#: How often the parent looks at its children while waiting.
POLL_S = 0.05
#: How long ranks get to exit after a signal was passed on to them (or after SIGTERM when a
#: sibling failed), before SIGKILL; the same grace as ``accord run``'s.
TERMINATE_GRACE_S = 3.0
#: Signals the parent passes on to its ranks.
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: prctl(2) option: the signal a process gets when its parent dies.
_PR_SET_PDEATHSIG = 1


class _Stop(BaseException):
    """Raised out of the parent's wait by a signal that is passed on to the ranks."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"accord.run: got signal {signum}")
        self.signum = signum


def _die_with_parent(parent: int) -> None:
    """Asks the kernel for SIGKILL when the parent dies; exits at once if it already has."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _free_port() -> int:
    for _ in range(PORT_TRIES_MAX):
        port = random.choice(PORT_RANGE)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise AccordError(
        f"accord.run: no free port found in {PORT_RANGE.start}..{PORT_RANGE.stop} after {PORT_TRIES_MAX} tries"
    )


def _child(
    rank: int, env: dict[str, str], results: Any, fn: Callable[..., Any], args: tuple[Any, ...], parent: int
) -> None:
    _die_with_parent(parent)
    os.environ.update(env)
    try:
        value = fn(*args)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, then re-raised
        results.put((rank, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        raise SystemExit(1) from e
    try:
        results.put((rank, True, value))
    except Exception as e:  # noqa: BLE001 - e.g. a return value that does not pickle
        results.put((rank, False, f"its return value could not be sent back: {type(e).__name__}: {e}"))
        raise SystemExit(1) from e


def run(fn: Callable[..., T], nprocs: int, *args: Any, timeout: float | None = None) -> list[T]:
    """Runs ``fn(*args)`` in ``nprocs`` new processes, one per rank, and returns their return
    values by rank.

    Each process has ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
    ``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT`` (20000..30000) and a job secret
    ``ACCORD_JOB_SECRET`` (the caller's, else a fresh one: only the job's ranks may connect to
    each other and to its bootstrap store) set, so ``accord.Communicator()`` joins the job.
    ``fn``, ``args`` and the return values must pickle (``fn`` defined at module level,
    importable by the children).

    If a rank raises or exits non-zero, the others are terminated and ``AccordError`` names
    the failed rank(s) with their errors; likewise after ``timeout`` seconds (naming the ranks
    still running). The caller's environment is left alone.
    """
    if nprocs < 1:
        raise ValueError(f"accord.run: nprocs must be at least 1, got {nprocs}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"accord.run: timeout must be seconds > 0 or None, got {timeout}")
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    # The job's secret, which every rank's engine proves in its handshakes.
    job_secret = os.environ.get("ACCORD_JOB_SECRET") or secrets.token_hex(32)
    procs: list[Any] = []
    values: dict[int, Any] = {}
    failures: dict[int, str] = {}
    exited_at: dict[int, float] = {}
    deadline = None if timeout is None else time.monotonic() + timeout
    guard = _SignalGuard(procs)
    stop: BaseException | None = None
    try:
        for rank in range(nprocs):
            env = {
                "RANK": str(rank),
                "WORLD_SIZE": str(nprocs),
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(nprocs),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "ACCORD_JOB_SECRET": job_secret,
            }
            proc = ctx.Process(
                target=_child, args=(rank, env, results, fn, args, os.getpid()), name=f"accord-rank-{rank}"
            )
            try:
                proc.start()
            except OSError as e:
                raise AccordError(
                    f"accord.run: could not start rank {rank} of {nprocs}: {e}; the ranks already started "
                    "were stopped"
                ) from e
            finally:
                # A signal can interrupt start() after the child exists (the guard raises in the
                # middle of it): a rank with a pid is stopped and reaped with the others, not left
                # to die on its own when this parent exits.
                if proc.pid is not None:
                    procs.append(proc)
        while len(values) < nprocs and not failures:
            try:
                rank, ok, value = results.get(timeout=POLL_S)
            except queue.Empty:
                pass
            else:
                if ok:
                    values[rank] = value
                else:
                    failures[rank] = value
                continue
            now = time.monotonic()
            for rank, proc in enumerate(procs):
                if rank in values or rank in failures or proc.exitcode is None:
                    continue
                if proc.exitcode != 0:
                    # Its own report (if any) may still be in the queue: give it a moment.
                    exited_at.setdefault(rank, now)
                    if now - exited_at[rank] > 0.5:
                        failures[rank] = f"exited with code {proc.exitcode} without reporting an error"
                else:
                    exited_at.setdefault(rank, now)
                    if now - exited_at[rank] > RESULT_GRACE_S:
                        failures[rank] = "exited cleanly but its result never arrived"
            if deadline is not None and now > deadline and not failures:
                running = [r for r in range(nprocs) if r not in values]
                raise AccordError(f"accord.run: timed out after {timeout} s; rank(s) {running} still running")
        # Collect other failures that arrive at once (several ranks failing together).
        if failures:
            time.sleep(POLL_S)
            while True:
                try:
                    rank, ok, value = results.get_nowait()
                except queue.Empty:
                    break
                if not ok:
                    failures.setdefault(rank, value)
    except BaseException as e:
        stop = e
        raise
    finally:
        guard.stopping = True
        if stop is not None or failures or len(values) < nprocs:
            signum: int = signal.SIGTERM
            if isinstance(stop, _Stop):
                signum = stop.signum
            elif isinstance(stop, KeyboardInterrupt):
                signum = signal.SIGINT
            _stop_ranks(procs, signum)
        for proc in procs:
            proc.join(timeout=RESULT_GRACE_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        results.close()
        guard.restore()
        if isinstance(stop, _Stop):
            guard.redeliver(stop.signum)
    if failures:
        ranks = sorted(failures)
        details = "\n".join(f"--- rank {r}: {failures[r]}" for r in ranks)
        raise AccordError(f"accord.run: rank(s) {ranks} failed\n{details}")
    return [values[r] for r in range(nprocs)]


def _stop_ranks(procs: list[Any], signum: int) -> None:
    """Passes ``signum`` on to every rank still running, waits up to the grace period, then
    kills those left; returns once every rank exited."""
    for proc in procs:
        if proc.is_alive():
            try:
                os.kill(proc.pid, signum)
            except ProcessLookupError:
                pass
    end = time.monotonic() + TERMINATE_GRACE_S
    for proc in procs:
        proc.join(timeout=max(0.0, end - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
        proc.join()


class _SignalGuard:
    """While ``run`` waits (main thread only: Python takes signals there), SIGTERM and SIGHUP
    left at their default raise ``_Stop`` so the ranks are stopped before the parent goes;
    SIGINT raises ``KeyboardInterrupt`` as usual. Once stopping, any of the three kills the
    ranks at once instead of interrupting the clean-up."""

    def __init__(self, procs: list[Any]) -> None:
        self.procs = procs
        self.stopping = False
        self.saved: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in FORWARDED_SIGNALS:
            current = signal.getsignal(signum)
            if current in (signal.SIG_DFL, signal.default_int_handler):
                self.saved[signum] = current
                signal.signal(signum, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.stopping:
            for proc in self.procs:
                if proc.is_alive():
                    proc.kill()
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise _Stop(signum)

    def restore(self) -> None:
        for signum, handler in self.saved.items():
            signal.signal(signum, handler)
        self.saved = {}

    @staticmethod
    def redeliver(signum: int) -> None:
        """The signal's own effect, now that the ranks are gone: default handling ends the
        process with that signal."""
        os.kill(os.getpid(), signum)
        # Not reached with the default action; a handler installed meanwhile returns here.
        raise SystemExit(128 + signum)
