"""KV-cache transfer between a prefill and a decode engine: pulled by READ, or pushed by paged
WRITE, on host memory or CUDA tensors.

A cache is one array in a vLLM-like paged layout, ``(layers, 2, blocks, block_size, heads,
head_dim)`` (the 2 is K and V): a numpy array, a torch CPU tensor or a torch CUDA tensor
(registered as device memory; the engine moves it with the GPUs' copy engines in one process or
through CUDA IPC on one host, and through pinned staging slots otherwise). Its bytes must be
ready when a transfer starts: synchronise the stream that wrote them first.

- **Pull** (decode asks): the prefill side registers its cache and hands out a ``KvSource``
  (picklable: the engine's address, the cache's descriptor, its layout). The decode side pulls a
  request's blocks by block id with batched READs (``Engine.read_paged``): one read names up to
  ``blocks_per_read`` block ids for every layer's K and V at once (the layers and K/V are its
  planes), the prefill engine checks every block against its cache's key and bounds and writes
  them back as one paged write (on one host with CUDA tensors: one batch of copy-engine
  copies). The prefill engine must have added the decode engine as a peer (it answers over the
  transport). With ``imm``, the decode engine's counter moves once per read, after all of that
  read's blocks landed (``DecodeCache.reads_per_pull``).
- **Push** (prefill sends): the decode side hands out a ``KvTarget``; the prefill side writes a
  request's blocks with paged writes (every layer's K and V, ``PUSH_PAGES_PER_WRITE`` blocks a
  write). With ``imm``, the decode engine's counter moves exactly once, after every block landed.

Both return a ``KvTransfer``. Its parts (reads, or paged writes) are submitted by a thread of the
request (``accord-kv-<request>``), at most ``max_in_flight`` at a time, so a request of any size
stays within the engine's bounds and can stop between parts. Concurrent pulls of one engine share
its 4096 outstanding reads (``READ_REQUESTS_IN_FLIGHT_MAX``): keep the sum of their windows below
it, or a pull past it fails with ``accord.InvalidRequestError`` naming it.
``KvTransfer.wait`` returns once every part landed, or raises an ``accord`` error naming the
request: ``accord.TimeoutError`` when the caller's ``timeout`` passes first (the request goes
on; wait again), ``accord.PeerError`` when the peer stopped answering or went away (the request
fails; the engines go on serving others), ``accord.RemoteAccessError`` when the owner refused.

Cancel and time out: ``KvTransfer.cancel()`` (or the ``timeout`` given at pull or push time,
which cancels the same way when it passes) guarantees that

- no part is submitted after the request's thread saw the cancel (it looks before each part);
- parts already submitted (at most ``max_in_flight``) are not stopped: the engine cannot recall
  a write or a read's answer, so ``wait`` first waits for them (each ends: it lands, fails, or
  its peer is declared silent by the engine's own bounded timeouts);
- then ``wait`` raises ``accord.CancelledError`` (``accord.TimeoutError`` for the pull-time or
  push-time timeout) naming the request and how many parts were submitted, and from then on
  nothing of this request is in flight: the destination blocks hold undefined bytes (some parts
  landed, some did not) and may be reused. One exception: a read whose owner did not answer in
  time failed at the reader, but that owner may still write it if it comes back.

    layout = KvLayout(layers=4, block_size=16, heads=8, head_dim=128, dtype="bfloat16")
    source = PrefillCache(prefill_engine, layout, num_blocks=64).source   # send to decode
    decode = DecodeCache(decode_engine, layout, num_blocks=64)
    decode.pull(source, src_blocks=[3, 4, 9], dst_blocks=[0, 1, 2], timeout=5).wait()
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from accord import errors
from accord._accord import Address, Descriptor, Engine, MemoryRegion, Transfer
from accord.errors import InvalidRequestError

#: Reads a pull keeps outstanding at once by default (the engine allows 4096 per engine).
PULL_READS_IN_FLIGHT = 1024
#: Pieces (blocks x layers x 2) one batched read of a pull names at most by default: the engine's
#: ``READ_PIECES_PER_REQUEST_MAX``, so that each read is one request to the prefill engine.
PULL_PIECES_PER_READ = 65536
#: Paged writes a push keeps outstanding at once by default.
PUSH_WRITES_IN_FLIGHT = 4
#: Pages (blocks x layers x 2) per paged write of a push, at most, rounded down to whole blocks
#: (a write carries at least one block: every layer's K and V of it): the unit a cancel stops at.
PUSH_PAGES_PER_WRITE = 8192
#: How often a request's thread looks at its cancel flag and deadline while parts are in flight.
_POLL_S = 0.02
#: Sizes of the dtypes numpy may not know by name (``ml_dtypes`` adds them when installed).
_ITEMSIZES = {"bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


def _itemsize(dtype: str) -> int:
    try:
        return int(np.dtype(dtype).itemsize)
    except TypeError:
        if dtype in _ITEMSIZES:
            return _ITEMSIZES[dtype]
        raise InvalidRequestError(f"unknown KV dtype {dtype!r}: give a numpy dtype name or one of {sorted(_ITEMSIZES)}")


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
    def itemsize(self) -> int:
        """Bytes of one element."""
        return _itemsize(self.dtype)

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block of one layer's K (or V)."""
        return self.block_size * self.heads * self.head_dim * self.itemsize

    def offset(self, num_blocks: int, layer: int, kv: int, block: int) -> int:
        """Byte offset of ``block`` of ``layer``'s K (kv=0) or V (kv=1) in a cache of
        ``num_blocks`` blocks."""
        return ((layer * 2 + kv) * num_blocks + block) * self.block_nbytes


def _element_size(cache: Any) -> int | None:
    if hasattr(cache, "element_size"):  # torch
        return int(cache.element_size())
    dtype = getattr(cache, "dtype", None)
    return None if dtype is None else int(getattr(dtype, "itemsize", 0)) or None


def _check_cache(layout: KvLayout, cache: Any, num_blocks: int) -> None:
    shape = tuple(getattr(cache, "shape", ()))
    if shape != layout.shape(num_blocks):
        raise InvalidRequestError(f"the cache has shape {shape}, the layout needs {layout.shape(num_blocks)}")
    size = _element_size(cache)
    if size is not None and size != layout.itemsize:
        raise InvalidRequestError(
            f"the cache's elements are {size} bytes, the layout's dtype {layout.dtype!r} has {layout.itemsize}"
        )


def _cache(layout: KvLayout, num_blocks: int, cache: Any | None) -> Any:
    if num_blocks <= 0:
        raise InvalidRequestError(f"num_blocks must be positive, got {num_blocks}")
    if cache is None:
        try:
            dtype = np.dtype(layout.dtype)
        except TypeError:
            dtype = np.dtype(f"u{layout.itemsize}")  # the bytes are what moves
        return np.zeros(layout.shape(num_blocks), dtype=dtype)
    _check_cache(layout, cache, num_blocks)
    return cache


@dataclass(frozen=True)
class KvSource:
    """What a decode side needs to pull from a prefill cache (picklable)."""

    address: Address
    descriptor: Descriptor
    layout: KvLayout
    num_blocks: int


@dataclass(frozen=True)
class KvTarget:
    """What a prefill side needs to push into a decode cache (picklable)."""

    address: Address
    descriptor: Descriptor
    layout: KvLayout
    num_blocks: int


def _block_ids(
    layout: KvLayout, theirs: KvSource | KvTarget, src: Sequence[int], dst: Sequence[int], src_n: int, dst_n: int
) -> tuple[list[int], list[int]]:
    """Checked block ids: same layout, as many sources as destinations, every id in range."""
    if theirs.layout != layout:
        raise InvalidRequestError(f"KV layouts differ: theirs {theirs.layout}, here {layout}")
    s, d = [int(b) for b in src], [int(b) for b in dst]
    if len(s) != len(d):
        raise InvalidRequestError(f"{len(s)} source blocks but {len(d)} destination blocks")
    for what, ids, limit in (("source", s, src_n), ("destination", d, dst_n)):
        bad = [b for b in ids if not 0 <= b < limit]
        if bad:
            raise InvalidRequestError(f"{what} block ids {bad[:8]} are outside 0..{limit}")
    return s, d


def _pages_block_major(planes: int, src_n: int, dst_n: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The page maps of blocks ``src`` -> ``dst`` (caches of ``src_n`` and ``dst_n`` blocks, one
    plane per layer's K or V): blocks consecutive on both sides are grouped, and each group is
    listed in every plane before the next group (plane p of block b is page ``p * n + b``).

    Why this order: the pieces of one paged write are unordered (the engine may move them in any
    order; no two land on the same bytes), so the order changes nothing that lands. Listed this
    way, a group's pages in one plane are one contiguous run, and its runs in successive planes
    are equal pieces a whole plane apart on each side: the engine's copy-engine route moves them
    as one 2D copy (160 rows for an 80-layer model) instead of one copy per piece, which is what
    limited a scattered 2048-block request to an eighth of the copy ceiling. The same order as
    the engine's batched READ uses for a pull (``Engine.read_paged``)."""
    if src.size == 0:
        return src.copy(), dst.copy()
    breaks = np.flatnonzero((np.diff(src) != 1) | (np.diff(dst) != 1)) + 1
    if breaks.size == src.size - 1:
        # Every group is one block (scattered ids, the common case): block-major is a block's
        # planes in a row, built in one broadcast (the page maps of a 2,048-block push's 41
        # writes took 7.4-7.7 ms by the general path, 3.5-3.7 this way, on the 2-core machine:
        # `python3 scripts/kv_push_host_cost.py`, row "page maps").
        plane = np.arange(planes, dtype=np.int64)
        return (src[:, None] + plane * src_n).ravel(), (dst[:, None] + plane * dst_n).ravel()
    starts = np.concatenate(([0], breaks)).astype(np.int64)
    lengths = np.diff(np.concatenate((starts, [src.size]))).astype(np.int64)
    per_group = lengths * planes  # pages each group contributes
    total = int(per_group.sum())
    group = np.repeat(np.arange(starts.size), per_group)
    at = np.arange(total, dtype=np.int64) - np.repeat(starts * planes, per_group)
    length = lengths[group]
    plane, index = at // length, starts[group] + at % length
    return plane * src_n + src[index], plane * dst_n + dst[index]


def _check_limits(max_in_flight: int, timeout: float | None, **more: int) -> None:
    for name, value in (("max_in_flight", max_in_flight), *more.items()):
        if not value >= 1:
            raise InvalidRequestError(f"{name} must be at least 1, got {value}")
    if timeout is not None and not timeout >= 0:
        raise InvalidRequestError(f"timeout must be seconds >= 0 (or None), got {timeout}")


def _named(e: errors.AccordError, what: str) -> errors.AccordError:
    """``e`` again, of the same class, its message prefixed with the request's name."""
    try:
        named = type(e)(f"{what}: {e}")
    except Exception:  # pragma: no cover - every accord error takes one message
        return e
    named.__cause__ = e
    return named


class KvTransfer:
    """One request's blocks in flight: its parts (reads or paged writes), submitted at most
    ``max_in_flight`` at a time by the request's thread. See the module's documentation for
    what ``cancel`` and the timeout guarantee.

    ``submit(part)`` hands one part to the engine; with ``last_after_all``, the last part is
    submitted only once every other part completed (it carries the request's immediate)."""

    def __init__(
        self,
        kind: str,
        request: str,
        submit: Callable[[Any], Transfer],
        parts: list[Any],
        max_in_flight: int,
        timeout: float | None,
        last_after_all: bool = False,
    ) -> None:
        self.kind, self.request = kind, request
        self.parts_total = len(parts)
        self._submit, self._parts = submit, parts
        self._max_in_flight = max_in_flight
        self._last_after_all = last_after_all
        self._timeout = timeout
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._cancel = threading.Event()
        self._finished = threading.Event()
        # Written by the request's thread only (reads of an int are atomic under the GIL).
        self._submitted = 0
        self._settled = 0
        self._error: errors.AccordError | None = None
        self._thread = threading.Thread(target=self._run, name=f"accord-kv-{request or kind}"[:64], daemon=True)
        self._thread.start()

    @property
    def _what(self) -> str:
        return f"KV {self.kind} {self.request!r}"

    @property
    def parts_submitted(self) -> int:
        """Parts handed to the engine so far."""
        return self._submitted

    @property
    def parts_in_flight(self) -> int:
        """Parts submitted and not complete yet."""
        return self._submitted - self._settled

    def done(self) -> bool:
        """Whether the request is over (landed, failed or cancelled) and nothing of it is in flight."""
        return self._finished.is_set()

    def cancel(self) -> bool:
        """Stops submitting this request's parts (see the module's documentation); returns at
        once. False if the request was already over."""
        self._cancel.set()
        return not self._finished.is_set()

    def wait(self, timeout: float | None = None) -> None:
        """Waits until the request is over; raises ``accord.TimeoutError`` naming the request when
        ``timeout`` passes first (the request goes on), else the request's error if it failed or
        was cancelled (``accord.CancelledError``; ``accord.TimeoutError`` for a timeout given at
        pull or push time)."""
        if not self._finished.wait(timeout):
            raise errors.TimeoutError(
                f"{self._what}: {self.parts_submitted} of {self.parts_total} parts submitted, "
                f"{self.parts_in_flight} in flight, not over within {timeout} s (it goes on: wait again)"
            )
        if self._error is not None:
            raise self._error

    def _stop_reason(self) -> errors.AccordError | None:
        if self._cancel.is_set():
            return errors.CancelledError(self._stopped("cancelled"))
        if self._deadline is not None and time.monotonic() >= self._deadline:
            return errors.TimeoutError(self._stopped(f"cancelled after its timeout of {self._timeout} s"))
        return None

    def _stopped(self, why: str) -> str:
        return (
            f"{self._what} {why}: {self._submitted} of {self.parts_total} parts were submitted; "
            "the destination blocks hold undefined bytes"
        )

    def _settle(self, t: Transfer) -> None:
        """Waits for one part, in short slices, noting a cancel or deadline meanwhile (the part
        is waited for all the same: it cannot be recalled), and its failure."""
        failed: errors.AccordError | None = None
        while True:
            if self._error is None:
                self._error = self._stop_reason()
            try:
                t.wait(timeout=_POLL_S)
                break
            except errors.TimeoutError:
                continue
            except errors.AccordError as e:
                failed = e
                break
        self._settled += 1
        if failed is not None and self._error is None:
            self._error = _named(failed, self._what)

    def _run(self) -> None:
        window: collections.deque[Transfer] = collections.deque()
        submit, last = self._submit, len(self._parts) - 1
        try:
            for index, part in enumerate(self._parts):
                if self._error is None:
                    self._error = self._stop_reason()
                if self._error is None and index == last and self._last_after_all:
                    while window:
                        self._settle(window.popleft())
                if self._error is not None:
                    break
                try:
                    transfer = submit(part)
                except errors.AccordError as e:
                    self._error = _named(e, self._what)
                    break
                self._submitted += 1
                window.append(transfer)
                if len(window) >= self._max_in_flight:
                    self._settle(window.popleft())
        except BaseException as e:  # pragma: no cover - a bug here must not hang waiters
            self._error = errors.AccordError(f"{self._what}: the request's thread failed: {e!r}")
        finally:
            try:
                # Over only once nothing of it is in flight.
                while window:
                    self._settle(window.popleft())
            finally:
                self._parts = []
                self._finished.set()


# A pull's old name: its transfers are a KvTransfer.
KvPull = KvTransfer


class PrefillCache:
    """A prefill engine's registered cache (``cache``: given, or zeros of the layout), which
    decode engines pull from (``source``) or which pushes into their caches (``push``)."""

    def __init__(self, engine: Engine, layout: KvLayout, num_blocks: int, cache: Any | None = None) -> None:
        self.engine, self.layout, self.num_blocks = engine, layout, num_blocks
        self.cache = _cache(layout, num_blocks, cache)
        self.region: MemoryRegion = engine.register(self.cache)
        self.source = KvSource(engine.address, self.region.descriptor, layout, num_blocks)
        self._known: set[int] = set()

    def push(
        self,
        target: KvTarget,
        src_blocks: Sequence[int],
        dst_blocks: Sequence[int],
        *,
        request: str = "",
        imm: int | None = None,
        timeout: float | None = None,
        max_in_flight: int = PUSH_WRITES_IN_FLIGHT,
        pages_per_write: int = PUSH_PAGES_PER_WRITE,
    ) -> KvTransfer:
        """Starts writing blocks ``src_blocks`` here into ``dst_blocks`` of ``target``, every
        layer's K and V, by paged writes of at most ``pages_per_write`` pages (blocks x layers x
        2), rounded down to whole blocks but at least one block a write. With ``imm``, the
        target engine's counter moves once, after every block landed (the last write carries it,
        submitted once every other write completed). With ``timeout`` (seconds), the push cancels
        itself when it passes. Block ids are checked before anything is sent. Into GPU memory
        across hosts, the decode side must first accept pushes from this cache
        (``DecodeCache.accept_pushes_from(prefill.source)``)."""
        _check_limits(max_in_flight, timeout, pages_per_write=pages_per_write)
        src, dst = _block_ids(self.layout, target, src_blocks, dst_blocks, self.num_blocks, target.num_blocks)
        if target.address.id not in self._known:
            self.engine.add_peer(target.address)
            self._known.add(target.address.id)
        planes = self.layout.layers * 2
        src_ids, dst_ids = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        # Whole blocks a write, listed block by block (see _pages_block_major for why). A write's
        # page maps are made by the request's thread just before it submits that write: made
        # here for every write first, they delayed the first write, and so the first copy, by
        # all of them (a 2,048-block push's first write came 7.4-8.0 ms after the call, 0.6-0.7
        # now, on the 2-core machine: `python3 scripts/kv_push_host_cost.py`, row "push -> first
        # write"), while a later write's maps are made as the copy engine works on earlier ones.
        per_write = max(1, pages_per_write // planes)
        chunks = [(at, min(at + per_write, len(src))) for at in range(0, len(src), per_write)]
        engine, region, descriptor, page_nbytes = self.engine, self.region, target.descriptor, self.layout.block_nbytes
        src_n, dst_n, last = self.num_blocks, target.num_blocks, len(chunks) - 1

        def submit(chunk: tuple[int, int]) -> Transfer:
            lo, hi = chunk
            src_pages, dst_pages = _pages_block_major(planes, src_n, dst_n, src_ids[lo:hi], dst_ids[lo:hi])
            return engine.write_paged(
                region,
                descriptor,
                page_nbytes=page_nbytes,
                src_pages=src_pages,
                dst_pages=dst_pages,
                imm=imm if hi == len(src) else None,
            )

        # The immediate says "every block landed": its write goes once the others completed.
        return KvTransfer("push", request, submit, chunks, max_in_flight, timeout, last_after_all=imm is not None and last > 0)

    def close(self) -> None:
        """Deregisters the cache (pulls in flight then fail at the decode side)."""
        self.region.close()


class DecodeCache:
    """A decode engine's registered cache, into which it pulls requests' blocks (``pull``) or
    prefill engines push them (``target``)."""

    def __init__(self, engine: Engine, layout: KvLayout, num_blocks: int, cache: Any | None = None) -> None:
        self.engine, self.layout, self.num_blocks = engine, layout, num_blocks
        self.cache = _cache(layout, num_blocks, cache)
        self.region: MemoryRegion = engine.register(self.cache)
        self.target = KvTarget(engine.address, self.region.descriptor, layout, num_blocks)
        self._known: set[int] = set()

    def accept_pushes_from(self, source: KvSource) -> None:
        """Lets the prefill engine of ``source`` push into this cache across hosts (or with
        ``ACCORD_DEVICE_IPC=0``): a push into GPU memory there lands through a rendezvous this
        engine answers, so it must know the writer. A writer it does not know is refused (a
        warning names it) and its push times out. Not needed on one host through CUDA IPC."""
        if source.address.id not in self._known:
            self.engine.add_peer(source.address)
            self._known.add(source.address.id)

    def pull(
        self,
        source: KvSource,
        src_blocks: Sequence[int],
        dst_blocks: Sequence[int],
        *,
        request: str = "",
        imm: int | None = None,
        timeout: float | None = None,
        max_in_flight: int = PULL_READS_IN_FLIGHT,
        blocks_per_read: int | None = None,
    ) -> KvTransfer:
        """Starts pulling blocks ``src_blocks`` of ``source`` into ``dst_blocks`` here, every
        layer's K and V, by batched reads of at most ``blocks_per_read`` blocks each (default: as
        many as one request carries, ``PULL_PIECES_PER_READ // (layers * 2)``), at most
        ``max_in_flight`` reads at a time. With ``imm``, this engine's counter for it moves once
        per read (see ``reads_per_pull``). With ``timeout`` (seconds), the pull cancels itself
        when it passes. Block ids are checked before anything is sent."""
        per_read = self.blocks_per_read(self.layout) if blocks_per_read is None else blocks_per_read
        _check_limits(max_in_flight, timeout, blocks_per_read=per_read)
        src, dst = _block_ids(self.layout, source, src_blocks, dst_blocks, source.num_blocks, self.num_blocks)
        if source.address.id not in self._known:
            self.engine.add_peer(source.address)
            self._known.add(source.address.id)
        engine, region, descriptor = self.engine, self.region, source.descriptor
        nbytes = self.layout.block_nbytes
        # Every (layer, K/V) plane is a whole plane of blocks apart, here and there. The owner
        # lists each group of consecutive blocks in every plane before the next group (the same
        # order as a push, _pages_block_major), so its copy engine moves a group as one 2D copy.
        planes = self.layout.layers * 2
        here, there = self.num_blocks * nbytes, source.num_blocks * nbytes
        src_ids, dst_ids = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        parts = [(at, min(at + per_read, len(src))) for at in range(0, len(src), per_read)]

        def submit(part: tuple[int, int]) -> Transfer:
            lo, hi = part
            return engine.read_paged(
                region,
                descriptor,
                page_nbytes=nbytes,
                src_pages=src_ids[lo:hi],
                dst_pages=dst_ids[lo:hi],
                planes=planes,
                src_plane_stride=there,
                dst_plane_stride=here,
                imm=imm,
            )

        return KvTransfer("pull", request, submit, parts, max_in_flight, timeout)

    @staticmethod
    def blocks_per_read(layout: KvLayout) -> int:
        """Blocks one batched read of a pull names by default (every layer's K and V of each)."""
        return max(1, PULL_PIECES_PER_READ // (layout.layers * 2))

    @staticmethod
    def reads_per_pull(
        layout: KvLayout, src_blocks: Sequence[int], dst_blocks: Sequence[int], blocks_per_read: int | None = None
    ) -> int:
        """How many reads (and immediates) a pull of these blocks makes."""
        if len(src_blocks) != len(dst_blocks):
            raise InvalidRequestError(f"{len(src_blocks)} source blocks but {len(dst_blocks)} destination blocks")
        per_read = DecodeCache.blocks_per_read(layout) if blocks_per_read is None else blocks_per_read
        if per_read < 1:
            raise InvalidRequestError(f"blocks_per_read must be at least 1, got {per_read}")
        return -(-len(src_blocks) // per_read)

    def close(self) -> None:
        """Deregisters the cache."""
        self.region.close()
