"""KV-cache transfer between a prefill and a decode engine, by READ.

A cache is one array in a vLLM-like paged layout, ``(layers, 2, blocks, block_size, heads,
head_dim)`` (the 2 is K and V). The prefill side registers its cache and hands out a
``KvSource`` (picklable: the engine's address, the cache's descriptor, its layout). The decode
side registers its own cache and pulls a request's blocks by block id: for every layer and K/V,
each run of consecutive block ids (on both sides) is one one-sided READ, checked by the prefill
engine against its cache's key and bounds. ``KvPull.wait`` completes the request or raises:
``accord.TimeoutError`` when the caller's timeout passes first (the pull goes on; wait again),
``accord.PeerError`` when the prefill engine stopped answering (it names it), never hangs.

The prefill engine must have added the decode engine as a peer (it answers over the transport).
Host memory only for now (numpy arrays, torch CPU tensors).

    layout = KvLayout(layers=4, block_size=16, heads=8, head_dim=128, dtype="float16")
    source = PrefillCache(prefill_engine, layout, num_blocks=64).source   # send to decode
    decode = DecodeCache(decode_engine, layout, num_blocks=64)
    decode.pull(source, src_blocks=[3, 4, 9], dst_blocks=[0, 1, 2]).wait(timeout=10)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from accord._accord import Address, Descriptor, Engine, MemoryRegion, Transfer
from accord import errors
from accord.errors import InvalidRequestError


@dataclass(frozen=True)
class KvLayout:
    """The shape of one block of the cache: ``block_size`` tokens of ``heads`` x ``head_dim``."""

    layers: int
    block_size: int
    heads: int
    head_dim: int
    dtype: str = "float16"

    def shape(self, num_blocks: int) -> tuple[int, int, int, int, int, int]:
        """The cache array's shape for ``num_blocks`` blocks."""
        return (self.layers, 2, num_blocks, self.block_size, self.heads, self.head_dim)

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block of one layer's K (or V)."""
        return self.block_size * self.heads * self.head_dim * np.dtype(self.dtype).itemsize

    def offset(self, num_blocks: int, layer: int, kv: int, block: int) -> int:
        """Byte offset of ``block`` of ``layer``'s K (kv=0) or V (kv=1) in a cache of
        ``num_blocks`` blocks."""
        return ((layer * 2 + kv) * num_blocks + block) * self.block_nbytes


def _check_cache(layout: KvLayout, cache: Any, num_blocks: int) -> None:
    shape = tuple(getattr(cache, "shape", ()))
    if shape != layout.shape(num_blocks):
        raise InvalidRequestError(f"the cache has shape {shape}, the layout needs {layout.shape(num_blocks)}")


def _cache(layout: KvLayout, num_blocks: int, cache: Any | None) -> Any:
    if num_blocks <= 0:
        raise InvalidRequestError(f"num_blocks must be positive, got {num_blocks}")
    if cache is None:
        return np.zeros(layout.shape(num_blocks), dtype=layout.dtype)
    _check_cache(layout, cache, num_blocks)
    return cache


@dataclass(frozen=True)
class KvSource:
    """What a decode side needs to pull from a prefill cache (picklable)."""

    address: Address
    descriptor: Descriptor
    layout: KvLayout
    num_blocks: int


class PrefillCache:
    """A prefill engine's registered cache (``cache``: given, or zeros of the layout)."""

    def __init__(self, engine: Engine, layout: KvLayout, num_blocks: int, cache: Any | None = None) -> None:
        self.layout, self.num_blocks = layout, num_blocks
        self.cache = _cache(layout, num_blocks, cache)
        self.region: MemoryRegion = engine.register(self.cache)
        self.source = KvSource(engine.address, self.region.descriptor, layout, num_blocks)

    def close(self) -> None:
        """Deregisters the cache (pulls in flight then fail at the decode side)."""
        self.region.close()


def _runs(src: Sequence[int], dst: Sequence[int]) -> list[tuple[int, int, int]]:
    """(first source block, first destination block, count) of each run consecutive on both sides."""
    runs: list[tuple[int, int, int]] = []
    for s, d in zip(src, dst):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((s, d, 1))
    return runs


class KvPull:
    """A request's blocks in flight: its reads, completed together."""

    def __init__(self, request: str, transfers: list[Transfer]) -> None:
        self.request, self.transfers = request, transfers

    def done(self) -> bool:
        """Whether every read completed (either way)."""
        return all(t.done() for t in self.transfers)

    def wait(self, timeout: float | None = None) -> None:
        """Waits for every read; raises ``accord.TimeoutError`` naming the request when
        ``timeout`` passes first, or the first read's error (``accord.PeerError`` when the prefill
        engine did not answer, ``accord.RemoteAccessError`` when it refused)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        first: errors.AccordError | None = None
        for t in self.transfers:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                t.wait(timeout=left)
            except errors.TimeoutError as e:
                pending = sum(not x.done() for x in self.transfers)
                raise errors.TimeoutError(
                    f"KV pull {self.request!r}: {pending} of {len(self.transfers)} reads not complete "
                    f"within {timeout} s"
                ) from e
            except errors.AccordError as e:
                # The others are waited for too, so that a failed pull is over when this raises.
                first = first or e
        if first is not None:
            raise first


class DecodeCache:
    """A decode engine's registered cache, into which it pulls requests' blocks."""

    def __init__(self, engine: Engine, layout: KvLayout, num_blocks: int, cache: Any | None = None) -> None:
        self.engine, self.layout, self.num_blocks = engine, layout, num_blocks
        self.cache = _cache(layout, num_blocks, cache)
        self.region: MemoryRegion = engine.register(self.cache)
        self._known: set[int] = set()

    def pull(
        self,
        source: KvSource,
        src_blocks: Sequence[int],
        dst_blocks: Sequence[int],
        *,
        request: str = "",
        imm: int | None = None,
    ) -> KvPull:
        """Starts pulling blocks ``src_blocks`` of ``source`` into ``dst_blocks`` here, every
        layer's K and V. With ``imm``, this engine's counter for it moves once per read (see
        ``reads_per_pull``). Block ids are checked before anything is sent."""
        if source.layout != self.layout:
            raise InvalidRequestError(f"KV layouts differ: source {source.layout}, here {self.layout}")
        src, dst = [int(b) for b in src_blocks], [int(b) for b in dst_blocks]
        if len(src) != len(dst):
            raise InvalidRequestError(f"{len(src)} source blocks but {len(dst)} destination blocks")
        for what, ids, limit in (("source", src, source.num_blocks), ("destination", dst, self.num_blocks)):
            bad = [b for b in ids if not 0 <= b < limit]
            if bad:
                raise InvalidRequestError(f"{what} block ids {bad[:8]} are outside 0..{limit}")
        if source.address.id not in self._known:
            self.engine.add_peer(source.address)
            self._known.add(source.address.id)
        transfers = []
        nbytes = self.layout.block_nbytes
        for layer in range(self.layout.layers):
            for kv in (0, 1):
                for s, d, count in _runs(src, dst):
                    transfers.append(
                        self.engine.read(
                            self.region,
                            source.descriptor,
                            count * nbytes,
                            dst_offset=self.layout.offset(self.num_blocks, layer, kv, d),
                            src_offset=self.layout.offset(source.num_blocks, layer, kv, s),
                            imm=imm,
                        )
                    )
        return KvPull(request, transfers)

    @staticmethod
    def reads_per_pull(layout: KvLayout, src_blocks: Sequence[int], dst_blocks: Sequence[int]) -> int:
        """How many reads (and immediates) a pull of these blocks makes."""
        return layout.layers * 2 * len(_runs([int(b) for b in src_blocks], [int(b) for b in dst_blocks]))

    def close(self) -> None:
        """Deregisters the cache."""
        self.region.close()
