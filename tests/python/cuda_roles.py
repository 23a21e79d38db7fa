"""Process body of the CUDA tensor test across processes (a module of its own so `spawn` can
import it): registers a CUDA tensor, hands its descriptor to the test, waits for the write's
immediate and reports whether the tensor holds what the writer sent."""

from __future__ import annotations

import traceback
from multiprocessing.connection import Connection

import accord

IMM = 21
WAIT_S = 30.0


def cuda_receiver(conn: Connection, device: int, count: int) -> None:
    try:
        import torch

        with accord.Engine(ignore_env=True) as engine:
            dst = torch.zeros(count, dtype=torch.float32, device=f"cuda:{device}")
            region = engine.register(dst)
            conn.send({"address": engine.address, "region": region.descriptor})
            engine.add_peer(conn.recv())
            engine.imm_counter(IMM).wait(1, timeout=WAIT_S)
            torch.cuda.synchronize(device)
            want = torch.arange(count, dtype=torch.float32, device=f"cuda:{device}")
            conn.send({"ok": bool(torch.equal(dst, want))})
            conn.recv()  # the writer is done with our region: release it
            region.close()
    except Exception:  # noqa: BLE001 - reported to the test
        conn.send({"error": traceback.format_exc()})
