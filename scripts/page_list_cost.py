#!/usr/bin/env python3
"""Host cost of handing accord a paged write's page lists: two numpy arrays of N page indices
(a 2,048-block KV push in the issue-23 layout is 327,680 pages) read and checked by
`Engine.write_paged`, timed on a write refused at its last page so that nothing moves.

Usage: python3 scripts/page_list_cost.py [N]   (the accord on sys.path; run it once with each
library to compare two builds, e.g. with PYTHONPATH pointing at an older package)
"""

import sys
import time

import numpy as np

import accord


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 327680
    a, b = accord.Engine(), accord.Engine()
    a.add_peer(b.address)
    b.add_peer(a.address)
    src, dst = np.zeros(n * 8, np.uint8), np.zeros(n * 8, np.uint8)
    rng = np.random.default_rng(1)
    src_pages = rng.permutation(n).astype(np.int64)
    dst_pages = rng.permutation(n).astype(np.int64)
    dst_pages[-1] = n  # one page past the destination: refused after every page was read
    best = float("inf")
    with a.register(src) as s, b.register(dst) as d:
        for _ in range(5):
            t = time.perf_counter()
            try:
                a.write_paged(s, d.descriptor, page_nbytes=8, src_pages=src_pages, dst_pages=dst_pages)
            except accord.AccordError:
                pass
            else:
                print("page_list_cost: the write was not refused", file=sys.stderr)
                return 1
            best = min(best, time.perf_counter() - t)
    print(f"{accord.__file__}: two arrays of {n} pages read and checked: {best * 1e3:.2f} ms, {best * 1e6 / n:.3f} us a page")
    return 0


if __name__ == "__main__":
    sys.exit(main())
