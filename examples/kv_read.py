"""A decode engine pulls requests' KV blocks from a prefill engine with READ (accord.kv).

Runs both engines in this process over the network stack on loopback (``force_network``), so
every read crosses the transport: the decode side sends a request, the prefill side checks it
against its cache's key and bounds and writes the blocks back. Checks every block of every
layer's K and V, and exits non-zero on a mismatch.

    python examples/kv_read.py --requests 4 --layers 8
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import accord
from accord.kv import DecodeCache, KvLayout, PrefillCache


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--blocks-per-request", type=int, default=6)
    args = parser.parse_args()
    layout = KvLayout(layers=args.layers, block_size=16, heads=8, head_dim=64, dtype="float16")
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
        decode.close()
        prefill.close()
    print("all blocks verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
