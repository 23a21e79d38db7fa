"""A rank of the peer-death test, run as a script (`python liveness_roles.py`) with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set: rank 1 is killed (SIGKILL, by itself) between
two all_reduces; rank 0 prints, as one JSON line, the exception its second all_reduce raised
and how long after rank 1's death it came."""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np

import accord


def main() -> None:
    with accord.Communicator(timeout=60.0) as comm:
        x = np.ones(1 << 16, np.float32)
        comm.all_reduce(x)
        report = json.loads(comm.stuck_report())
        if comm.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.3)  # rank 1 is dead by now
        start = time.monotonic()
        try:
            comm.all_reduce(x)
            outcome = {"error": None}
        except accord.AccordError as e:
            outcome = {"error": type(e).__name__, "message": str(e)}
        outcome["seconds"] = time.monotonic() - start
        outcome["report_before"] = report
        print("@@" + json.dumps(outcome), flush=True)
        os._exit(0)  # no closing barrier with a dead peer


if __name__ == "__main__":
    main()
