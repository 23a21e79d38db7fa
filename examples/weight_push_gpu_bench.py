"""Weight push GPU0 -> GPU1 with accord.weights, against the copy ceiling and against a
``torch.distributed.broadcast`` loop over NCCL (the Python part of scripts/device/weights_gpu.sh).

Two processes, as in RL: the trainer (this process) holds the fresh weights on ``cuda:0``, the
inference process holds its copy on the last GPU. The weights are a Llama-70B-like shard list
(a tensor-parallel shard of 1/8: per layer q, k, v, o, gate, up, down and two norms, plus the
embedding, the final norm and the LM head; 723 tensors), the big tensors' rows scaled so that
the whole is ``--gb`` GB of bf16 (16 by default: about what one 70B TP-8 shard is). Every
version's tensors hold a pattern of (tensor, version, position); the inference process checks
every byte of every tensor after each version.

Measured, per update (``--iters`` timed after one warm-up, medians reported):

- ``accord``: ``WeightPusher.push(version)`` (one write a tensor, the version in every write's
  immediate) until the inference process's ``WeightReceiver.wait(version)`` returned. Time runs
  from the push's start in the trainer to the wait's return in the receiver (both read
  ``time.monotonic``, one clock on one host). Before the next push the receiver acks, as the
  protocol requires (not timed).
- ``nccl``: every tensor ``dist.broadcast`` from rank 0 to rank 1, then a synchronisation of the
  receiver's GPU, timed the same way; the receiver checks the first update's bytes.
- ``ceiling``: one contiguous ``copy_`` of the same bytes GPU0 -> GPU1 in the trainer.

``--case ipc`` is the route the engine picks on one host (device writes through CUDA IPC);
``--case network`` is meant for ``ACCORD_DEVICE_IPC=0 ACCORD_SHM=0`` in the environment (staged,
loopback UDP, landed), where NCCL is skipped (``--no-nccl`` skips it anywhere). Prints a table
and one JSON line per run to ``--json``; ``--table FILE...`` prints earlier runs' table.

    python examples/weight_push_gpu_bench.py --gb 16 --iters 3 --json out.jsonl

Exits 2 ("skipped: ...") without torch or without two CUDA devices, 1 when a byte was wrong
or a phase failed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from gpu_bench import append_rows, cell, check_note, copy_ceiling_s, peer_answer, read_rows

#: Llama-3-70B: hidden size, MLP size, layers, attention heads, KV heads, head size, vocabulary.
HIDDEN, MLP, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 8192, 28672, 80, 64, 8, 128, 128256
#: Tensor-parallel degree of the shard the list is made from.
TP = 8
ITEM = 2  # bf16
#: Seconds any one phase (an update, a check, a handshake) may take before the run fails naming it.
PHASE_S = 300.0
#: Longest wait for each step of the teardown (the inference process's goodbye, its exit), seconds.
TEARDOWN_S = 20.0


@dataclass(frozen=True)
class Tensor:
    """One weight of the shard: its name and shape (bf16)."""

    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * ITEM


def full_shard() -> list[Tensor]:
    """The unscaled TP-8 shard of a Llama-3-70B-like model (723 tensors, about 17.6 GB)."""
    q, kv, mlp, vocab = HEADS * HEAD_DIM // TP, KV_HEADS * HEAD_DIM // TP, MLP // TP, VOCAB // TP
    out = [Tensor("model.embed_tokens.weight", (vocab, HIDDEN))]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out += [
            Tensor(p + "input_layernorm.weight", (HIDDEN,)),
            Tensor(p + "self_attn.q_proj.weight", (q, HIDDEN)),
            Tensor(p + "self_attn.k_proj.weight", (kv, HIDDEN)),
            Tensor(p + "self_attn.v_proj.weight", (kv, HIDDEN)),
            Tensor(p + "self_attn.o_proj.weight", (HIDDEN, q)),
            Tensor(p + "post_attention_layernorm.weight", (HIDDEN,)),
            Tensor(p + "mlp.gate_proj.weight", (mlp, HIDDEN)),
            Tensor(p + "mlp.up_proj.weight", (mlp, HIDDEN)),
            Tensor(p + "mlp.down_proj.weight", (HIDDEN, mlp)),
        ]
    out += [Tensor("model.norm.weight", (HIDDEN,)), Tensor("lm_head.weight", (vocab, HIDDEN))]
    return out


def shard_list(gb: float) -> list[Tensor]:
    """The shard with every matrix's first dimension scaled so the whole is about ``gb`` GB
    (10^9 bytes); norms keep their size, every tensor keeps at least one row. The tensor count
    and the spread of sizes stay those of the real shard."""
    if not gb > 0:
        raise ValueError(f"--gb must be positive, got {gb}")
    full = full_shard()
    fixed = sum(t.nbytes for t in full if len(t.shape) == 1)
    scalable = sum(t.nbytes for t in full if len(t.shape) > 1)
    factor = max(0.0, gb * 1e9 - fixed) / scalable
    out = []
    for t in full:
        if len(t.shape) == 1:
            out.append(t)
        else:
            out.append(Tensor(t.name, (max(1, round(t.shape[0] * factor)), *t.shape[1:])))
    return out


def need_cuda(gpus: int = 2) -> Any:
    """torch with ``gpus`` CUDA devices, or exit 2 saying what is missing."""
    try:
        import torch
    except ImportError as e:
        print(f"skipped: weight_push_gpu_bench needs torch with CUDA ({e})", file=sys.stderr)
        sys.exit(2)
    if not torch.cuda.is_available() or torch.cuda.device_count() < gpus:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        print(f"skipped: weight_push_gpu_bench needs {gpus} CUDA devices, torch sees {count}", file=sys.stderr)
        sys.exit(2)
    return torch


def pattern(torch: Any, index: int, version: int, numel: int, device: str) -> Any:
    """Tensor ``index``'s values at ``version``: small integers (exact in bf16) that differ by
    tensor, version and position, so a misplaced, stale or missing byte shows."""
    at = torch.arange(numel, device=device, dtype=torch.int32)
    return ((at * 7 + index * 13 + version * 31) % 251 - 125).to(torch.bfloat16)


def fill(torch: Any, tensors: list[Any], version: int) -> None:
    for i, t in enumerate(tensors):
        t.view(-1).copy_(pattern(torch, i, version, t.numel(), str(t.device)))
    torch.cuda.synchronize(tensors[0].device)


def wrong(torch: Any, tensors: list[Any], version: int) -> list[int]:
    """Indices of the tensors whose bytes are not ``version``'s pattern."""
    torch.cuda.synchronize(tensors[0].device)
    return [i for i, t in enumerate(tensors) if not torch.equal(t.view(-1), pattern(torch, i, version, t.numel(), str(t.device)))]


def expect(conn: Connection, what: str, timeout: float = PHASE_S) -> Any:
    """The peer's next message, which must be ``(what, value)``; fails naming the phase."""
    return peer_answer(conn, what, "inference process", timeout)


def inference_role(conn: Connection, shapes: list[tuple[int, ...]], nccl_port: int, use_nccl: bool) -> None:
    """The second process: the inference copy on the last GPU."""
    try:
        torch = need_cuda()
        import accord
        from accord.weights import WeightReceiver

        device = f"cuda:{torch.cuda.device_count() - 1}"
        torch.cuda.set_device(device)
        tensors = [torch.zeros(s, dtype=torch.bfloat16, device=device) for s in shapes]
        with accord.Engine() as engine:
            receiver = WeightReceiver(engine, {str(i): t for i, t in enumerate(tensors)})
            conn.send(("manifest", receiver.manifest()))
            receiver.attach(expect_order(conn, "info"))
            while True:
                kind, order = expect_order_any(conn)
                if kind == "done":
                    break
                version, check = order
                conn.send(("ready", version))
                receiver.wait(version, timeout=PHASE_S)
                landed = time.monotonic()
                bad = wrong(torch, tensors, version) if check else []
                receiver.ack(version)
                conn.send(("landed", (landed, bad)))
            receiver.close()
        if use_nccl:
            inference_nccl(torch, conn, tensors, nccl_port)
        conn.send(("bye", None))
    except Exception as e:  # noqa: BLE001 - reported to the trainer
        conn.send(("error", f"{type(e).__name__}: {e}"))


def expect_order_any(conn: Connection) -> tuple[str, Any]:
    """The trainer's next order as ``(kind, value)``, waited for at most ``PHASE_S``."""
    if not conn.poll(PHASE_S):
        raise RuntimeError(f"the trainer sent nothing within {PHASE_S:.0f} s")
    kind, value = conn.recv()
    return kind, value


def expect_order(conn: Connection, what: str) -> Any:
    """The value of the trainer's next order, which must be of kind ``what``."""
    kind, value = expect_order_any(conn)
    if kind != what:
        raise RuntimeError(f"expected {what!r} from the trainer, got {kind!r}")
    return value


def nccl_join(torch: Any, rank: int, port: int, device: Any) -> Any:
    """Joins the two-rank NCCL group (rank 0: the trainer); returns ``torch.distributed``."""
    import torch.distributed as dist

    torch.cuda.set_device(device)
    init = f"tcp://127.0.0.1:{port}"
    try:
        dist.init_process_group("nccl", init_method=init, rank=rank, world_size=2, device_id=torch.device(device))
    except TypeError:  # a torch before 2.3 has no device_id: the current device serves
        dist.init_process_group("nccl", init_method=init, rank=rank, world_size=2)
    return dist


def nccl_update(torch: Any, dist: Any, tensors: list[Any]) -> float:
    """One update as RL frameworks do it today: every tensor broadcast from rank 0, then the
    GPU synchronised. Both ranks call it; returns when the update started (after a barrier)."""
    dist.barrier()
    start = time.monotonic()
    for t in tensors:
        dist.broadcast(t, src=0)
    torch.cuda.synchronize(tensors[0].device)
    return start


def inference_nccl(torch: Any, conn: Connection, tensors: list[Any], port: int) -> None:
    """Rank 1 of the broadcast loop: one update per order, reporting when its GPU had every byte."""
    dist = nccl_join(torch, 1, port, tensors[0].device)
    try:
        while True:
            kind, value = expect_order_any(conn)
            if kind == "nccl_done":
                break
            version, check = value
            nccl_update(torch, dist, tensors)
            landed = time.monotonic()
            conn.send(("nccl_landed", (landed, wrong(torch, tensors, version) if check else [])))
    finally:
        dist.destroy_process_group()


def run(args: argparse.Namespace, emit: Any) -> dict[str, Any]:
    """Measures, hands the row to ``emit`` as soon as the measuring is over (before NCCL's and
    the second process's teardown, which once outlasted a 100 s cap after every update was
    printed), then tears down, each wait bounded by ``TEARDOWN_S``; returns the row."""
    torch = need_cuda()
    tensors_spec = shard_list(args.gb)
    total = sum(t.nbytes for t in tensors_spec)
    case = args.case
    use_nccl = not args.no_nccl and case != "network"
    print(f"weight push: {len(tensors_spec)} tensors, {total / 1e9:.2f} GB bf16, case {case}, "
          f"ACCORD_DEVICE_IPC={os.environ.get('ACCORD_DEVICE_IPC')} ACCORD_SHM={os.environ.get('ACCORD_SHM')}",
          flush=True)
    ceiling = copy_ceiling_s(torch, total, 5)
    print(f"ceiling: {ceiling * 1e3:.2f} ms ({total / ceiling / 1e9:.1f} GB/s)", flush=True)
    import accord
    from accord.weights import WeightPusher

    torch.cuda.set_device(0)
    tensors = [torch.empty(t.shape, dtype=torch.bfloat16, device="cuda:0") for t in tensors_spec]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=inference_role, args=(child, [t.shape for t in tensors_spec], port, use_nccl),
                       daemon=True)
    proc.start()
    accord_times: list[float] = []
    nccl_times: list[float] = []
    bad: dict[str, list[int]] = {}
    error = ""
    dist: Any = None  # torch.distributed, once this process joined the NCCL group
    row: dict[str, Any] | None = None
    try:
        manifest = expect(conn, "manifest")
        with accord.Engine() as engine:
            pusher = WeightPusher(engine, {str(i): t for i, t in enumerate(tensors)}, [manifest])
            conn.send(("info", pusher.info()))
            for it in range(args.iters + 1):
                version = it + 1
                fill(torch, tensors, version)
                conn.send(("update", (version, not args.no_check)))
                expect(conn, "ready")
                start = time.monotonic()
                handle = pusher.push(version, ack_timeout=PHASE_S)
                landed, wrong_here = expect(conn, "landed")
                handle.wait(timeout=PHASE_S)
                if wrong_here:
                    bad.setdefault(f"accord v{version}", wrong_here)
                if it > 0:
                    accord_times.append(landed - start)
                print(f"accord update {version}: {(landed - start) * 1e3:.2f} ms"
                      f"{' (warm-up)' if it == 0 else ''}; bytes {'WRONG ' + str(wrong_here[:5]) if wrong_here else 'ok'}",
                      flush=True)
            conn.send(("done", None))
            pusher.close()
        if use_nccl:
            dist = nccl_join(torch, 0, port, "cuda:0")
            for it in range(args.iters + 1):
                version = 1000 + it
                fill(torch, tensors, version)
                conn.send(("nccl", (version, it == 0 and not args.no_check)))
                start = nccl_update(torch, dist, tensors)
                landed, wrong_here = expect(conn, "nccl_landed")
                if wrong_here:
                    bad.setdefault(f"nccl v{version}", wrong_here)
                if it > 0:
                    nccl_times.append(landed - start)
                print(f"nccl update {it}: {(landed - start) * 1e3:.2f} ms{' (warm-up)' if it == 0 else ''}", flush=True)
            conn.send(("nccl_done", None))
    except Exception as e:  # noqa: BLE001 - reported in the row
        error = f"{type(e).__name__}: {e}"
        print(f"failed: {error}", file=sys.stderr, flush=True)
    row = result_row(case, len(tensors_spec), total, ceiling, accord_times, nccl_times, bad, error)
    emit(row)
    teardown_start = time.monotonic()
    try:
        # Both ranks leave the NCCL group at once (the second process does on "nccl_done"),
        # then the second process says goodbye.
        if dist is not None and dist.is_initialized():
            # In a thread, so a destroy that never returns costs TEARDOWN_S, not the run's cap.
            leaving = threading.Thread(target=dist.destroy_process_group, daemon=True)
            leaving.start()
            leaving.join(TEARDOWN_S)
            if leaving.is_alive():
                print(f"teardown: NCCL's destroy_process_group did not return within {TEARDOWN_S:.0f} s", flush=True)
        if not error:
            expect(conn, "bye", timeout=TEARDOWN_S)
    except Exception as e:  # noqa: BLE001 - the row is out; the teardown only reports
        print(f"teardown: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    finally:
        proc.join(timeout=TEARDOWN_S)
        if proc.is_alive():
            print(f"teardown: the inference process did not exit within {TEARDOWN_S:.0f} s; killed", flush=True)
            proc.kill()
            proc.join(timeout=10)
    print(f"teardown: {time.monotonic() - teardown_start:.1f} s", flush=True)
    return row


def result_row(case: str, count: int, total: int, ceiling: float, accord_times: list[float],
               nccl_times: list[float], bad: dict[str, list[int]], error: str) -> dict[str, Any]:
    """One JSON row: medians in ms, GB/s, accord's time over the ceiling's and NCCL's over accord's."""
    a = statistics.median(accord_times) if accord_times else None
    n = statistics.median(nccl_times) if nccl_times else None

    def ms(v: float | None) -> float | None:
        return None if v is None else round(v * 1e3, 2)

    # The trainer's engine does the copies: its copy shape (ACCORD_DEVICE_COPY_STREAMS /
    # ACCORD_DEVICE_COPY_BATCH_2D, "-": the engine's default) is the row's.
    shape = f"{os.environ.get('ACCORD_DEVICE_COPY_STREAMS', '-')}/{os.environ.get('ACCORD_DEVICE_COPY_BATCH_2D', '-')}"
    return {
        "case": case, "shape": shape, "tensors": count, "bytes": total,
        "ceiling_ms": ms(ceiling), "ceiling_gbps": round(total / ceiling / 1e9, 2),
        "accord_ms": [ms(t) for t in accord_times], "accord_median_ms": ms(a),
        "accord_gbps": None if a is None else round(total / a / 1e9, 2),
        "nccl_ms": [ms(t) for t in nccl_times], "nccl_median_ms": ms(n),
        "nccl_gbps": None if n is None else round(total / n / 1e9, 2),
        "over_ceiling": None if a is None else round(a / ceiling, 3),
        "nccl_over_accord": None if a is None or n is None else round(n / a, 3),
        "checked": not bad and not error and a is not None, "wrong": bad, "error": error,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'case':8} {'shape':5} {'tensors':>7} {'GB':>6} {'ceiling ms':>10} {'accord ms':>9} {'GB/s':>7} {'x ceiling':>9} "
          f"{'nccl ms':>8} {'nccl/accord':>11}  note")
    for r in rows:
        note = check_note(r["checked"], bool(r["wrong"]), r["error"])
        print(f"{r['case']:8} {r.get('shape', '-'):5} {r['tensors']:>7} {r['bytes'] / 1e9:>6.2f} {cell(r['ceiling_ms']):>10} "
              f"{cell(r['accord_median_ms']):>9} {cell(r['accord_gbps']):>7} {cell(r['over_ceiling']):>9} "
              f"{cell(r['nccl_median_ms']):>8} {cell(r['nccl_over_accord']):>11}  {note}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=["ipc", "network"], default="ipc",
                        help="a label for the route; run 'network' with ACCORD_DEVICE_IPC=0 ACCORD_SHM=0")
    parser.add_argument("--gb", type=float, default=16.0, help="GB (10^9 bytes) of bf16 weights to push")
    parser.add_argument("--iters", type=int, default=3, help="timed updates after one warm-up")
    parser.add_argument("--no-nccl", action="store_true", help="skip the torch.distributed broadcast loop")
    parser.add_argument("--no-check", action="store_true", help="skip the byte checks after each accord update")
    parser.add_argument("--json", default="", help="append the run's JSON line to this file")
    parser.add_argument("--table", nargs="*", help="print the table of these JSON-lines files and exit")
    args = parser.parse_args(argv)
    if not args.gb > 0:
        parser.error(f"--gb must be positive, got {args.gb}")
    if args.iters < 1:
        parser.error(f"--iters must be at least 1, got {args.iters}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.table is not None:
        rows = read_rows(args.table)
        print_table(rows)
        return 0 if all(r["checked"] for r in rows) else 1
    def emit(row: dict[str, Any]) -> None:
        print(json.dumps(row), flush=True)
        if args.json:
            append_rows(args.json, [row])
        print_table([row])

    row = run(args, emit)
    return 0 if row["checked"] else 1


if __name__ == "__main__":
    sys.exit(main())
