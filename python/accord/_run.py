"""``accord.run``: a job of local processes, for notebooks and tests.

Each rank is a fresh process (multiprocessing's spawn context) whose environment carries the
torchrun variables, so ``accord.Communicator()`` there joins the job with no arguments.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import random
import secrets
import socket
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
    rank: int, env: dict[str, str], results: Any, fn: Callable[..., Any], args: tuple[Any, ...]
) -> None:
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
    job_secret = os.environ.get("ACCORD_JOB_SECRET") or secrets.token_hex(32)
    procs = []
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
        proc = ctx.Process(target=_child, args=(rank, env, results, fn, args), name=f"accord-rank-{rank}")
        proc.start()
        procs.append(proc)

    values: dict[int, Any] = {}
    failures: dict[int, str] = {}
    exited_at: dict[int, float] = {}
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
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
    finally:
        if failures or len(values) < nprocs:
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
        for proc in procs:
            proc.join(timeout=RESULT_GRACE_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        results.close()
    if failures:
        ranks = sorted(failures)
        details = "\n".join(f"--- rank {r}: {failures[r]}" for r in ranks)
        raise AccordError(f"accord.run: rank(s) {ranks} failed\n{details}")
    return [values[r] for r in range(nprocs)]
