"""Weight push: a trainer updates inference ranks' copies of N named tensors with one-sided writes.

The shape RL frameworks need after each optimizer step: the trainer holds the fresh weights, each
inference rank holds its copy, and an update must never be read half old, half new.

- A **receiver** registers its tensors (numpy arrays, or anything with the buffer protocol) and
  publishes a manifest: its engine's address and, per tensor name, a descriptor and its size.
- The **pusher** (the trainer) registers its tensors once, checks every receiver's manifest
  against them (same names, same byte sizes: a mismatch is an error naming the tensor) and
  computes a static plan: one write per tensor per receiver. ``push(version)`` then submits the
  whole plan at once (the engine pipelines the writes over its lanes) and returns a handle.
- **The version travels in the immediate** of every write of that update:
  ``imm = imm_base | (version & 0xFFFF)``. A receiver's ``wait(version)`` returns once that
  immediate was counted once per tensor, which the engine does only after each write's bytes
  landed, so every byte of that version is in place.
- **No reader mixes two versions**: after reading a version, each receiver ``ack``s it (a
  zero-byte write to the pusher carrying the version); ``push(v + 1)`` first waits for every
  receiver's ack of ``v``, bounded, naming the receivers that did not ack. The receiver's counter
  for a version is released after its ack, so the 16-bit version space wraps safely.
- A peer that goes away fails the push or the wait (``accord.PeerError`` or
  ``accord.TimeoutError`` naming it); the process survives.

    receiver = WeightReceiver(engine, {"w1": w1, "b1": b1})
    manifest = receiver.manifest()          # send to the trainer (it pickles)
    pusher = WeightPusher(engine_t, {"w1": w1_t, "b1": b1_t}, [manifest])
    receiver.attach(pusher.info())          # where acks go
    pusher.push(1).wait()
    receiver.wait(1); ...read...; receiver.ack(1)
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accord._accord import Address, Descriptor, Engine, MemoryRegion, Transfer
from accord.errors import InvalidRequestError, TimeoutError

__all__ = ["IMM_BASE_DEFAULT", "PushHandle", "WeightPusher", "WeightReceiver"]

#: High bits of the immediates of weight updates (the low 16 carry the version).
IMM_BASE_DEFAULT = 0x5E00_0000
#: Immediates of receivers' acks: their own base (low 16 bits: the version).
ACK_IMM_OFFSET = 0x0001_0000
VERSION_MASK = 0xFFFF


def _imm(base: int, version: int) -> int:
    if version < 0:
        raise InvalidRequestError(f"version {version} is negative")
    return base | (version & VERSION_MASK)


@dataclass(frozen=True)
class _Manifest:
    address: str
    tensors: dict[str, tuple[str, int]]  # name -> (descriptor text, nbytes)
    imm_base: int


@dataclass(frozen=True)
class _PusherInfo:
    address: str
    ack: str  # descriptor text of the pusher's zero-length ack target
    imm_base: int


class WeightReceiver:
    """An inference rank's side: its tensors, registered for the pusher to write into."""

    def __init__(self, engine: Engine, tensors: Mapping[str, Any], *, imm_base: int = IMM_BASE_DEFAULT) -> None:
        if not tensors:
            raise InvalidRequestError("a weight receiver needs at least one tensor")
        self.engine = engine
        self.imm_base = imm_base
        self.names = list(tensors)
        self.regions: dict[str, MemoryRegion] = dict(zip(self.names, engine.register_many(list(tensors.values()))))
        self._ack: tuple[Descriptor, MemoryRegion] | None = None

    def manifest(self) -> _Manifest:
        """What the pusher needs: this engine's address and every tensor's descriptor and size."""
        return _Manifest(
            address=str(self.engine.address),
            tensors={n: (str(r.descriptor), r.nbytes) for n, r in self.regions.items()},
            imm_base=self.imm_base,
        )

    def attach(self, info: _PusherInfo) -> None:
        """Learns where acks go (the pusher's ``info()``)."""
        self.engine.add_peer(Address.parse(info.address))
        self._ack = (Descriptor.parse(info.ack), self.engine.alloc(1))

    def wait(self, version: int, timeout: float = 30.0) -> None:
        """Returns once every tensor of ``version`` has landed; raises ``accord.TimeoutError``."""
        expected = len(self.regions)
        counter = self.engine.imm_counter(_imm(self.imm_base, version))
        try:
            counter.wait(expected, timeout=timeout)
        except TimeoutError as e:
            raise TimeoutError(
                f"weight version {version}: {counter.value} of {expected} tensors landed within {timeout} s"
            ) from e

    def ack(self, version: int, timeout: float = 30.0) -> None:
        """Tells the pusher this rank is done reading ``version`` (it may write the next one)."""
        if self._ack is None:
            raise InvalidRequestError("attach(pusher.info()) before ack: this receiver does not know its pusher")
        target, src = self._ack
        self.engine.release_imm(_imm(self.imm_base, version))
        self.engine.write(src, target, 0, imm=_imm(self.imm_base + ACK_IMM_OFFSET, version)).wait(timeout=timeout)

    def close(self) -> None:
        for r in self.regions.values():
            r.close()
        if self._ack is not None:
            self._ack[1].close()


class PushHandle:
    """One update in flight: ``wait()`` returns once every write completed at this end."""

    def __init__(self, version: int, transfers: list[Transfer]) -> None:
        self.version = version
        self._transfers = transfers

    def done(self) -> bool:
        return all(t.done() for t in self._transfers)

    def wait(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._transfers:
            t.wait(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))


class WeightPusher:
    """The trainer's side: a static plan of writes into every receiver, run once per update."""

    def __init__(
        self,
        engine: Engine,
        tensors: Mapping[str, Any],
        receivers: Sequence[_Manifest],
        *,
        imm_base: int = IMM_BASE_DEFAULT,
    ) -> None:
        if not receivers:
            raise InvalidRequestError("a weight pusher needs at least one receiver")
        self.engine = engine
        self.imm_base = imm_base
        names = list(tensors)
        self.regions: dict[str, MemoryRegion] = dict(zip(names, engine.register_many(list(tensors.values()))))
        # The plan: per receiver, (source region, destination descriptor, bytes) per tensor.
        self.plan: list[list[tuple[MemoryRegion, Descriptor, int]]] = []
        for index, m in enumerate(receivers):
            if m.imm_base != imm_base:
                raise InvalidRequestError(f"receiver {index} uses immediates {m.imm_base:#x}, this pusher {imm_base:#x}")
            missing = sorted(set(names) - set(m.tensors))
            extra = sorted(set(m.tensors) - set(names))
            if missing or extra:
                raise InvalidRequestError(f"receiver {index} ({m.address}): tensors missing {missing}, unknown {extra}")
            writes = []
            for name in names:
                text, nbytes = m.tensors[name]
                if nbytes != self.regions[name].nbytes:
                    raise InvalidRequestError(
                        f"tensor {name!r}: {self.regions[name].nbytes} bytes here, {nbytes} at receiver {index}"
                    )
                writes.append((self.regions[name], Descriptor.parse(text), nbytes))
            engine.add_peer(Address.parse(m.address))
            self.plan.append(writes)
        self._ack_target = engine.alloc(1)
        self._last: int | None = None

    def info(self) -> _PusherInfo:
        """What receivers need to ack (give it to each receiver's ``attach``)."""
        return _PusherInfo(address=str(self.engine.address), ack=str(self._ack_target.descriptor), imm_base=self.imm_base)

    def push(self, version: int, ack_timeout: float = 30.0) -> PushHandle:
        """Writes every tensor into every receiver, tagged with ``version``. First waits (at most
        ``ack_timeout``) until every receiver acked the previous push, so none is still reading it."""
        imm = _imm(self.imm_base, version)
        if self._last is not None:
            if (self._last & VERSION_MASK) == (version & VERSION_MASK):
                raise InvalidRequestError(f"version {version} repeats the last push's immediate")
            ack_imm = _imm(self.imm_base + ACK_IMM_OFFSET, self._last)
            acks = self.engine.imm_counter(ack_imm)
            try:
                acks.wait(len(self.plan), timeout=ack_timeout)
            except TimeoutError as e:
                raise TimeoutError(
                    f"push {version}: {acks.value} of {len(self.plan)} receivers acked version {self._last} "
                    f"within {ack_timeout} s"
                ) from e
            self.engine.release_imm(ack_imm)
        transfers = [
            self.engine.write(src, dst, nbytes, imm=imm) for writes in self.plan for (src, dst, nbytes) in writes
        ]
        self._last = version
        return PushHandle(version, transfers)

    def close(self) -> None:
        for r in self.regions.values():
            r.close()
        self._ack_target.close()
