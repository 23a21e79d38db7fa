"""What the multi-process examples share: ending their processes and printing the verdict.

Not an example itself; `kv_cache_transfer.py` and `weight_push.py` import it from beside them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from multiprocessing.process import BaseProcess


def finish(procs: Sequence[BaseProcess], bad: int, wait_s: float, summary: str, bad_unit: str, verified: str) -> int:
    """Joins `procs`, killing any still running after `wait_s` (a stuck one would otherwise hold
    the interpreter at exit, which joins its children), prints `summary`, then the verdict: 1
    when `bad` (the mismatches the processes reported, -1 when none reported) is not 0 or a
    process failed, else 0 and `verified`."""
    for p in procs:
        p.join(wait_s)
        if p.is_alive():
            p.kill()
            p.join(wait_s)
    codes = [p.exitcode for p in procs]
    print(summary)
    if bad != 0 or any(c != 0 for c in codes):
        print(f"FAILED: {bad} {bad_unit}, exit codes {codes}", file=sys.stderr)
        return 1
    print(verified)
    return 0
