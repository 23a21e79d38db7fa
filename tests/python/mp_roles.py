"""Process bodies of the multi-process tests (a module of its own so `spawn` can import it).

Each role talks to the test through a pipe: it sends its hello (address and descriptors),
receives the peer's, runs, and sends back a dict of what it observed. Exceptions are sent
back as strings so the test can show them.
"""

from __future__ import annotations

import traceback
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

import accord

SLICE = 256 * 1024
PAGE = 8192
PAGES = 12
SENDS = 5
IMM_WRITE, IMM_PAGED, IMM_BARRIER = 1, 2, 0xBB
WAIT_S = 30.0


def data(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def page_map() -> tuple[list[int], list[int]]:
    src = list(range(PAGES))
    dst = np.random.default_rng(5).permutation(PAGES).tolist()
    return src, dst


def receiver(conn: Connection) -> None:
    try:
        with accord.Engine(ignore_env=True) as engine:
            region_buf = np.zeros(SLICE + PAGES * PAGE, dtype=np.uint8)
            spare = np.zeros(4096, dtype=np.uint8)
            region = engine.register(region_buf)
            spare_region = engine.register(spare)
            engine.post_recvs(4096, SENDS)
            conn.send({"address": engine.address, "region": region.descriptor, "spare": spare_region.descriptor})
            peer = conn.recv()
            engine.add_peer(peer)
            engine.imm_counter(IMM_WRITE).wait(1, timeout=WAIT_S)
            engine.imm_counter(IMM_PAGED).wait(1, timeout=WAIT_S)
            messages = sorted(engine.recv(timeout=WAIT_S) for _ in range(SENDS))
            src_pages, dst_pages = page_map()
            pages_ok = all(
                np.array_equal(
                    region_buf[SLICE + d * PAGE : SLICE + (d + 1) * PAGE], data(2, PAGES * PAGE)[s * PAGE : (s + 1) * PAGE]
                )
                for s, d in zip(src_pages, dst_pages)
            )
            report: dict[str, Any] = {
                "write_ok": bool(np.array_equal(region_buf[:SLICE], data(1, SLICE))),
                "pages_ok": pages_ok,
                "messages": messages,
                "counts": (engine.imm_counter(IMM_WRITE).value, engine.imm_counter(IMM_PAGED).value),
            }
            spare_region.close()  # the sender's next write to it must be refused
            engine.barrier([peer.id], imm=IMM_BARRIER, timeout=WAIT_S)  # 1: spare is gone
            engine.barrier([peer.id], imm=IMM_BARRIER, timeout=WAIT_S)  # 2: sender is done
            report["counts_after"] = engine.imm_counter(IMM_WRITE).value
            region.close()
            conn.send(report)
            conn.recv()  # close only once the peer also left the last barrier
    except BaseException:
        conn.send({"error": traceback.format_exc()})


def sender(conn: Connection) -> None:
    try:
        with accord.Engine(ignore_env=True) as engine:
            conn.send({"address": engine.address})
            hello = conn.recv()
            engine.add_peer(hello["address"])
            with engine.register(data(1, SLICE)) as s1, engine.register(data(2, PAGES * PAGE)) as s2:
                writes = [engine.write(s1, hello["region"], imm=IMM_WRITE)]
                src_pages, dst_pages = page_map()
                writes.append(
                    engine.write_paged(
                        s2,
                        hello["region"],
                        page_nbytes=PAGE,
                        src_pages=src_pages,
                        dst_pages=[SLICE // PAGE + d for d in dst_pages],
                        imm=IMM_PAGED,
                    )
                )
                for i in range(SENDS):
                    writes.append(engine.send(hello["address"], f"message {i}".encode(), imm=100 + i))
                for t in writes:
                    t.wait(timeout=WAIT_S)
                report: dict[str, Any] = {}
                try:  # refused here, before anything is sent
                    engine.write(s1, hello["spare"])
                except accord.InvalidBufferError as e:
                    report["bounds_error"] = str(e)
                peer_id = hello["address"].id
                engine.barrier([peer_id], imm=IMM_BARRIER, timeout=WAIT_S)  # 1
                try:  # refused by the receiver: the region was deregistered
                    engine.write(s1, hello["spare"], 1024, imm=IMM_WRITE).wait(timeout=WAIT_S)
                except accord.RemoteAccessError as e:
                    report["remote_error"] = str(e)
                engine.barrier([peer_id], imm=IMM_BARRIER, timeout=WAIT_S)  # 2
            conn.send(report)
            conn.recv()  # close only once the peer also left the last barrier
    except BaseException:
        conn.send({"error": traceback.format_exc()})
