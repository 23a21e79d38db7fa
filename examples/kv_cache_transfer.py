"""KV-cache move between a "prefill" and a "decode" process, completed by an immediate counter.

The decode process owns a paged KV cache (a pool of fixed-size pages, as in paged attention)
and hands the prefill process its engine address, the pool's descriptor and the pages it
allotted to each request. Prefill computes each request's KV pages (here: a deterministic
pattern) layer by layer in its own pool and pushes every layer with one paged write carrying
the request's immediate. Decode knows a request is complete when that immediate's counter
reaches the number of layers, then checks every byte. Exits non-zero on any mismatch.

    python examples/kv_cache_transfer.py [--requests 4] [--layers 8]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
from multiprocessing.connection import Connection

import numpy as np

import accord
from _processes import finish

PAGE_TOKENS = 16
HEAD_BYTES = 256  # bytes of K and V per token in one layer (tiny model)
PAGE_NBYTES = PAGE_TOKENS * HEAD_BYTES
POOL_PAGES = 256
IMM_BASE = 1000  # request r completes immediate IMM_BASE + r
WAIT_S = 30.0


def kv_bytes(request: int, layer: int, page: int) -> np.ndarray:
    """What prefill computes for one page of one layer of one request (deterministic)."""
    seed = (request * 7919 + layer * 104729 + page * 1299709) & 0xFFFFFFFF
    return np.random.default_rng(seed).integers(0, 256, PAGE_NBYTES, dtype=np.uint8)


def plan(requests: int) -> dict[int, list[int]]:
    """Decode's allotment: request -> its pages in decode's pool (shuffled, non-contiguous)."""
    pages = np.random.default_rng(42).permutation(POOL_PAGES).tolist()
    per_request = [3 + r % 4 for r in range(requests)]  # 3..6 pages each
    allotment, at = {}, 0
    for r, n in enumerate(per_request):
        allotment[r] = pages[at : at + n]
        at += n
    return allotment


def decode(conn: Connection, requests: int, layers: int) -> None:
    with accord.Engine() as engine:
        pool = np.zeros((layers, POOL_PAGES, PAGE_NBYTES), dtype=np.uint8)
        with engine.register(pool) as region:
            allotment = plan(requests)
            conn.send((engine.address, region.descriptor, allotment))
            counters = {r: engine.imm_counter(IMM_BASE + r) for r in range(requests)}
            bad = 0
            for r, pages in allotment.items():
                counters[r].wait(layers, timeout=WAIT_S)  # every layer of request r landed
                for layer in range(layers):
                    for i, page in enumerate(pages):
                        if not np.array_equal(pool[layer, page], kv_bytes(r, layer, i)):
                            bad += 1
            conn.send(bad)
            conn.recv()  # prefill is done with us


def prefill(conn: Connection, requests: int, layers: int) -> None:
    with accord.Engine() as engine:
        peer, pool_descriptor, allotment = conn.recv()
        engine.add_peer(peer)
        # Prefill's own pool: request r's pages are contiguous here, at 8 pages per request.
        local = np.zeros((layers, requests * 8, PAGE_NBYTES), dtype=np.uint8)
        with engine.register(local) as region:
            transfers = []
            for r, pages in allotment.items():
                for layer in range(layers):
                    base = layer * local.shape[1] + r * 8  # page index in the flat pool
                    for i in range(len(pages)):
                        local[layer, r * 8 + i] = kv_bytes(r, layer, i)  # "compute" the layer
                    dst_pages = [layer * POOL_PAGES + p for p in pages]
                    transfers.append(
                        engine.write_paged(
                            region,
                            pool_descriptor,
                            page_nbytes=PAGE_NBYTES,
                            src_pages=np.arange(base, base + len(pages)),
                            dst_pages=dst_pages,
                            imm=IMM_BASE + r,
                        )
                    )
            for t in transfers:
                t.wait(timeout=WAIT_S)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    decode_end, decode_conn = ctx.Pipe()
    prefill_end, prefill_conn = ctx.Pipe()
    procs = [
        ctx.Process(target=decode, args=(decode_conn, args.requests, args.layers), name="decode"),
        ctx.Process(target=prefill, args=(prefill_conn, args.requests, args.layers), name="prefill"),
    ]
    for p in procs:
        p.start()
    bad = -1  # stays so if a process died before reporting
    if decode_end.poll(WAIT_S):
        prefill_end.send(decode_end.recv())  # decode's address, descriptor and page allotment
        if decode_end.poll(WAIT_S * 2):
            bad = decode_end.recv()
        decode_end.send("done")
    pages = sum(len(v) for v in plan(args.requests).values()) * args.layers
    summary = f"kv_cache_transfer: {args.requests} requests x {args.layers} layers, {pages} pages of {PAGE_NBYTES} B"
    return finish(procs, bad, WAIT_S, summary, "mismatched pages", "all pages verified")


if __name__ == "__main__":
    sys.exit(main())
