"""KV-cache transfer GPU0 -> GPU1 through NIXL, the anchor accord.kv is measured against
(the Python part of scripts/device/kv_nixl.sh).

The layout and the requests are kv_gpu_bench.py's: a Llama-3-70B-like cache (80 layers, K and
V, 8 KV heads, head_dim 128, blocks of 16 tokens, bf16: 32 KiB a block of one layer's K or V,
5 MiB a block over all layers) of ``--pool`` blocks on each side, requests of N scattered block
ids (the same ids for the same N, from the same seed), every layer's K and V of each block.

Two processes, two NIXL agents with the UCX backend (on one host UCX moves GPU memory between
processes with ``cuda_ipc``, the copy engine): this one holds the decode cache on the last GPU,
the second the prefill cache on GPU 0. They exchange agent metadata over a pipe; each prepares
once, untimed, the descriptor list of every piece of both caches (``prep_xfer_dlist``, 409,600
pieces of 32 KiB at the default pool), as vLLM's NIXL connector does, so a request is only
``make_prepped_xfer`` with the request's indices, ``transfer`` and polling ``check_xfer_state``:

- ``write``: the prefill process writes the request's blocks into the decode cache;
- ``read``: this process reads them from the prefill cache into its own.

Time per request runs from making the request to ``DONE`` at the initiator. The first request
of each row is a warm-up; the decode cache's bytes are checked after the row's first request.
Rows go to ``--json`` in kv_gpu_bench.py's format (``case`` "nixl"), so ``kv_gpu_bench.py
--table`` prints them beside accord's.

``--device cpu`` runs the same protocol on host memory (numpy, ``DRAM`` descriptors, small
sizes): a check of this script where there is no GPU, not a measurement.

NIXL is found as ``nixl`` or ``nixl_cu13`` (``pip install nixl-cu13``, or the wheel unpacked on
``PYTHONPATH``). Exits 2 without NIXL, torch or CUDA, 1 when a check failed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from gpu_bench import append_rows, copy_ceiling_s, peer_answer
from kv_gpu_bench import block_ids  # the same ids as accord's rows, by construction

LAYERS, BLOCK_TOKENS, HEADS, HEAD_DIM, ITEM = 80, 16, 8, 128, 2
PLANES = LAYERS * 2
#: Bytes of one block of one layer's K or V.
PAGE = BLOCK_TOKENS * HEADS * HEAD_DIM * ITEM
#: Longest wait for any one request, handshake or answer, seconds.
PHASE_S = 60.0
T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[kv_nixl_bench +{time.monotonic() - T0:7.2f}s pid {os.getpid()}] {msg}", file=sys.stderr, flush=True)


def nixl_api() -> Any:
    """NIXL's Python API module, or exit 2 saying it is missing."""
    for name in ("nixl._api", "nixl_cu13._api", "nixl_cu12._api"):
        try:
            return __import__(name, fromlist=["nixl_agent"])
        except ImportError:
            continue
    print("kv_nixl_bench: NIXL is not importable (pip install nixl-cu13, or its wheel unpacked on PYTHONPATH)",
          file=sys.stderr)
    sys.exit(2)


def pattern(pool: int, plane: int) -> np.ndarray:
    """Host-memory pattern of one plane (layer x K/V) of the prefill cache, ``pool`` pages of
    ``PAGE`` bytes: differs by plane, block and byte."""
    blk = np.arange(pool, dtype=np.uint32).reshape(-1, 1)
    at = np.arange(PAGE, dtype=np.uint32).reshape(1, -1)
    return ((plane * 31 + blk * 7 + at) % 251).astype(np.uint8)


def pattern_on(torch: Any, pool: int, plane: int, device: str) -> Any:
    """:func:`pattern` computed on ``device`` (the same bytes)."""
    blk = torch.arange(pool, dtype=torch.int32, device=device).reshape(-1, 1)
    at = torch.arange(PAGE, dtype=torch.int32, device=device).reshape(1, -1)
    return ((plane * 31 + blk * 7 + at) % 251).to(torch.uint8)


class Cache:
    """One side's cache: PLANES x pool pages of PAGE bytes, contiguous, on ``device`` (``cpu``
    or ``cuda:N``), filled with the pattern (prefill) or zeros (decode)."""

    def __init__(self, device: str, pool: int, filled: bool) -> None:
        self.device, self.pool = device, pool
        self.nbytes = PLANES * pool * PAGE
        if device == "cpu":
            self.host = np.zeros(self.nbytes, dtype=np.uint8)
            if filled:
                for p in range(PLANES):
                    self.host[p * pool * PAGE:(p + 1) * pool * PAGE] = pattern(pool, p).reshape(-1)
            self.addr, self.dev, self.mem = int(self.host.ctypes.data), 0, "DRAM"
        else:
            import torch

            self.tensor = torch.zeros(self.nbytes, dtype=torch.uint8, device=device)
            if filled:
                for p in range(PLANES):
                    self.tensor[p * pool * PAGE:(p + 1) * pool * PAGE].copy_(pattern_on(torch, pool, p, device).reshape(-1))
                torch.cuda.synchronize(device)
            self.addr, self.dev, self.mem = int(self.tensor.data_ptr()), self.tensor.get_device(), "VRAM"

    def pieces(self) -> np.ndarray:
        """Every piece as (address, length, device), plane-major: piece ``plane * pool + block``."""
        n = PLANES * self.pool
        out = np.zeros((n, 3), dtype=np.uint64)
        out[:, 0] = self.addr + np.arange(n, dtype=np.uint64) * PAGE
        out[:, 1] = PAGE
        out[:, 2] = self.dev
        return out

    def zero(self) -> None:
        if self.device == "cpu":
            self.host[:] = 0
        else:
            import torch

            self.tensor.zero_()
            torch.cuda.synchronize(self.device)

    def holds(self, src: list[int], dst: list[int]) -> bool:
        """Whether blocks ``dst`` of this (decode) cache hold the prefill pattern's blocks ``src``."""
        s, d = np.asarray(src), np.asarray(dst)
        if self.device == "cpu":
            for p in range(PLANES):
                got = self.host[p * self.pool * PAGE:(p + 1) * self.pool * PAGE].reshape(self.pool, PAGE)[d]
                if not np.array_equal(got, pattern(self.pool, p)[s]):
                    return False
            return True
        import torch

        ts, td = torch.as_tensor(s, device=self.device), torch.as_tensor(d, device=self.device)
        for p in range(PLANES):
            plane = self.tensor[p * self.pool * PAGE:(p + 1) * self.pool * PAGE].view(self.pool, PAGE)
            want = pattern_on(torch, self.pool, p, self.device).index_select(0, ts)
            if not torch.equal(plane.index_select(0, td), want):
                return False
        return True


def indices(pool: int, blocks: list[int]) -> np.ndarray:
    """Indices into a side's piece list of every plane of ``blocks``, block by block."""
    b = np.asarray(blocks, dtype=np.int64).reshape(-1, 1)
    p = np.arange(PLANES, dtype=np.int64).reshape(1, -1)
    return (p * pool + b).reshape(-1).astype(np.int32)


class Side:
    """A NIXL agent over one cache, knowing the other side: the prepared local list of every
    piece here and the prepared remote list of every piece there."""

    def __init__(self, nixl: Any, name: str, cache: Cache) -> None:
        self.nixl, self.cache = nixl, cache
        self.agent = nixl.nixl_agent(name, nixl.nixl_agent_config(backends=["UCX"]))
        if "UCX" not in self.agent.backends:
            raise RuntimeError(f"NIXL has no UCX backend here (plugins: {self.agent.plugin_list})")
        reg = np.array([[cache.addr, cache.nbytes, cache.dev]], dtype=np.uint64)
        self.registered = self.agent.register_memory(reg, cache.mem)
        self.local = self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", cache.pieces(), cache.mem)
        self.remote: Any = None
        self.peer = ""

    def metadata(self) -> tuple[bytes, int, int]:
        return self.agent.get_agent_metadata(), self.cache.addr, self.cache.dev

    def know(self, meta: bytes, addr: int, dev: int) -> None:
        """Adds the other agent and prepares its pieces (same pool, same layout)."""
        self.peer = self.agent.add_remote_agent(meta)
        if isinstance(self.peer, bytes):
            self.peer = self.peer.decode()
        n = PLANES * self.cache.pool
        remote = np.zeros((n, 3), dtype=np.uint64)
        remote[:, 0] = addr + np.arange(n, dtype=np.uint64) * PAGE
        remote[:, 1] = PAGE
        remote[:, 2] = dev
        deadline = time.monotonic() + PHASE_S
        while True:
            try:
                self.remote = self.agent.prep_xfer_dlist(self.peer, remote, self.cache.mem)
                return
            except Exception as e:  # noqa: BLE001 - NIXL raises while the remote metadata is not loaded
                if time.monotonic() > deadline:
                    raise RuntimeError(f"could not prepare {self.peer}'s pieces within {PHASE_S:.0f} s: {e}") from e
                time.sleep(0.05)

    def request(self, op: str, local_blocks: list[int], remote_blocks: list[int]) -> float:
        """Seconds of one request ``op`` (WRITE or READ) of these blocks, made, posted and polled
        to DONE; raises on ERR or after PHASE_S."""
        pool = self.cache.pool
        t0 = time.perf_counter()
        handle = self.agent.make_prepped_xfer(op, self.local, indices(pool, local_blocks), self.remote,
                                              indices(pool, remote_blocks))
        state = self.agent.transfer(handle)
        deadline = time.monotonic() + PHASE_S
        while state == "PROC":
            if time.monotonic() > deadline:
                raise RuntimeError(f"NIXL {op} of {len(local_blocks)} blocks to {self.peer} not done within {PHASE_S:.0f} s")
            state = self.agent.check_xfer_state(handle)
        took = time.perf_counter() - t0
        self.agent.release_xfer_handle(handle)
        if state != "DONE":
            raise RuntimeError(f"NIXL {op} of {len(local_blocks)} blocks to {self.peer}: state {state}")
        return took


def timed(run: Any, iters: int) -> tuple[float, list[float]]:
    first = run()
    return first, [run() for _ in range(iters)]


def serve_writes(conn: Connection, write: Any, keep_going: tuple[type[BaseException], ...] = ()) -> None:
    """The prefill process's loop (this bench's and the Mooncake one's): each order of the decode
    process, ``(kind, src, dst, iters)``, is answered with ``("timed", timed(...))`` of
    ``write(src, dst)``, until ``"exit"``; an order not sent within ``PHASE_S * 4`` ends it with an
    error naming the decode process. An exception of a type in ``keep_going`` is answered with
    ``("failed", why)`` and the loop goes on."""
    while True:
        if not conn.poll(PHASE_S * 4):
            raise RuntimeError(f"the decode process sent nothing within {PHASE_S * 4:.0f} s")
        order = conn.recv()
        if order == "exit":
            return
        _, src, dst, iters = order
        try:
            conn.send(("timed", timed(lambda: write(src, dst), iters)))
        except keep_going as e:  # a failed request: reported, the process goes on
            conn.send(("failed", str(e)))


def prefill_role(conn: Connection, device: str, pool: int) -> None:
    """The second process: the prefill cache and its agent; writes what the parent asks."""
    try:
        nixl = nixl_api()
        if device != "cpu":
            import torch

            torch.cuda.set_device(device)
        side = Side(nixl, "prefill", Cache(device, pool, filled=True))
        conn.send(("meta", side.metadata()))
        meta = peer_answer(conn, "meta", "decode process", PHASE_S * 2)
        side.know(*meta)
        conn.send(("ready", None))
        serve_writes(conn, lambda src, dst: side.request("WRITE", src, dst))
    except Exception as e:  # noqa: BLE001 - reported to the parent
        say(f"prefill failed: {type(e).__name__}: {e}")
        conn.send(("error", f"{type(e).__name__}: {e}"))


def answer(conn: Connection, what: str) -> Any:
    """The prefill process's next answer of kind ``what`` (see gpu_bench.peer_answer)."""
    return peer_answer(conn, what, "prefill process", PHASE_S * 2)


def row(op: str, blocks: int, first: float | None, times: list[float], ceiling: float, checked: bool | None,
        error: str) -> dict[str, Any]:
    nbytes = blocks * PLANES * PAGE
    median = statistics.median(times) if times else None
    gbps = nbytes / median / 1e9 if median else None
    return {
        "case": "nixl", "shape": "ucx", "op": op, "blocks": blocks, "bytes": nbytes, "parts": blocks * PLANES,
        "us_per_part": None if median is None else round(median * 1e6 / (blocks * PLANES), 2),
        "first_ms": None if first is None else round(first * 1e3, 2),
        "ms": [round(t * 1e3, 2) for t in times],
        "median_ms": None if median is None else round(median * 1e3, 2),
        "gbps": None if gbps is None else round(gbps, 2),
        "ceiling_gbps": round(ceiling, 2),
        "ratio": None if gbps is None or not ceiling else round(gbps / ceiling, 3),
        "checked": checked, "error": error,
    }


def devices_and_ceilings(device: str, sizes: list[int], bench: str) -> tuple[str, str, dict[int, float]]:
    """The decode and prefill devices (the last GPU and GPU 0, or the host for ``cpu``), and per
    request size the copy ceiling in GB/s (0 on the host); the current device becomes the
    decode GPU. Exits with a message naming ``bench`` where torch or CUDA is missing."""
    if device == "cpu":
        return "cpu", "cpu", {n: 0.0 for n in sizes}
    try:
        import torch
    except ImportError:
        print(f"{bench}: needs torch with CUDA", file=sys.stderr)
        sys.exit(2)
    if not torch.cuda.is_available():
        print(f"{bench}: needs a CUDA device", file=sys.stderr)
        sys.exit(2)
    decode_dev = f"cuda:{torch.cuda.device_count() - 1}"
    ceilings = {n: n * PLANES * PAGE / copy_ceiling_s(torch, n * PLANES * PAGE, 5) / 1e9 for n in sizes}
    torch.cuda.set_device(decode_dev)
    return decode_dev, "cuda:0", ceilings


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    nixl = nixl_api()
    sizes = [int(b) for b in args.blocks.split(",")]
    decode_dev, prefill_dev, ceilings = devices_and_ceilings(args.device, sizes, "kv_nixl_bench")
    say(f"ceilings {ceilings}")
    decode = Side(nixl, "decode", Cache(decode_dev, args.pool, filled=False))
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=prefill_role, args=(child, prefill_dev, args.pool), daemon=True)
    proc.start()
    rows: list[dict[str, Any]] = []
    try:
        meta = answer(conn, "meta")
        conn.send(("meta", decode.metadata()))
        decode.know(*meta)
        answer(conn, "ready")
        say("agents know each other; descriptor lists prepared")
        for op in ("write", "read"):
            for n in sizes:
                src, dst = block_ids(args.pool, n, seed=n)
                decode.cache.zero()
                first, times, error, checked = None, [], "", None
                try:
                    if op == "write":
                        conn.send(("write", src, dst, args.iters))
                        first, times = answer(conn, "timed")
                    else:
                        first, times = timed(lambda: decode.request("READ", dst, src), args.iters)
                    checked = decode.cache.holds(src, dst)
                except Exception as e:  # noqa: BLE001 - reported in the row
                    error = f"{type(e).__name__}: {e}"
                rows.append(row(op, n, first, times, ceilings[n], checked, error))
                print(json.dumps(rows[-1]), flush=True)
                if error and "prefill process" in error:
                    return rows
    finally:
        try:
            conn.send("exit")
        except OSError:
            pass
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--blocks", default="128,2048", help="request sizes in blocks (comma-separated)")
    parser.add_argument("--pool", type=int, default=2560, help="blocks of each cache")
    parser.add_argument("--iters", type=int, default=3, help="timed requests per row (after one warm-up)")
    parser.add_argument("--json", default="", help="append one JSON line per row to this file")
    args = parser.parse_args(argv)
    rows = run(args)
    if args.json:
        append_rows(args.json, rows)
    for r in rows:
        note = "bytes ok" if r["checked"] else ("BYTES WRONG" if r["checked"] is False else "not checked")
        print(f"nixl {r['op']:5} {r['blocks']:>5} blocks: {r['median_ms']} ms/request, {r['gbps']} GB/s, "
              f"ratio {r['ratio']}; {note}{'; ' + r['error'][:160] if r['error'] else ''}")
    return 0 if rows and all(r["checked"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
