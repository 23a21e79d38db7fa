"""The prefill process of test_kv.py's two-process tests (a module of its own so `spawn` can
import it): the roles of examples/kv_gpu_bench.py's ``network`` case on host memory."""

from __future__ import annotations

import time
import traceback
from multiprocessing.connection import Connection

import numpy as np

import accord
from accord.kv import KvLayout, PrefillCache

WAIT_S = 60.0


def kv_cache(layout: KvLayout, num_blocks: int, seed: int) -> np.ndarray:
    """A cache of the layout's shape (its 2-byte elements as uint16) filled from ``seed``."""
    return np.random.default_rng(seed).integers(0, 2**16, layout.shape(num_blocks), dtype=np.uint16)


def kv_prefill(conn: Connection, layout_args: tuple[int, int, int, int], num_blocks: int) -> None:
    """Registers a filled cache and says its source; adds the decode engine it is told; then
    pushes the blocks each order names (bounded: the push's own timeout, then ``WAIT_S``) and
    answers how it went, serving the decode engine's pulls meanwhile, until told to exit."""
    try:
        layout = KvLayout(*layout_args, dtype="bfloat16")
        with accord.Engine() as engine:
            prefill = PrefillCache(engine, layout, num_blocks, cache=kv_cache(layout, num_blocks, 3))
            conn.send({"source": prefill.source})
            target, decode_address = conn.recv()
            engine.add_peer(decode_address)
            while True:
                order = conn.recv()
                if order == "exit":
                    break
                src, dst, imm = order
                started = time.monotonic()
                push = prefill.push(target, src, dst, request="from-prefill", imm=imm, timeout=WAIT_S)
                try:
                    push.wait(timeout=2 * WAIT_S)
                    conn.send({"pushed": time.monotonic() - started})
                except accord.AccordError as e:
                    conn.send({"error": f"{type(e).__name__}: {e}", "in_flight": push.parts_in_flight})
            prefill.close()
    except Exception:  # noqa: BLE001 - reported to the test
        conn.send({"error": traceback.format_exc()})
