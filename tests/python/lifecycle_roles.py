"""Rank bodies and the parent script of the lifecycle tests (a module of its own so `spawn`
can import it)."""

from __future__ import annotations

import signal
import sys
import time

import accord

#: Longer than any test waits: a rank still sleeping at the end was left behind.
SLEEP_S = 120.0


def sleep() -> None:
    time.sleep(SLEEP_S)


def ignore_stop_signals_and_sleep() -> None:
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    time.sleep(SLEEP_S)


if __name__ == "__main__":
    # The parent: `python lifecycle_roles.py BODY NPROCS` runs BODY in NPROCS ranks.
    body = {"sleep": sleep, "ignore": ignore_stop_signals_and_sleep}[sys.argv[1]]
    accord.run(body, int(sys.argv[2]))
