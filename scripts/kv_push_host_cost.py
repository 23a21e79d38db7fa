#!/usr/bin/env python3
"""Host cost of a KV push's Python side, without a GPU: what `PrefillCache.push` does for a
request of N blocks in the issue-23 layout (80 layers x K and V: 160 pages a block), up to the
engine's device route, stage by stage.

Every paged write the push makes goes to the real `Engine.write_paged` (the binding reads and
checks both page arrays, the engine checks every page and merges runs: `page_runs`), but into
a host region and with one destination page past its end, so it is refused after every page was
checked and nothing moves; the push's thread then sees a completed transfer. Pages are 8 bytes
here (the page size changes no host step). Stages:

- ``push -> first write``: from calling `push` to its first `write_paged` call (what runs
  before the copy engine could start);
- ``push -> all writes checked``: the whole request through the binding and `page_runs`;
- ``page maps``: `_pages_block_major` for every write of the push;
- ``binding``: `write_paged` refused at its first page (the page arrays read, one page checked),
  summed over the push's writes;
- ``binding + page_runs``: refused at its last page, summed;
- the same two for the whole request as one write.

Usage: python3 scripts/kv_push_host_cost.py [BLOCKS] [POOL]   (the accord on sys.path; run it
with each library to compare two builds, e.g. PYTHONPATH pointing at an unpacked older wheel)
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

import accord
from accord import kv

LAYERS = 80
REPEATS = 15


def timed_ms(fn: Callable[[], Any]) -> list[float]:
    """REPEATS calls of ``fn``, each in ms."""
    out = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


class Done:
    """A transfer that already completed (what the push's thread waits for)."""

    def wait(self, timeout: float | None = None) -> None:
        return None


class RefusingEngine:
    """An engine for `PrefillCache.push` whose paged writes go to the real engine with the last
    destination page moved out of range: every page is read and checked, nothing moves."""

    def __init__(self, inner: Any, out_of_range: int) -> None:
        self.inner, self.out_of_range = inner, out_of_range
        self.first_write_at: float | None = None
        self.writes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def write_paged(self, region: Any, descriptor: Any, *, dst_pages: Any, **kw: Any) -> Done:
        if self.first_write_at is None:
            self.first_write_at = time.perf_counter()
        self.writes += 1
        pages = np.array(dst_pages, dtype=np.int64)
        pages[-1] = self.out_of_range
        try:
            self.inner.write_paged(region, descriptor, dst_pages=pages, **kw)
        except accord.AccordError:
            return Done()
        raise RuntimeError("kv_push_host_cost: a write was not refused")


def main() -> int:
    blocks = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    pool = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    layout = kv.KvLayout(LAYERS, 1, 1, 8, dtype="uint8")  # 8-byte pages, 160 a block
    planes = layout.layers * 2
    a, b = accord.Engine(), accord.Engine()
    a.add_peer(b.address)
    b.add_peer(a.address)
    rng = np.random.default_rng(1)
    src = [int(x) for x in rng.permutation(pool)[:blocks]]
    dst = [int(x) for x in rng.permutation(pool)[:blocks]]
    decode = kv.DecodeCache(b, layout, pool)
    refusing = RefusingEngine(a, planes * pool)
    prefill = kv.PrefillCache(refusing, layout, pool)  # type: ignore[arg-type]
    rows: list[tuple[str, list[float]]] = []

    def push() -> None:
        refusing.first_write_at = None
        start = time.perf_counter()
        prefill.push(decode.target, src, dst).wait(timeout=60)
        push.first = refusing.first_write_at - start  # type: ignore[attr-defined, operator]
        push.total = time.perf_counter() - start  # type: ignore[attr-defined]

    firsts, totals = [], []
    for _ in range(REPEATS):
        push()
        firsts.append(push.first)  # type: ignore[attr-defined]
        totals.append(push.total)  # type: ignore[attr-defined]
    writes = refusing.writes // REPEATS
    rows.append(("push -> first write", [t * 1e3 for t in firsts]))
    rows.append((f"push -> all {writes} writes checked", [t * 1e3 for t in totals]))

    per_write = max(1, kv.PUSH_PAGES_PER_WRITE // planes)
    s_ids, d_ids = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    spans = [(at, at + per_write) for at in range(0, blocks, per_write)]

    def maps(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        return kv._pages_block_major(planes, pool, pool, s_ids[lo:hi], d_ids[lo:hi])

    rows.append((f"page maps ({len(spans)} writes)", timed_ms(lambda: [maps(lo, hi) for lo, hi in spans])))
    chunks = [maps(lo, hi) for lo, hi in spans]
    whole = maps(0, blocks)
    src_arr, dst_arr = np.zeros(planes * pool * 8, np.uint8), np.zeros(planes * pool * 8, np.uint8)
    with a.register(src_arr) as s, b.register(dst_arr) as d:

        def spoiled(pages: tuple[np.ndarray, np.ndarray], at: int) -> tuple[np.ndarray, np.ndarray]:
            """The write with destination page ``at`` one past the region: refused there."""
            dp = pages[1].copy()
            dp[at] = planes * pool
            return pages[0], dp

        def refused(pages: tuple[np.ndarray, np.ndarray]) -> None:
            try:
                a.write_paged(s, d.descriptor, page_nbytes=8, src_pages=pages[0], dst_pages=pages[1])
            except accord.AccordError:
                return
            raise RuntimeError("kv_push_host_cost: a write was not refused")

        for at, what in ((0, "binding"), (-1, "binding + page_runs")):
            bad = [spoiled(c, at) for c in chunks]
            rows.append((f"{what} ({len(chunks)} writes)", timed_ms(lambda: [refused(c) for c in bad])))
        for at, what in ((0, "binding"), (-1, "binding + page_runs")):
            one = spoiled(whole, at)
            rows.append((f"{what} (one write)", timed_ms(lambda: refused(one))))
    a.close()
    b.close()
    pages = blocks * planes
    print(f"{accord.__file__}: {blocks} blocks, {pages} pages, {REPEATS} runs")
    print("| stage | ms (best) | ms (median) |\n|---|---|---|")
    for name, ms in rows:
        print(f"| {name} | {min(ms):.2f} | {statistics.median(ms):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
