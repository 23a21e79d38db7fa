"""A rank killed between two collectives: the survivor's next collective raises PeerError
naming the dead rank and the operation, well within the communicator timeout (the engine sees
the process exit through a pidfd), instead of hanging. Ranks are plain subprocesses here:
accord.run would end the survivor as soon as the other rank died."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROLE = Path(__file__).with_name("liveness_roles.py")


def test_a_killed_rank_is_named_by_the_survivor() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, str(ROLE)], env=env, stdout=subprocess.PIPE, text=True))
    try:
        out, _ = procs[0].communicate(timeout=90)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    lines = [line[2:] for line in out.splitlines() if line.startswith("@@")]
    assert lines, f"rank 0 reported nothing: {out}"
    outcome = json.loads(lines[-1])
    assert outcome["error"] == "PeerError", outcome
    assert "rank 1 is dead" in outcome["message"] and "all_reduce" in outcome["message"], outcome
    # The survivor's report before the death: no collective in progress, the first completed.
    assert outcome["report_before"]["op"] is None
    assert outcome["report_before"]["last_completed"]["collective"] == "all_reduce"
    print(f"survivor raised after {outcome['seconds']:.3f} s: {outcome['message']}")
