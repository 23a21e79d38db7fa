"""KV-cache transfer GPU0 -> GPU1 with accord.kv, against the copy ceiling (the Python part of
scripts/device/kv_gpu.sh).

A Llama-3-70B-like layout (80 layers, K and V, 8 KV heads, head_dim 128, blocks of 16 tokens,
bf16: 32 KiB per block per layer's K or V, 5 MiB per block over all layers) in two CUDA caches
of ``--pool`` blocks: the prefill cache on GPU 0, the decode cache on the last GPU. A request of
N blocks (scattered block ids on both sides) moves N x 5 MiB:

- ``write``: the prefill side pushes it (``PrefillCache.push``: paged writes);
- ``read``: the decode side pulls it (``DecodeCache.pull``: batched READs, each naming up to 409
  blocks of every layer's K and V, written back by the prefill engine as one paged write).

``--case`` picks where the two caches live: ``inproc`` (two engines of this process), ``ipc``
(the prefill cache in a second process; device writes through CUDA IPC, the reads' too once the
decode engine announced its cache) or ``network`` (the
same, run with ``ACCORD_DEVICE_IPC=0 ACCORD_SHM=0`` so bytes are staged, sent over loopback UDP
and landed). The ceiling is ``torch`` ``copy_`` of the same bytes GPU0 -> GPU1 as one contiguous
tensor, measured in the same run. The first request of each row is a warm-up (reported apart);
every row's bytes are checked block by block after its first request. Prints a table and writes
one JSON line per row to ``--json``; ``--table FILE...`` prints the table of earlier runs.

``--shapes 1/0,4/1`` runs the case once per copy shape, ``STREAMS/BATCH`` setting
``ACCORD_DEVICE_COPY_STREAMS`` and ``ACCORD_DEVICE_COPY_BATCH_2D`` for the engines (and the
second process) of that pass; ``1/0`` is the route before either knob existed (one stream a
paged write, one driver call a 2D copy), so one run compares them on the same machine. Each row
names its shape.

    python examples/kv_gpu_bench.py --case inproc --blocks 128,2048 --iters 3 --json out.jsonl

Diagnostics (stderr, each line stamped with seconds since the process started, its pid and
role): every phase of both processes (engine up, cache filled, registered, each request started
and ended), the engine's own warnings and errors (``logging`` at INFO), and while a request is
outstanding, every ``--progress-s`` seconds, its parts submitted and in flight and both engines'
counters that show movement (retransmits, READ requests, landed chunks: a request on the
network route whose receiver's ``landing_chunks_landed`` stands still is stuck, one whose count
grows slowly is slow). A request that is not over ``--stuck-s`` seconds after its own timeout is
abandoned and reported with those counters, so the run always ends with a row per request.

Exits 2 without torch or a CUDA device, 1 when a check failed.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import multiprocessing as mp
import os
import statistics
import sys
import time
from multiprocessing.connection import Connection
from typing import Any, Callable

import numpy as np

from gpu_bench import append_rows, cell, check_note, copy_ceiling_s, read_rows

LAYOUT_ARGS = (80, 16, 8, 128)  # layers, block_size, heads, head_dim (bf16)
#: The engine counters the progress lines show (those that move while bytes do).
PROGRESS_KEYS = ("retransmits", "failovers", "datagrams_dropped", "reads_sent", "reads_served", "reads_unanswered",
                 "landing_chunks_landed", "landing_asks_refused", "landing_control_dropped", "landing_control_refused")
T0 = time.monotonic()
ROLE = ["decode"]


def say(msg: str) -> None:
    """One diagnostic line on stderr: seconds since start, pid, role."""
    print(f"[kv_gpu_bench +{time.monotonic() - T0:8.3f}s pid {os.getpid()} {ROLE[0]}] {msg}", file=sys.stderr, flush=True)


def setup_logging(role: str) -> None:
    """Stamps this process's diagnostics with ``role`` and lets the engine's INFO and above through."""
    ROLE[0] = role
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"[kv_gpu_bench %(relativeCreated)10.0fms pid %(process)d {role}] %(name)s %(levelname)s %(message)s")
    import accord

    accord.set_log_level(logging.INFO)


def counters(engine: Any) -> str:
    """The engine's counters that move with traffic, as ``key=value`` (those present)."""
    try:
        stats = engine.stats()
    except Exception as e:  # noqa: BLE001 - a closed engine says so
        return f"(no stats: {e})"
    return " ".join(f"{k}={stats[k]}" for k in PROGRESS_KEYS if k in stats)


def wait_logged(transfer: Any, what: str, engine: Any, hard_s: float, progress_s: float) -> None:
    """Waits for a KV transfer in slices of ``progress_s``, saying its progress and ``engine``'s
    counters after each; raises TimeoutError naming both once ``hard_s`` passed (the transfer is
    abandoned: its parts may still be in flight)."""
    start = time.monotonic()
    while True:
        try:
            transfer.wait(timeout=progress_s)
            say(f"{what}: over after {time.monotonic() - start:.2f} s")
            return
        except Exception as e:  # noqa: BLE001 - accord.TimeoutError from the slice, or the request's error
            import accord

            if not isinstance(e, accord.TimeoutError) or transfer.done():
                say(f"{what}: failed after {time.monotonic() - start:.2f} s: {type(e).__name__}: {e}")
                raise
        waited = time.monotonic() - start
        state = (f"{transfer.parts_submitted} of {transfer.parts_total} parts submitted, "
                 f"{transfer.parts_in_flight} in flight; {counters(engine)}")
        say(f"{what}: not over after {waited:.1f} s: {state}")
        if waited >= hard_s:
            raise TimeoutError(f"{what} not over after {waited:.0f} s (abandoned): {state}")


def layout() -> Any:
    from accord.kv import KvLayout

    return KvLayout(*LAYOUT_ARGS, dtype="bfloat16")


def need_cuda() -> Any:
    """torch, or exit 2 saying what is missing."""
    try:
        import torch
    except ImportError as e:
        print(f"kv_gpu_bench: needs torch with CUDA ({e}); install torch and run on a GPU host", file=sys.stderr)
        sys.exit(2)
    if not torch.cuda.is_available():
        print("kv_gpu_bench: needs a CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        sys.exit(2)
    return torch


def layer_pattern(torch: Any, layer: int, num_blocks: int, device: str) -> Any:
    """One layer's K and V of the prefill cache: a pattern of (layer, kv, block, token, head, dim)."""
    _, tokens, heads, dims = LAYOUT_ARGS
    ax = [torch.arange(n, device=device, dtype=torch.int32) for n in (2, num_blocks, tokens, heads, dims)]
    kv, blk, tok, head, dim = (a.reshape(*[-1 if i == j else 1 for j in range(5)]) for i, a in enumerate(ax))
    values = (layer * 31 + kv * 17 + blk * 7 + tok * 3 + head * 5 + dim) % 251 - 125
    return values.to(torch.bfloat16)


def fill(torch: Any, cache: Any, num_blocks: int, device: str) -> None:
    for layer in range(LAYOUT_ARGS[0]):
        cache[layer].copy_(layer_pattern(torch, layer, num_blocks, device))
    torch.cuda.synchronize(device)


def check(torch: Any, cache: Any, pool: int, src: list[int], dst: list[int], device: str) -> bool:
    """Whether the decode cache's blocks ``dst`` hold the prefill pattern's blocks ``src``."""
    torch.cuda.synchronize(device)
    s = torch.tensor(src, device=device)
    d = torch.tensor(dst, device=device)
    for layer in range(LAYOUT_ARGS[0]):
        want = layer_pattern(torch, layer, pool, device).index_select(1, s)
        if not torch.equal(cache[layer].index_select(1, d), want):
            return False
    return True


def block_ids(pool: int, n: int, seed: int) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(seed)
    return [int(b) for b in rng.permutation(pool)[:n]], [int(b) for b in rng.permutation(pool)[:n]]


def ceiling_gbps(torch: Any, nbytes: int, iters: int) -> float:
    """GB/s of one contiguous copy_ GPU0 -> last GPU of ``nbytes`` (median of ``iters``)."""
    return nbytes / copy_ceiling_s(torch, nbytes, iters) / 1e9


class Budget:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def numbered_transfers(
    kind: str, blocks: int, start: Callable[[str, float], Any], engine: Any, stuck_s: float, progress_s: float
) -> Callable[[float], None]:
    """``run(timeout)`` for :func:`timed`: each call starts transfer ``<kind>-<i>`` of ``blocks``
    blocks (``start(request, timeout)``), says so, and waits for it as :func:`wait_logged` does,
    watching ``engine``'s counters."""
    count = [0]

    def run(timeout: float) -> None:
        count[0] += 1
        what = f"{kind}-{count[0]} of {blocks} blocks (timeout {timeout:.0f} s)"
        say(f"{what}: starting")
        transfer = start(f"{kind}-{count[0]}", timeout)
        wait_logged(transfer, what, engine, timeout + stuck_s, progress_s)

    return run


def timed(run: Any, iters: int, budget: Budget) -> tuple[float | None, list[float], str]:
    """(warm-up seconds, timed seconds, error) of ``run(timeout)``; stops early when the budget
    would not hold another request like the last."""
    first: float | None = None
    times: list[float] = []
    for i in range(iters + 1):
        left = budget.left()
        last = times[-1] if times else (first or 0.0)
        if left < 5 or (i > 0 and left < 1.5 * last + 2):
            return first, times, "" if times or i > 0 else "no time left in the budget"
        t0 = time.perf_counter()
        try:
            run(max(1.0, left - 2))
        except Exception as e:  # noqa: BLE001 - reported in the row
            return first, times, f"{type(e).__name__}: {e}"
        took = time.perf_counter() - t0
        if i == 0:
            first = took
        else:
            times.append(took)
    return first, times, ""


def copy_shape() -> str:
    """The copy shape the engines of this pass are built with, as ``STREAMS/BATCH`` (``-``: the
    engine's default)."""
    streams = os.environ.get("ACCORD_DEVICE_COPY_STREAMS", "-")
    batch = os.environ.get("ACCORD_DEVICE_COPY_BATCH_2D", "-")
    return f"{streams}/{batch}"


def row(case: str, op: str, blocks: int, first: float | None, times: list[float], ceiling: float,
        checked: bool | None, error: str, owner: dict[str, int]) -> dict[str, Any]:
    nbytes = blocks * layout().block_nbytes * LAYOUT_ARGS[0] * 2
    # Scattered ids make every block of every layer's K or V a piece of its own: one page of a
    # batched READ or of a paged write. On the copy-engine routes a block's pieces (listed block
    # by block) go as one 2D copy; "parts" and "us_per_part" still count pieces.
    parts = blocks * LAYOUT_ARGS[0] * 2
    median = statistics.median(times) if times else None
    gbps = nbytes / median / 1e9 if median else None
    return {
        "case": case, "shape": copy_shape(), "op": op, "blocks": blocks, "bytes": nbytes, "parts": parts,
        "us_per_part": None if median is None else round(median * 1e6 / parts, 2),
        "first_ms": None if first is None else round(first * 1e3, 2),
        "ms": [round(t * 1e3, 2) for t in times],
        "median_ms": None if median is None else round(median * 1e3, 2),
        "gbps": None if gbps is None else round(gbps, 2),
        "ceiling_gbps": round(ceiling, 2),
        "ratio": None if gbps is None else round(gbps / ceiling, 3),
        "checked": checked, "error": error,
        # The prefill engine's READ counters after the row (reads written through the decode
        # cache's IPC handle rather than landed: reads_into_device_mapped).
        "owner_reads_served": owner.get("reads_served"),
        "owner_reads_mapped": owner.get("reads_into_device_mapped"),
    }


def push_options(args: argparse.Namespace) -> dict[str, int]:
    """``PrefillCache.push``'s chunking keywords the command line set (none: the library's)."""
    options = {}
    if args.push_pages:
        options["pages_per_write"] = args.push_pages
    if args.push_in_flight:
        options["max_in_flight"] = args.push_in_flight
    return options


def prefill_role(conn: Connection, pool: int, progress_s: float, stuck_s: float, push_options: dict[str, int]) -> None:
    """The second process of the ``ipc`` and ``network`` cases: the prefill cache on GPU 0,
    pushing what the parent asks (with ``push_options``, ``PrefillCache.push``'s keywords)
    and answering its reads."""
    setup_logging("prefill")
    say(f"started; ACCORD_DEVICE_IPC={os.environ.get('ACCORD_DEVICE_IPC')} ACCORD_SHM={os.environ.get('ACCORD_SHM')}")
    import accord
    from accord.kv import PrefillCache

    try:
        torch = need_cuda()
        torch.cuda.set_device(0)
        say("torch and CUDA up")
        with accord.Engine() as engine:
            say(f"engine up: {engine!r}")
            cache = torch.empty(layout().shape(pool), dtype=torch.bfloat16, device="cuda:0")
            fill(torch, cache, pool, "cuda:0")
            say(f"cache of {pool} blocks filled")
            prefill = PrefillCache(engine, layout(), pool, cache=cache)
            say("cache registered")
            conn.send(("hello", prefill.source))
            target, decode_address = conn.recv()
            engine.add_peer(decode_address)
            say("decode engine added as a peer")
            while True:
                order = conn.recv()
                if order == "exit":
                    break
                if order == "stats":
                    conn.send(("stats", engine.stats()))
                    continue
                _, src, dst, iters, seconds = order
                budget = Budget(seconds)
                push = numbered_transfers(
                    "push",
                    len(src),
                    lambda request, timeout: prefill.push(target, src, dst, request=request, timeout=timeout, **push_options),
                    engine,
                    stuck_s,
                    progress_s,
                )
                conn.send(("timed", timed(push, iters, budget)))
            prefill.close()
    except Exception as e:  # noqa: BLE001 - reported to the parent
        say(f"failed: {type(e).__name__}: {e}")
        conn.send(("error", f"{type(e).__name__}: {e}"))


def run_case(args: argparse.Namespace) -> list[dict[str, Any]]:
    torch = need_cuda()
    import accord
    from accord.kv import DecodeCache, PrefillCache

    setup_logging("decode")
    say(f"case {args.case}; ACCORD_DEVICE_IPC={os.environ.get('ACCORD_DEVICE_IPC')} ACCORD_SHM={os.environ.get('ACCORD_SHM')}")
    last = torch.cuda.device_count() - 1
    budget = Budget(args.budget_s)
    pool, case = args.pool, args.case
    sizes = [int(b) for b in args.blocks.split(",")]
    read_sizes = [int(b) for b in args.read_blocks.split(",")] if args.read_blocks else sizes
    ceilings = {n: ceiling_gbps(torch, n * layout().block_nbytes * LAYOUT_ARGS[0] * 2, 5) for n in sizes}
    say(f"ceilings measured: {ceilings}")
    decode_engine = accord.Engine()
    cache = torch.zeros(layout().shape(pool), dtype=torch.bfloat16, device=f"cuda:{last}")
    decode = DecodeCache(decode_engine, layout(), pool, cache=cache)
    say(f"decode engine up and its cache of {pool} blocks registered on cuda:{last}")
    proc = conn = prefill = prefill_engine = None
    if case == "inproc":
        prefill_engine = accord.Engine()
        pcache = torch.empty(layout().shape(pool), dtype=torch.bfloat16, device="cuda:0")
        fill(torch, pcache, pool, "cuda:0")
        prefill = PrefillCache(prefill_engine, layout(), pool, cache=pcache)
        prefill_engine.add_peer(decode_engine.address)
        source = prefill.source
    else:
        ctx = mp.get_context("spawn")
        conn, child = ctx.Pipe()
        role_args = (child, pool, args.progress_s, args.stuck_s, push_options(args))
        proc = ctx.Process(target=prefill_role, args=role_args, daemon=True)
        proc.start()
        if not conn.poll(120):
            raise SystemExit("kv_gpu_bench: the prefill process did not start within 120 s")
        kind, source = conn.recv()
        if kind != "hello":
            raise SystemExit(f"kv_gpu_bench: the prefill process failed: {source}")
        conn.send((decode.target, decode_engine.address))
        # Both engines know each other: over the network a push into this GPU's cache lands
        # through a rendezvous this engine answers (it refuses writers it does not know).
        decode.accept_pushes_from(source)
        say("the prefill process said hello; addresses exchanged, each engine added as the other's peer")
    def owner_stats() -> dict[str, int]:
        if prefill_engine is not None:
            return dict(prefill_engine.stats())
        if conn is not None:
            conn.send("stats")
            if conn.poll(30):
                kind, answer = conn.recv()
                if kind == "stats":
                    return dict(answer)
        return {}

    rows: list[dict[str, Any]] = []
    plan = [("write", n) for n in sizes] + [("read", n) for n in read_sizes]
    try:
        for index, (op, n) in enumerate(plan):
            src, dst = block_ids(pool, n, seed=n)
            cache.zero_()
            torch.cuda.synchronize(last)
            share = budget.left() / (len(plan) - index)
            if op == "read":
                pull = numbered_transfers(
                    "pull",
                    n,
                    lambda request, timeout: decode.pull(source, src, dst, request=request, timeout=timeout),
                    decode_engine,
                    args.stuck_s,
                    args.progress_s,
                )
                first, times, error = timed(pull, args.iters, Budget(share))
            elif prefill is not None:
                pf = prefill
                push = numbered_transfers(
                    "push",
                    n,
                    lambda request, timeout: pf.push(
                        decode.target, src, dst, request=request, timeout=timeout, **push_options(args)
                    ),
                    decode_engine,
                    args.stuck_s,
                    args.progress_s,
                )
                first, times, error = timed(push, args.iters, Budget(share))
            else:
                assert conn is not None
                conn.send(("push", src, dst, args.iters, share))
                say(f"asked the prefill process for pushes of {n} blocks within {share:.0f} s")
                # The prefill process bounds each push (its timeout plus --stuck-s) and answers;
                # meanwhile this (receiving) engine's counters say whether chunks still land.
                answer_by = time.monotonic() + share + args.stuck_s + 10
                answered = False
                while time.monotonic() < answer_by:
                    if conn.poll(min(args.progress_s, max(0.1, answer_by - time.monotonic()))):
                        answered = True
                        break
                    say(f"waiting for the prefill process's pushes of {n} blocks; here: {counters(decode_engine)}")
                if answered:
                    kind, answer = conn.recv()
                    first, times, error = answer if kind == "timed" else (None, [], answer)
                else:
                    first, times, error = None, [], (
                        f"the prefill process did not answer within {share + args.stuck_s + 10:.0f} s; "
                        f"here: {counters(decode_engine)}")
                say(f"pushes of {n} blocks: first {first}, timed {times}, error {error!r}")
            # Checked when every request of the row ended well (a cancelled one leaves blocks undefined).
            ok = None if first is None or error else check(torch, cache, pool, src, dst, f"cuda:{last}")
            ceiling = ceilings.get(n) or ceiling_gbps(torch, n * layout().block_nbytes * LAYOUT_ARGS[0] * 2, 5)
            rows.append(row(case, op, n, first, times, ceiling, ok, error, owner_stats()))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        # The decode engine first: it would report the prefill process's exit as a peer's death.
        decode_engine.close()
        if prefill_engine is not None:
            prefill_engine.close()
        if conn is not None:
            try:
                conn.send("exit")
            except OSError:
                pass  # the prefill process is gone already
        if proc is not None:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'case':8} {'shape':5} {'op':5} {'blocks':>6} {'MiB':>7} {'parts':>7} {'warm-up ms':>10} {'ms/request':>10} "
          f"{'us/part':>8} {'GB/s':>7} {'ceiling':>7} {'ratio':>6}  checked / note")
    for r in rows:
        owner = ""
        if r["op"] == "read" and r.get("owner_reads_served"):
            owner = f"; owner: {r['owner_reads_mapped']} of {r['owner_reads_served']} reads through IPC (cumulative)"
        note = check_note(r["checked"], r["checked"] is False, r["error"], owner)
        print(f"{r['case']:8} {r.get('shape', '-'):5} {r['op']:5} {r['blocks']:>6} {r['bytes'] / 2**20:>7.0f} {cell(r.get('parts')):>7} "
              f"{cell(r['first_ms']):>10} {cell(r['median_ms']):>10} {cell(r.get('us_per_part')):>8} {cell(r['gbps']):>7} "
              f"{cell(r['ceiling_gbps']):>7} {cell(r['ratio']):>6}  {note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=["inproc", "ipc", "network"], default="inproc")
    parser.add_argument("--blocks", default="128,2048", help="request sizes in blocks (comma-separated)")
    parser.add_argument("--read-blocks", default="", help="request sizes of the reads (default: --blocks)")
    parser.add_argument("--pool", type=int, default=2560, help="blocks of each cache")
    parser.add_argument("--iters", type=int, default=3, help="timed requests per row (after one warm-up)")
    parser.add_argument("--budget-s", type=float, default=100.0, help="the whole run's time, seconds")
    parser.add_argument("--json", default="", help="append one JSON line per row to this file")
    parser.add_argument("--table", nargs="*", help="print the table of these JSON-lines files and exit")
    parser.add_argument("--progress-s", type=float, default=5.0,
                        help="seconds between progress lines while a request is outstanding")
    parser.add_argument("--shapes", default="",
                        help="copy shapes to run the case with, STREAMS/BATCH comma-separated (e.g. 1/0,4/1); "
                             "default: the environment's")
    parser.add_argument("--push-pages", type=int, default=0,
                        help="pages per paged write of a push (default: accord.kv's PUSH_PAGES_PER_WRITE)")
    parser.add_argument("--push-in-flight", type=int, default=0,
                        help="paged writes a push keeps outstanding (default: accord.kv's PUSH_WRITES_IN_FLIGHT)")
    parser.add_argument("--stuck-s", type=float, default=20.0,
                        help="seconds past a request's own timeout before it is abandoned and reported")
    args = parser.parse_args(argv)
    if args.table is not None:
        rows = read_rows(args.table)
        print_table(rows)
        return 0 if all(r["checked"] is not False for r in rows) else 1
    if args.shapes:
        rows = []
        shapes = [s.strip().split("/") for s in args.shapes.split(",") if s.strip()]
        end = time.monotonic() + args.budget_s
        for index, (streams, batch) in enumerate(shapes):
            os.environ["ACCORD_DEVICE_COPY_STREAMS"] = streams
            os.environ["ACCORD_DEVICE_COPY_BATCH_2D"] = batch
            args.budget_s = (end - time.monotonic()) / (len(shapes) - index)
            say(f"shape {streams}/{batch}: {args.budget_s:.0f} s")
            rows += run_case(args)
            # The pass's caches (25 GiB over both GPUs) go before the next pass allocates its own.
            gc.collect()
            need_cuda().cuda.empty_cache()
    else:
        rows = run_case(args)
    if args.json:
        append_rows(args.json, rows)
    print_table(rows)
    return 0 if all(r["checked"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
