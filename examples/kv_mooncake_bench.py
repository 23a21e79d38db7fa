"""KV-cache transfer GPU0 -> GPU1 through Mooncake's transfer engine, the second anchor accord.kv
is measured against (the Python part of scripts/device/kv_mooncake.sh).

Same layout, pool, block ids and requests as kv_nixl_bench.py (and so kv_gpu_bench.py): a
Llama-3-70B-like cache (80 layers, K and V, 8 KV heads, head_dim 128, blocks of 16 tokens, bf16:
32 KiB a piece, 160 pieces a block) of ``--pool`` blocks on each side, requests of N scattered
block ids, every layer's K and V of each block, listed block by block.

Two processes, one ``mooncake.engine.TransferEngine`` each, metadata "P2PHANDSHAKE" (the engines
find each other through their RPC ports, no etcd): this one holds the decode cache on the last
GPU, the second the prefill cache on GPU 0. Each registers its whole cache once; the sessions
(``127.0.0.1:<rpc port>``) and cache addresses go over a pipe. A request is one
``batch_transfer_sync_write_arrays`` (the prefill process writes the blocks into the decode
cache) or ``batch_transfer_sync_read_arrays`` (this process reads them from the prefill cache)
of every piece, its address arrays computed before the clock starts (as NIXL's descriptor lists
are prepared once). Time per request runs from the call to its return; the first request of a
row is a warm-up; the decode cache's bytes are checked after each row.

Transports (``--protocols``, tried in order until one is installed and moves a first request).
The 0.3.14 wheel picks its transport from the environment and the host, not from the protocol
given to ``initialize`` (checked here: "bogus" got TCP), so each attempt sets the environment
that asks for it: ``nvlink_intra`` (the GPU default) sets ``MC_INTRANODE_NVLINK=1`` and
``MC_USE_NVLINK_IPC=1`` (the intra-node NVLink transport of a wheel built with it: CUDA IPC
handles, copies by the copy engine), ``tcp`` sets ``MC_FORCE_TCP=1``. The engine's log says
what it installed ("Using ... transport"); the bench reads that line (the engine's stderr,
captured around ``initialize``), names the row's ``shape`` after it, and counts an attempt whose
engines installed something else as failed. When none works, one row per request size says which
were tried and why each failed.

``--device cpu`` runs the same protocol on host memory over ``tcp`` on loopback (small sizes):
a check of this script where there is no GPU, not a measurement.

Rows go to ``--json`` in kv_gpu_bench.py's format (``case`` "mooncake", ``shape`` the protocol).
``MC_TRANSFER_TIMEOUT`` (the engine's own bound on a transfer, seconds) is set to 60 unless set.
Exits 2 without Mooncake, torch or CUDA, 1 when a check or every protocol failed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from gpu_bench import PeerFailed, append_rows, peer_answer
from kv_gpu_bench import block_ids
from kv_nixl_bench import PAGE, PHASE_S, Cache, devices_and_ceilings, indices, serve_writes, timed
from kv_nixl_bench import row as nixl_row

#: Environment that asks the engine for each transport (others: the engine's own choice).
TRANSPORT_ENV = {
    "nvlink_intra": {"MC_INTRANODE_NVLINK": "1", "MC_USE_NVLINK_IPC": "1"},
    "tcp": {"MC_FORCE_TCP": "1"},
}
GPU_PROTOCOLS = "nvlink_intra"
T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[kv_mooncake_bench +{time.monotonic() - T0:7.2f}s pid {os.getpid()}] {msg}", file=sys.stderr, flush=True)


def mooncake_engine() -> Any:
    """``mooncake.engine``, or exit 2 saying why it is missing."""
    try:
        import mooncake.engine as engine
    except ImportError as e:
        print(f"kv_mooncake_bench: Mooncake is not importable ({e}); pip install mooncake-transfer-engine-cuda13, "
              "or its files unpacked on PYTHONPATH", file=sys.stderr)
        sys.exit(2)
    return engine


def protocol_env(protocol: str) -> dict[str, str]:
    """Environment variables an attempt with ``protocol`` sets in both processes."""
    return dict(TRANSPORT_ENV.get(protocol, {}))


def installed_transports(log: str) -> list[str]:
    """Transports an engine's log says it installed ("Using TCP transport (no HCA detected)",
    "Using Intra-Node NVLink transport (MC_INTRANODE_NVLINK set)", "MC_FORCE_TCP is set, using
    TCP transport only"), as protocol names: tcp, nvlink_intra, rdma, ..."""
    names: list[str] = []
    for words in re.findall(r"[Uu]sing ([A-Za-z0-9 -]+?) transport", log):
        name = words.strip().lower()
        name = {"intra-node nvlink": "nvlink_intra"}.get(name, name.replace(" ", "_").replace("-", "_"))
        if name not in names:
            names.append(name)
    return names


def with_stderr_captured(call: Any) -> tuple[Any, str]:
    """``call()``'s result and what was written to file descriptor 2 meanwhile (the engine logs
    there through glog), which is copied on to stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            result = call()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    sys.stderr.write(text)
    sys.stderr.flush()
    return result, text


def piece_addresses(base: int, pool: int, blocks: list[int]) -> np.ndarray:
    """Addresses of every piece of ``blocks`` in a cache at ``base``, block by block."""
    out = indices(pool, blocks).astype(np.uint64)
    out *= np.uint64(PAGE)
    out += np.uint64(base)
    return out


class Side:
    """One TransferEngine over one cache, registered whole."""

    def __init__(self, engine_mod: Any, protocol: str, cache: Cache) -> None:
        self.cache = cache
        self.engine = engine_mod.TransferEngine()
        rc, log = with_stderr_captured(lambda: self.engine.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, ""))
        if rc != 0:
            raise RuntimeError(f"initialize(127.0.0.1, P2PHANDSHAKE, {protocol}) returned {rc}")
        #: What the engine installed, by its log.
        self.transports = installed_transports(log)
        if protocol in TRANSPORT_ENV and protocol not in self.transports:
            raise RuntimeError(f"asked for {protocol}, the engine installed {self.transports or 'nothing it named'}")
        self.session = f"127.0.0.1:{self.engine.get_rpc_port()}"
        # A GPU cache is registered at its device ("cuda:N", the engine's name for it), then,
        # refused, with the engine finding out itself ("*"); host memory with "*".
        locations = [f"cuda:{cache.dev}", "*"] if cache.device != "cpu" else ["*"]
        refused = []
        for location in locations:
            rc = self.engine.register_memory(cache.addr, cache.nbytes, location)
            if rc == 0:
                break
            refused.append(f"{location}: {rc}")
        else:
            raise RuntimeError(f"register_memory of the {cache.device} cache ({cache.nbytes} bytes) returned "
                               f"{', '.join(refused)}")
        self.peer, self.peer_addr = "", 0

    def meta(self) -> tuple[str, int]:
        return self.session, self.cache.addr

    def know(self, peer: str, peer_addr: int) -> None:
        self.peer, self.peer_addr = peer, peer_addr

    def request(self, op: str, local_blocks: list[int], remote_blocks: list[int]) -> float:
        """Seconds of one synchronous request ``op`` ("write" or "read") of these blocks between
        this cache and the peer's; raises on a non-zero return (the engine bounds each
        transfer by ``MC_TRANSFER_TIMEOUT``)."""
        pool = self.cache.pool
        local = piece_addresses(self.cache.addr, pool, local_blocks)
        remote = piece_addresses(self.peer_addr, pool, remote_blocks)
        lengths = np.full(len(local), PAGE, dtype=np.uint64)
        call = (self.engine.batch_transfer_sync_write_arrays if op == "write"
                else self.engine.batch_transfer_sync_read_arrays)
        t0 = time.perf_counter()
        rc = call(self.peer, local, remote, lengths)
        took = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"Mooncake {op} of {len(local_blocks)} blocks with {self.peer} returned {rc}")
        return took

    def close(self) -> None:
        try:
            self.engine.unregister_memory(self.cache.addr)
        except Exception:  # noqa: BLE001 - best effort before the next attempt
            pass


def prefill_role(conn: Connection, device: str, pool: int, protocol: str, env: dict[str, str]) -> None:
    """The second process: the prefill cache and its engine; writes what the parent asks."""
    try:
        os.environ.update(env)
        if device != "cpu":
            import torch  # first: it loads the libcudart.so.13 the engine links against

            torch.cuda.set_device(device)
        engine_mod = mooncake_engine()
        side = Side(engine_mod, protocol, Cache(device, pool, filled=True))
        say(f"prefill engine: {', '.join(side.transports) or 'no transport named in its log'}")
        conn.send(("meta", side.meta()))
        meta = peer_answer(conn, "meta", "decode process", PHASE_S * 2)
        side.know(*meta)
        conn.send(("ready", None))
        serve_writes(conn, lambda src, dst: side.request("write", src, dst), keep_going=(RuntimeError,))
        side.close()
    except Exception as e:  # noqa: BLE001 - reported to the parent
        say(f"prefill failed: {type(e).__name__}: {e}")
        conn.send(("error", f"{type(e).__name__}: {e}"))


def answer(conn: Connection, what: str) -> Any:
    """The prefill process's next answer of kind ``what``; a request it could not do raises
    PeerFailed, anything else RuntimeError."""
    return peer_answer(conn, what, "prefill process", PHASE_S * 2)


def row(protocol: str, op: str, blocks: int, first: float | None, times: list[float], ceiling: float,
        checked: bool | None, error: str) -> dict[str, Any]:
    return {**nixl_row(op, blocks, first, times, ceiling, checked, error), "case": "mooncake", "shape": protocol}


def attempt(engine_mod: Any, protocol: str, args: argparse.Namespace, decode_cache: Cache, prefill_dev: str,
            sizes: list[int], ceilings: dict[int, float]) -> tuple[list[dict[str, Any]], str]:
    """Every row with ``protocol``; returns (rows, "") or, when the protocol did not get as far
    as one good request, ([], why)."""
    env = protocol_env(protocol)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=prefill_role, args=(child, prefill_dev, args.pool, protocol, env), daemon=True)
    proc.start()
    rows: list[dict[str, Any]] = []
    decode: Side | None = None
    try:
        try:
            decode = Side(engine_mod, protocol, decode_cache)
            meta = answer(conn, "meta")
            conn.send(("meta", decode.meta()))
            decode.know(*meta)
            answer(conn, "ready")
        except RuntimeError as e:
            return [], f"setup: {e}"
        shape = "+".join(decode.transports) or protocol
        say(f"{protocol}: engines up, sessions {decode.session} and {decode.peer}; decode engine: {shape}")
        for op in ("write", "read"):
            for n in sizes:
                if args.budget_s and time.monotonic() - T0 > args.budget_s:
                    rows.append(row(shape, op, n, None, [], ceilings[n], None,
                                    f"skipped: the run's {args.budget_s:.0f} s were spent"))
                    print(json.dumps(rows[-1]), flush=True)
                    if args.json:
                        append_rows(args.json, rows[-1:])
                    continue
                src, dst = block_ids(args.pool, n, seed=n)
                decode_cache.zero()
                first, times, error, checked, fatal = None, [], "", None, False
                try:
                    if op == "write":
                        conn.send(("write", src, dst, args.iters))
                        first, times = answer(conn, "timed")
                    else:
                        first, times = timed(lambda: decode.request("read", dst, src), args.iters)
                    checked = decode_cache.holds(src, dst)
                except RuntimeError as e:
                    if not any(r["checked"] for r in rows):
                        return [], f"{op} of {n} blocks: {e}"
                    error, fatal = f"{type(e).__name__}: {e}", not isinstance(e, PeerFailed)
                rows.append(row(shape, op, n, first, times, ceilings[n], checked, error))
                print(json.dumps(rows[-1]), flush=True)
                if args.json:  # each row as it comes: a run cut by its cap keeps what it measured
                    append_rows(args.json, rows[-1:])
                if fatal:
                    return rows, ""
        return rows, ""
    finally:
        if decode is not None:
            decode.close()
        try:
            conn.send("exit")
        except OSError:
            pass
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    os.environ.setdefault("MC_TRANSFER_TIMEOUT", "60")
    os.environ.setdefault("GLOG_logtostderr", "1")
    sizes = [int(b) for b in args.blocks.split(",")]
    decode_dev, prefill_dev, ceilings = devices_and_ceilings(args.device, sizes, "kv_mooncake_bench")
    protocols = args.protocols or ("tcp" if args.device == "cpu" else GPU_PROTOCOLS)
    # After torch: it loads the libcudart.so.13 the engine links against.
    engine_mod = mooncake_engine()
    say(f"ceilings {ceilings}")
    decode_cache = Cache(decode_dev, args.pool, filled=False)
    tried: list[str] = []
    for protocol in [p.strip() for p in protocols.split(",") if p.strip()]:
        env = protocol_env(protocol)
        say(f"trying {protocol} {' '.join(f'{k}={v}' for k, v in env.items())}".rstrip())
        rows, why = attempt(engine_mod, protocol, args, decode_cache, prefill_dev, sizes, ceilings)
        if rows:
            return rows
        say(f"{protocol} did not work: {why}")
        tried.append(f"{protocol}: {why}")
    error = "no protocol worked; tried " + "; ".join(tried)
    return [row("none", op, n, None, [], ceilings[n], None, error) for op in ("write", "read") for n in sizes]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--protocols", default="",
                        help=f"protocols to try in order (default: {GPU_PROTOCOLS} on a GPU, tcp with --device cpu)")
    parser.add_argument("--blocks", default="128,2048", help="request sizes in blocks (comma-separated)")
    parser.add_argument("--pool", type=int, default=2560, help="blocks of each cache")
    parser.add_argument("--iters", type=int, default=3, help="timed requests per row (after one warm-up)")
    parser.add_argument("--json", default="", help="append one JSON line per row to this file, as each is done")
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="seconds after which the rows not started yet are skipped (0: no limit)")
    args = parser.parse_args(argv)
    if args.iters < 1:
        parser.error(f"--iters must be at least 1, got {args.iters}")
    rows = run(args)
    if args.json and rows and rows[0]["shape"] == "none":  # the rows of a run that moved nothing
        append_rows(args.json, rows)
    for r in rows:
        note = "bytes ok" if r["checked"] else ("BYTES WRONG" if r["checked"] is False else "not checked")
        print(f"mooncake {r['shape']} {r['op']:5} {r['blocks']:>5} blocks: {r['median_ms']} ms/request, "
              f"{r['gbps']} GB/s, ratio {r['ratio']}; {note}{'; ' + r['error'][:300] if r['error'] else ''}")
    return 0 if rows and all(r["checked"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
