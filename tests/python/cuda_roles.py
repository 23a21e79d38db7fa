"""Process bodies of the CUDA tensor tests across processes (a module of its own so `spawn` can
import it): a receiver that registers a CUDA tensor, hands its descriptor to the test, waits for
the write's immediate and reports whether the tensor holds what the writer sent; and a KV
prefill process with a CUDA cache that the test pulls from and that pushes into the test's."""

from __future__ import annotations

import traceback
from multiprocessing.connection import Connection
from typing import Any

import accord

IMM = 21
WAIT_S = 30.0


def cuda_receiver(conn: Connection, device: int, count: int) -> None:
    try:
        import torch

        with accord.Engine(ignore_env=True) as engine:
            dst = torch.zeros(count, dtype=torch.float32, device=f"cuda:{device}")
            region = engine.register(dst)
            conn.send({"address": engine.address, "region": region.descriptor})
            engine.add_peer(conn.recv())
            engine.imm_counter(IMM).wait(1, timeout=WAIT_S)
            torch.cuda.synchronize(device)
            want = torch.arange(count, dtype=torch.float32, device=f"cuda:{device}")
            conn.send({"ok": bool(torch.equal(dst, want))})
            conn.recv()  # the writer is done with our region: release it
            region.close()
    except Exception:  # noqa: BLE001 - reported to the test
        conn.send({"error": traceback.format_exc()})


def kv_pattern(shape: tuple[int, ...], seed: int, device: str) -> Any:
    """The deterministic bf16 contents of a KV cache (the same in every process)."""
    import torch as t

    n = 1
    for d in shape:
        n *= d
    values = (t.arange(n, dtype=t.float32, device=device) * 7 + seed).remainder(251) - 125
    return values.to(t.bfloat16).reshape(shape)


def kv_prefill(conn: Connection, device: int, layout_args: tuple[int, int, int, int], num_blocks: int,
               device_ipc: bool) -> None:
    """A prefill process: a CUDA KV cache on GPU ``device``, pulled from by the test's decode
    engine, then pushing the blocks the test names into the decode cache (its ``KvTarget``)."""
    try:
        import os

        import torch

        from accord.kv import KvLayout, PrefillCache

        os.environ["ACCORD_DEVICE_IPC"] = "1" if device_ipc else "0"
        layout = KvLayout(*layout_args, dtype="bfloat16")
        with accord.Engine() as engine:
            cache = kv_pattern(layout.shape(num_blocks), 3, f"cuda:{device}")
            torch.cuda.synchronize(device)
            prefill = PrefillCache(engine, layout, num_blocks, cache=cache)
            conn.send({"source": prefill.source})
            engine.add_peer(conn.recv())  # the decode engine: reads are answered to it
            while True:
                order = conn.recv()
                if order == "exit":
                    break
                if order == "stats":
                    conn.send(engine.stats())
                    continue
                target, src, dst, imm = order
                prefill.push(target, src, dst, request="from-child", imm=imm).wait(timeout=WAIT_S)
                conn.send({"pushed": True})
            prefill.close()
    except Exception:  # noqa: BLE001 - reported to the test
        conn.send({"error": traceback.format_exc()})


def weight_receiver(conn: Connection, device: int, shapes: dict[str, tuple[int, ...]], versions: int) -> None:
    """An inference rank of accord.weights on CUDA: registers zeroed bf16 tensors, sends its
    manifest, attaches to the pusher, and for each version waits for it, reports whether every
    tensor holds ``weight_pattern`` of that version, and acks."""
    try:
        import torch

        from accord.weights import WeightReceiver

        with accord.Engine() as engine:
            copies = {n: torch.zeros(s, dtype=torch.bfloat16, device=f"cuda:{device}") for n, s in shapes.items()}
            receiver = WeightReceiver(engine, copies)
            conn.send({"manifest": receiver.manifest()})
            receiver.attach(conn.recv())
            conn.send({"attached": True})  # over the network, writes land only from a known pusher
            for version in range(1, versions + 1):
                receiver.wait(version, timeout=WAIT_S)
                torch.cuda.synchronize(device)
                wrong = [n for i, (n, t) in enumerate(copies.items())
                         if not torch.equal(t, weight_pattern(i, version, t.shape, f"cuda:{device}"))]
                receiver.ack(version)
                conn.send({"version": version, "wrong": wrong})
            conn.recv()  # the pusher is done
            receiver.close()
    except Exception:  # noqa: BLE001 - reported to the test
        conn.send({"error": traceback.format_exc()})


def weight_pattern(index: int, version: int, shape: tuple[int, ...], device: str) -> Any:
    """Tensor ``index``'s bf16 values at ``version`` (small integers: exact in bf16)."""
    import torch as t

    n = 1
    for d in shape:
        n *= d
    at = t.arange(n, dtype=t.int32, device=device)
    return ((at * 7 + index * 13 + version * 31) % 251 - 125).to(t.bfloat16).reshape(shape)
