"""Weight push: 2 trainer processes update 2 inference processes with one-sided writes.

The model is a few float32 tensors laid out back to back in one flat buffer. Each trainer owns
a contiguous half of every tensor's rows (its shard). Every inference process holds the whole
model in one registered buffer. Before any data moves, a static plan is computed from the
layout alone: for each (trainer, inference) pair, the list of (source offset, destination
offset, bytes) ranges, one per tensor. Each round, every trainer pushes its shard to every
inference process with a single scatter whose writes carry the round's immediate; an
inference process knows the round landed when that immediate's counter reaches the number of
plan entries aimed at it, checks every weight, and a barrier of all four engines ends the
round so the next one cannot overwrite weights still being checked. Exits non-zero on any
mismatch.

    python examples/weight_push.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

import accord
from _processes import finish

TRAINERS = 2
INFERENCE = 2
SHAPES = [(512, 256), (256, 256), (1024, 64), (2048,)]  # float32 tensors of the model
ITEM = 4
IMM_ROUND_BASE = 100  # round k lands immediate IMM_ROUND_BASE + k
IMM_BARRIER = 0xBA55
WAIT_S = 30.0


@dataclass(frozen=True)
class Range:
    """One planned write: bytes [src_offset, +nbytes) of the trainer's shard buffer go to
    [dst_offset, +nbytes) of the inference buffer."""

    src_offset: int
    dst_offset: int
    nbytes: int


def tensor_offsets() -> list[int]:
    """Byte offset of each tensor in the flat model."""
    offsets, at = [], 0
    for shape in SHAPES:
        offsets.append(at)
        at += int(np.prod(shape)) * ITEM
    return offsets + [at]


def shard_ranges(trainer: int) -> list[tuple[int, int]]:
    """(offset in the model, bytes) of trainer's half of each tensor's rows."""
    ranges = []
    for shape, offset in zip(SHAPES, tensor_offsets()):
        rows = shape[0]
        row_bytes = int(np.prod(shape[1:])) * ITEM if len(shape) > 1 else ITEM
        lo, hi = rows * trainer // TRAINERS, rows * (trainer + 1) // TRAINERS
        ranges.append((offset + lo * row_bytes, (hi - lo) * row_bytes))
    return ranges


def static_plan(trainer: int) -> list[Range]:
    """The writes of one trainer to any one inference process (the same for each)."""
    plan, src = [], 0
    for model_offset, nbytes in shard_ranges(trainer):
        plan.append(Range(src_offset=src, dst_offset=model_offset, nbytes=nbytes))
        src += nbytes
    return plan


def model(round_: int) -> np.ndarray:
    """The whole model after round `round_` of training (deterministic), as bytes."""
    total = tensor_offsets()[-1] // ITEM
    return np.random.default_rng(round_).standard_normal(total, dtype=np.float32).view(np.uint8)


def trainer(conn: Connection, index: int, rounds: int) -> None:
    with accord.Engine() as engine:
        plan = static_plan(index)
        shard = np.zeros(sum(r.nbytes for r in plan), dtype=np.uint8)
        with engine.register(shard) as region:
            conn.send(("trainer", index, engine.address, None))
            directory = conn.recv()  # every engine's address; inference descriptors
            for address, _ in directory:
                if address.id != engine.id:
                    engine.add_peer(address)
            ids = [address.id for address, _ in directory]
            inference = [d for _, d in directory if d is not None]
            for k in range(1, rounds + 1):
                weights = model(k)
                for r in plan:  # "train": this round's shard
                    shard[r.src_offset : r.src_offset + r.nbytes] = weights[r.dst_offset : r.dst_offset + r.nbytes]
                dsts = [
                    accord.ScatterDst(d, nbytes=r.nbytes, dst_offset=r.dst_offset, src_offset=r.src_offset)
                    for d in inference
                    for r in plan
                ]
                engine.scatter(region, dsts, imm=IMM_ROUND_BASE + k).wait(timeout=WAIT_S)
                engine.barrier(ids, imm=IMM_BARRIER, timeout=WAIT_S)
            conn.send(0)
            conn.recv()  # exit only once every process left the last barrier (see main)


def inference(conn: Connection, index: int, rounds: int) -> None:
    with accord.Engine() as engine:
        weights = np.zeros(tensor_offsets()[-1], dtype=np.uint8)
        with engine.register(weights) as region:
            conn.send(("inference", index, engine.address, region.descriptor))
            directory = conn.recv()
            for address, _ in directory:
                if address.id != engine.id:
                    engine.add_peer(address)
            ids = [address.id for address, _ in directory]
            writes_per_round = sum(len(static_plan(t)) for t in range(TRAINERS))
            bad = 0
            for k in range(1, rounds + 1):
                engine.imm_counter(IMM_ROUND_BASE + k).wait(writes_per_round, timeout=WAIT_S)
                mismatched = int(np.count_nonzero(weights != model(k)))
                bad += mismatched
                engine.barrier(ids, imm=IMM_BARRIER, timeout=WAIT_S)
            conn.send(bad)
            conn.recv()  # exit only once every process left the last barrier (see main)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    conns, procs = [], []
    for role, count in ((trainer, TRAINERS), (inference, INFERENCE)):
        for i in range(count):
            parent, child = ctx.Pipe()
            conns.append(parent)
            procs.append(ctx.Process(target=role, args=(child, i, args.rounds), name=f"{role.__name__}{i}"))
    for p in procs:
        p.start()
    hellos = [c.recv() if c.poll(WAIT_S) else None for c in conns]
    bad_total = -1
    if all(hellos):
        directory = [(address, descriptor) for _, _, address, descriptor in hellos]  # type: ignore[misc]
        for c in conns:
            c.send(directory)
        reports = [c.recv() if c.poll(WAIT_S * 2) else -1 for c in conns]
        bad_total = -1 if -1 in reports else sum(reports)
        # A process that returned from the last barrier may still owe a peer the acknowledgement
        # of that peer's barrier note; only when all returned is every note acknowledged, so
        # nobody closes its engine before then.
        for c in conns:
            with contextlib.suppress(OSError):  # a process that failed is gone already
                c.send("exit")
    model_bytes = tensor_offsets()[-1]
    summary = f"weight_push: {TRAINERS} trainers -> {INFERENCE} inference, {args.rounds} rounds of {model_bytes} B"
    verified = "every round verified on every inference process"
    return finish(procs, bad_total, WAIT_S, summary, "mismatched bytes", verified)


if __name__ == "__main__":
    sys.exit(main())
