"""Transfers between two engines of one process, over both routes (memcpy and the network
stack): writes, paged writes, scatters, sends, immediates, barriers, and their errors."""

from __future__ import annotations

import _thread
import json
import threading
import time

import numpy as np
import pytest

import accord

Pair = tuple[accord.Engine, accord.Engine]


def pattern(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def test_write_with_offsets_and_immediate(pair: Pair) -> None:
    a, b = pair
    src, dst = pattern(64 * 1024), np.zeros(128 * 1024, dtype=np.uint8)
    with a.register(src) as s, b.register(dst) as d:
        t = a.write(s, d.descriptor, 4096, src_offset=100, dst_offset=8192, imm=11)
        t.wait(timeout=10)
        assert t.done() and t.exception() is None and "done" in repr(t)
        assert b.imm_counter(11).wait(1, timeout=10) == 1
        assert (dst[8192 : 8192 + 4096] == src[100 : 100 + 4096]).all()
        assert not dst[:8192].any() and not dst[8192 + 4096 :].any()
        a.write(s, d.descriptor).wait(timeout=10)  # default: the whole source
        assert (dst[: src.size] == src).all()


def test_size_mismatches_are_refused_before_sending(pair: Pair) -> None:
    a, b = pair
    with a.alloc(4096) as s, b.alloc(1024) as d:
        with pytest.raises(accord.InvalidBufferError, match="destination bytes .* outside the remote region"):
            a.write(s, d.descriptor, imm=5)  # 4096 B into 1024 B
        with pytest.raises(accord.InvalidBufferError, match="source bytes .* outside the local region"):
            a.write(s, d.descriptor, 512, src_offset=4000)
        with pytest.raises(accord.InvalidBufferError, match="past the end"):
            a.write(s, d.descriptor, src_offset=5000)
        with pytest.raises(OverflowError):
            a.write(s, d.descriptor, -1)
        assert b.imm_counter(5).value == 0


def test_paged_write_moves_pages_and_counts_once(pair: Pair) -> None:
    a, b = pair
    page, pages = 4096, 16
    src = pattern(page * pages, seed=1)
    dst = np.zeros(page * pages, dtype=np.uint8)
    src_pages = np.array([0, 1, 2, 7, 9, 3], dtype=np.int64)
    dst_pages = [15, 14, 4, 5, 6, 0]
    with a.register(src) as s, b.register(dst) as d:
        a.write_paged(s, d.descriptor, page_nbytes=page, src_pages=src_pages, dst_pages=dst_pages, imm=21).wait(
            timeout=10
        )
        assert b.imm_counter(21).wait(1, timeout=10) == 1
        time.sleep(0.05)
        assert b.imm_counter(21).value == 1  # one immediate for the whole paged write
        for sp, dp in zip(src_pages, dst_pages):
            assert (dst[dp * page : (dp + 1) * page] == src[sp * page : (sp + 1) * page]).all()


def test_paged_write_argument_errors(pair: Pair) -> None:
    a, b = pair
    with a.alloc(8192) as s, b.alloc(8192) as d:
        kw = {"page_nbytes": 4096}
        with pytest.raises(accord.InvalidRequestError, match="one destination per source page"):
            a.write_paged(s, d.descriptor, src_pages=[0, 1], dst_pages=[0], **kw)
        with pytest.raises(accord.InvalidRequestError, match="dtype float64"):
            a.write_paged(s, d.descriptor, src_pages=np.array([0.0]), dst_pages=[0], **kw)
        with pytest.raises(accord.InvalidRequestError, match="negative"):
            a.write_paged(s, d.descriptor, src_pages=[-1], dst_pages=[0], **kw)
        with pytest.raises(accord.InvalidRequestError, match="sequence of non-negative integers"):
            a.write_paged(s, d.descriptor, src_pages=["x"], dst_pages=[0], **kw)
        with pytest.raises(accord.InvalidBufferError, match="outside the remote region"):
            a.write_paged(s, d.descriptor, src_pages=[0], dst_pages=[2], **kw)
        with pytest.raises(accord.InvalidBufferError, match="outside the local region"):
            a.write_paged(s, d.descriptor, src_pages=[5], dst_pages=[0], **kw)


def test_paged_write_takes_integer_arrays_of_any_width_and_stride(pair: Pair) -> None:
    """Page arrays are read from their bytes (not a Python int per page): int32, uint64 and a
    strided slice land the same pages as a list would; a negative entry or a 2-D array is
    refused before anything is sent."""
    a, b = pair
    page = 64
    src = pattern(page * 8, seed=5)
    dst = np.zeros(page * 8, dtype=np.uint8)
    every_other = np.array([6, 0, 4, 0, 2, 0], dtype=np.int64)[::2]  # [6, 4, 2], not contiguous
    with a.register(src) as s, b.register(dst) as d:
        kw = {"page_nbytes": page}
        a.write_paged(s, d.descriptor, src_pages=np.array([1, 3, 5], dtype=np.int32),
                      dst_pages=np.array([7, 0, 2], dtype=np.uint64), **kw).wait(timeout=10)
        a.write_paged(s, d.descriptor, src_pages=every_other, dst_pages=[1, 3, 4], **kw).wait(timeout=10)
        for sp, dp in [(1, 7), (3, 0), (5, 2), (6, 1), (4, 3), (2, 4)]:
            assert (dst[dp * page : (dp + 1) * page] == src[sp * page : (sp + 1) * page]).all(), (sp, dp)
        with pytest.raises(accord.InvalidRequestError, match="negative page index -2"):
            a.write_paged(s, d.descriptor, src_pages=np.array([0, -2], dtype=np.int16), dst_pages=[0, 1], **kw)
        lowest = np.iinfo(np.int64).min
        with pytest.raises(accord.InvalidRequestError, match=f"dst_pages holds the negative page index {lowest}"):
            a.write_paged(s, d.descriptor, src_pages=[0, 1, 2], dst_pages=np.array([3, 4, lowest]), **kw)
        with pytest.raises(accord.InvalidRequestError, match="one-dimensional"):
            a.write_paged(s, d.descriptor, src_pages=np.zeros((2, 1), dtype=np.int64), dst_pages=[0, 1], **kw)


def test_scatter_to_two_regions(pair: Pair) -> None:
    a, b = pair
    src = pattern(3000, seed=2)
    d1, d2 = np.zeros(1000, dtype=np.uint8), np.zeros(2000, dtype=np.uint8)
    with a.register(src) as s, b.register(d1) as r1, b.register(d2) as r2:
        dsts = [
            accord.ScatterDst(r1.descriptor, nbytes=1000),
            accord.ScatterDst(r2.descriptor, nbytes=2000, src_offset=1000),
        ]
        a.scatter(s, dsts, imm=31).wait(timeout=10)
        assert b.imm_counter(31).wait(2, timeout=10) == 2
        assert (d1 == src[:1000]).all() and (d2 == src[1000:]).all()
        with pytest.raises(accord.InvalidRequestError, match="destinations"):
            a.scatter(s, [])


def test_sends_queue_for_recv_or_reach_a_handler(pair: Pair) -> None:
    a, b = pair
    assert b.post_recvs(4096, 8) == 8
    a.send(b.address, b"hello", imm=3).wait(timeout=10)
    a.send(b.id, bytearray(b"world")).wait(timeout=10)
    a.send(b.address, np.arange(4, dtype=np.uint8)).wait(timeout=10)
    got = [b.recv(timeout=10) for _ in range(3)]
    assert sorted(got, key=lambda m: m[0]) == sorted(
        [(b"hello", 3), (b"world", None), (bytes(range(4)), None)], key=lambda m: m[0]
    )
    with pytest.raises(accord.TimeoutError, match="no message"):
        b.recv(timeout=0.05)
    seen: list[tuple[bytes, int | None]] = []
    arrived = threading.Event()
    b.post_recvs(4096, 1, lambda data, imm: (seen.append((data, imm)), arrived.set()))
    a.send(b.address, b"to the handler", imm=9).wait(timeout=10)
    assert arrived.wait(10) and seen == [(b"to the handler", 9)]
    with pytest.raises(accord.InvalidRequestError, match="not an int"):
        a.send(b.address, 5)


def test_send_without_posted_buffers_is_refused_by_the_peer(pair: Pair) -> None:
    a, b = pair
    with pytest.raises(accord.RemoteAccessError, match="NoRecvBuffer"):
        a.send(b.address, b"nobody listens").wait(timeout=10)
    b.post_recvs(16, 1)
    with pytest.raises(accord.RemoteAccessError, match="MessageTooLarge"):
        a.send(b.address, bytes(64)).wait(timeout=10)


def test_wrong_key_and_deregistered_region_are_refused_remotely(pair: Pair) -> None:
    a, b = pair
    with a.alloc(256) as s:
        d = b.alloc(256)
        forged = json.loads(str(d.descriptor))
        forged["key"] ^= 1
        with pytest.raises(accord.RemoteAccessError, match="BadKey"):
            a.write(s, accord.Descriptor.parse(json.dumps(forged)), imm=41).wait(timeout=10)
        d.close()
        with pytest.raises(accord.RemoteAccessError, match="UnknownRegion"):
            a.write(s, d.descriptor, imm=41).wait(timeout=10)
        assert b.imm_counter(41).value == 0


def test_unknown_peer_is_refused() -> None:
    with accord.Engine(force_network=True, ignore_env=True) as a, accord.Engine(ignore_env=True) as b:
        with a.alloc(64) as s, b.alloc(64) as d:
            with pytest.raises(accord.PeerError, match="add_peer"):
                a.write(s, d.descriptor)
            with pytest.raises(accord.InvalidRequestError, match="Address or its integer id"):
                a.send("somewhere", b"x")


def test_timeouts_then_peer_error_for_a_dead_peer() -> None:
    a = accord.Engine(force_network=True, idle_timeout=0.5, ignore_env=True)
    b = accord.Engine(force_network=True, ignore_env=True)
    a.add_peer(b.address)
    d = b.alloc(4096).descriptor
    b.close()  # the peer is gone; its port no longer answers
    with a.alloc(4096) as s:
        t = a.write(s, d)
        with pytest.raises(accord.TimeoutError, match="not complete within") as info:
            t.wait(timeout=0.01)
        assert isinstance(info.value, TimeoutError)  # the builtin, too
        with pytest.raises(accord.PeerError, match="stopped answering"):
            t.wait(timeout=30)
        assert isinstance(t.exception(), accord.PeerError)
    a.close()


def test_imm_counter_timeout_is_a_builtin_timeout(engine: accord.Engine) -> None:
    counter = engine.imm_counter(77)
    assert counter.imm == 77 and counter.value == 0
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="counted 0 of 1"):
        counter.wait(1, timeout=0.1)
    assert time.monotonic() - start < 5
    with pytest.raises(accord.InvalidRequestError, match="timeout"):
        counter.wait(1, timeout=-1)


def test_callbacks_run_on_the_completion_thread(pair: Pair) -> None:
    a, b = pair
    done = threading.Event()
    results: list[object] = []
    with a.alloc(64) as s, b.alloc(64) as d:
        b.expect_imm(51, 2, lambda value: (results.append(value), done.set()))
        for _ in range(2):
            t = a.write(s, d.descriptor, imm=51)
            t.add_done_callback(lambda tr: results.append(tr.done()))
        assert done.wait(10)
        t.wait(timeout=10)
        time.sleep(0.05)
    assert results.count(True) == 2 and 2 in results


def test_barrier_between_two_engines(pair: Pair) -> None:
    a, b = pair
    errors: list[BaseException] = []

    def other() -> None:
        try:
            for _ in range(3):
                b.barrier([a.address, b.address], imm=0xB0, timeout=10)
        except BaseException as e:  # reported below
            errors.append(e)

    thread = threading.Thread(target=other)
    thread.start()
    for _ in range(3):
        a.barrier([a.id, b.id], imm=0xB0, timeout=10)
    thread.join(10)
    assert not errors
    with pytest.raises(accord.TimeoutError, match="0 of 1 peers arrived"):
        a.barrier([b.id], imm=0xB1, timeout=0.2)


def test_waits_release_the_gil(engine: accord.Engine) -> None:
    ticks = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    thread = threading.Thread(target=spin)
    thread.start()
    with pytest.raises(accord.TimeoutError):
        engine.imm_counter(1).wait(1, timeout=0.3)
    stop.set()
    thread.join()
    assert ticks > 1000  # the other thread ran while this one waited


def test_ctrl_c_interrupts_a_wait(engine: accord.Engine) -> None:
    timer = threading.Timer(0.2, _thread.interrupt_main)
    timer.start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        engine.imm_counter(2).wait(1, timeout=60)
    assert time.monotonic() - start < 10
    timer.join()


def test_stats_and_repr(pair: Pair) -> None:
    a, _ = pair
    stats = a.stats()
    assert {"retransmits", "failovers", "datagrams_dropped", "imm_overflow", "lanes"} <= stats.keys()
    assert stats["lanes"] >= 1
    assert repr(a).startswith("Engine(id=0x")
