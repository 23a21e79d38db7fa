"""A decode engine pulls requests' KV blocks from a prefill engine with READ (accord.kv).

Runs both engines in this process over the network stack on loopback (``force_network``), so
every read crosses the transport: the decode side sends a batched request (every block of
every layer's K and V in one), the prefill side checks it against its cache's key and bounds and
writes the blocks back as one paged write. Checks every block of every layer's K and V, and
exits non-zero on a mismatch. With ``--compare``, each request is pulled again as one READ per
block and layer's K or V (what a pull did before batched READ), and both times are printed.

    python examples/kv_read.py --requests 4 --layers 8 [--compare]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import accord
from accord.kv import DecodeCache, KvLayout, PrefillCache


def pull_piece_by_piece(
    engine: accord.Engine, decode: DecodeCache, prefill: PrefillCache, src: list[int], dst: list[int]
) -> float:
    """Seconds to read ``src`` into ``dst`` as one READ per block and layer's K or V (all in
    flight at once), the bytes checked after."""
    decode.cache[:] = 0
    nbytes, planes = decode.layout.block_nbytes, decode.layout.layers * 2
    start = time.perf_counter()
    reads = [
        engine.read(
            decode.region,
            prefill.source.descriptor,
            nbytes,
            dst_offset=(p * decode.num_blocks + d) * nbytes,
            src_offset=(p * prefill.num_blocks + s) * nbytes,
        )
        for p in range(planes)
        for s, d in zip(src, dst)
    ]
    for read in reads:
        read.wait(timeout=30)
    took = time.perf_counter() - start
    if not (decode.cache[:, :, dst] == prefill.cache[:, :, src]).all():
        raise SystemExit("the piece-by-piece reads' blocks differ")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--blocks-per-request", type=int, default=6)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--compare", action="store_true", help="also pull each request one READ per piece")
    args = parser.parse_args()
    layout = KvLayout(layers=args.layers, block_size=16, heads=8, head_dim=args.head_dim, dtype="float16")
    pool = args.requests * args.blocks_per_request
    rng = np.random.default_rng(1)
    with accord.Engine(force_network=True) as prefill_engine, accord.Engine(force_network=True) as decode_engine:
        prefill_engine.add_peer(decode_engine.address)  # the prefill side answers reads over the transport
        cache = rng.standard_normal(layout.shape(pool)).astype(np.float16)
        prefill = PrefillCache(prefill_engine, layout, pool, cache=cache)
        decode = DecodeCache(decode_engine, layout, pool)
        for r in range(args.requests):
            src = rng.permutation(pool)[: args.blocks_per_request].tolist()
            dst = rng.permutation(pool)[: args.blocks_per_request].tolist()
            start = time.perf_counter()
            decode.pull(prefill.source, src, dst, request=f"req-{r}").wait(timeout=30)
            took = time.perf_counter() - start
            if not (decode.cache[:, :, dst] == prefill.cache[:, :, src]).all():
                print(f"request {r}: blocks differ", file=sys.stderr)
                return 1
            nbytes = layout.layers * 2 * len(src) * layout.block_nbytes
            print(f"request {r}: {len(src)} blocks x {layout.layers} layers x K,V = {nbytes} bytes in {took * 1e3:.2f} ms")
            if args.compare:
                single = pull_piece_by_piece(decode_engine, decode, prefill, src, dst)
                print(f"request {r}: the same one READ per piece ({len(src) * layout.layers * 2} reads) "
                      f"in {single * 1e3:.2f} ms")
        decode.close()
        prefill.close()
    print("all blocks verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
