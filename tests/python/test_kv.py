"""accord.kv: a decode cache pulls a request's blocks from a prefill cache by READ, or a prefill
cache pushes them by paged WRITE, byte-exact for every layer's K and V, submitted in bounded
batches; bad block ids are refused, a silent prefill engine is timed out, a request is cancelled
or times out (no part submitted after, the wait names it), and a peer going away fails the
request, not the engine. Host memory here; the CUDA tensor tests are in test_kv_cuda.py."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

import accord
from accord.kv import DecodeCache, KvLayout, PrefillCache
from conftest import ROUTES, Pair, make_pair

pytestmark = pytest.mark.timeout(120)

LAYOUT = KvLayout(layers=3, block_size=4, heads=2, head_dim=8, dtype="float16")


def filled(num_blocks: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    return rng.standard_normal(LAYOUT.shape(num_blocks)).astype(np.float16)


def caches(pair: Pair, prefill_blocks: int, decode_blocks: int, fill: bool = True) -> tuple[PrefillCache, DecodeCache]:
    """A prefill cache on the pair's first engine (of random blocks, or zeros without ``fill``)
    and a zeroed decode cache on its second."""
    prefill_engine, decode_engine = pair
    cache = filled(prefill_blocks) if fill else None
    prefill = PrefillCache(prefill_engine, LAYOUT, num_blocks=prefill_blocks, cache=cache)
    return prefill, DecodeCache(decode_engine, LAYOUT, num_blocks=decode_blocks)


def test_decode_pulls_blocks_by_id_byte_exact(pair: Pair) -> None:
    decode_engine = pair[1]
    prefill, decode = caches(pair, 16, 10)
    src, dst = [3, 4, 5, 9, 0, 15], [0, 1, 2, 7, 9, 3]
    decode.pull(prefill.source, src, dst, request="req-1", imm=40).wait(timeout=20)
    assert (decode.cache[:, :, dst] == prefill.cache[:, :, src]).all()
    untouched = [b for b in range(10) if b not in dst]
    assert not decode.cache[:, :, untouched].any()
    reads = DecodeCache.reads_per_pull(LAYOUT, src, dst)
    assert reads == 1, "every block of every layer's K and V in one batched read"
    assert decode_engine.imm_counter(40).wait(reads, timeout=10) == reads
    # In reads of at most 4 blocks: two reads, two immediates, the same bytes.
    decode.cache[:] = 0
    pull = decode.pull(prefill.source, src, dst, request="req-2", imm=44, blocks_per_read=4)
    pull.wait(timeout=20)
    assert pull.parts_total == DecodeCache.reads_per_pull(LAYOUT, src, dst, blocks_per_read=4) == 2
    assert (decode.cache[:, :, dst] == prefill.cache[:, :, src]).all()
    assert not decode.cache[:, :, untouched].any()
    assert decode_engine.imm_counter(44).wait(2, timeout=10) == 2
    time.sleep(0.05)
    assert decode_engine.imm_counter(44).value == 2, "one immediate per read"
    decode.close()
    prefill.close()


def test_bad_block_ids_and_layouts_are_refused_before_sending(pair: Pair) -> None:
    prefill_engine, decode_engine = pair
    prefill, decode = caches(pair, 4, 4, fill=False)
    with pytest.raises(accord.InvalidRequestError, match="source block ids"):
        decode.pull(prefill.source, [4], [0])
    with pytest.raises(accord.InvalidRequestError, match="destination block ids"):
        decode.pull(prefill.source, [0], [-1])
    with pytest.raises(accord.InvalidRequestError, match="2 source blocks but 1"):
        decode.pull(prefill.source, [0, 1], [0])
    other = DecodeCache(decode_engine, KvLayout(3, 4, 2, 16), num_blocks=4)
    with pytest.raises(accord.InvalidRequestError, match="layouts differ"):
        other.pull(prefill.source, [0], [0])
    with pytest.raises(accord.InvalidRequestError, match="blocks_per_read"):
        decode.pull(prefill.source, [0], [0], blocks_per_read=0)
    with pytest.raises(accord.InvalidRequestError, match="shape"):
        PrefillCache(prefill_engine, LAYOUT, num_blocks=4, cache=np.zeros(8, dtype=np.float16))


def test_a_silent_prefill_engine_times_out_then_fails_naming_it() -> None:
    # The prefill engine never added the decode engine, so it cannot answer.
    with accord.Engine(ignore_env=True, force_network=True, idle_timeout=0.2) as p, accord.Engine(
        ignore_env=True, force_network=True, idle_timeout=0.2
    ) as d:
        prefill = PrefillCache(p, LAYOUT, num_blocks=2)
        decode = DecodeCache(d, LAYOUT, num_blocks=2)
        pull = decode.pull(prefill.source, [0], [1], request="req-9")
        with pytest.raises(accord.TimeoutError, match="req-9"):
            pull.wait(timeout=0.0)
        with pytest.raises(accord.PeerError, match=f"{p.id:x}"):
            pull.wait(timeout=20)
        assert pull.done()


def silent_pair() -> tuple[accord.Engine, accord.Engine]:
    """A prefill engine that never added the decode engine (so it answers no read) and the
    decode engine: reads stay outstanding until the decode engine gives up on them (4 s)."""
    p = accord.Engine(ignore_env=True, force_network=True, idle_timeout=2.0)
    d = accord.Engine(ignore_env=True, force_network=True, idle_timeout=2.0)
    return p, d


def scattered(n: int, limit: int, seed: int) -> list[int]:
    return [int(b) for b in np.random.default_rng(seed).permutation(limit)[:n]]


def test_a_pull_larger_than_its_window_lands_byte_exact(pair: Pair) -> None:
    decode_engine = pair[1]
    prefill, decode = caches(pair, 64, 48)
    src, dst = scattered(40, 64, 1), scattered(40, 48, 2)
    pull = decode.pull(prefill.source, src, dst, request="big", imm=41, max_in_flight=3, blocks_per_read=3)
    pull.wait(timeout=60)
    reads = DecodeCache.reads_per_pull(LAYOUT, src, dst, blocks_per_read=3)
    assert reads == 14
    assert pull.done() and pull.parts_submitted == pull.parts_total == reads
    assert pull.parts_in_flight == 0
    assert (decode.cache[:, :, dst] == prefill.cache[:, :, src]).all()
    assert decode_engine.imm_counter(41).wait(reads, timeout=10) == reads
    assert not pull.cancel(), "cancelling a finished pull changes nothing"
    pull.wait(timeout=0)


def test_push_writes_blocks_by_id_with_one_immediate(pair: Pair) -> None:
    decode_engine = pair[1]
    prefill, decode = caches(pair, 32, 20)
    src, dst = scattered(12, 32, 3), scattered(12, 20, 4)
    push = prefill.push(decode.target, src, dst, request="push-1", imm=42, max_in_flight=2, pages_per_write=5)
    push.wait(timeout=60)
    # A write carries whole blocks (every layer's K and V of each), at least one: 5 pages < 6.
    assert push.parts_total == 12
    assert push.parts_submitted == push.parts_total and push.parts_in_flight == 0
    assert (decode.cache[:, :, dst] == prefill.cache[:, :, src]).all()
    decode.cache[:] = 0
    push = prefill.push(decode.target, src, dst, request="push-2", imm=43, pages_per_write=6 * 5 + 1)
    push.wait(timeout=60)
    assert push.parts_total == 3, "5 whole blocks a write: 5, 5, 2"
    assert decode_engine.imm_counter(43).wait(1, timeout=10) == 1
    assert push.parts_submitted == push.parts_total and push.parts_in_flight == 0
    assert (decode.cache[:, :, dst] == prefill.cache[:, :, src]).all()
    untouched = [b for b in range(20) if b not in dst]
    assert not decode.cache[:, :, untouched].any()
    assert decode_engine.imm_counter(42).wait(1, timeout=10) == 1
    time.sleep(0.05)
    assert decode_engine.imm_counter(42).value == 1, "one immediate for the whole push"


def test_push_refuses_bad_block_ids_and_limits_before_sending(pair: Pair) -> None:
    prefill, decode = caches(pair, 4, 4, fill=False)
    with pytest.raises(accord.InvalidRequestError, match="destination block ids"):
        prefill.push(decode.target, [0], [4])
    with pytest.raises(accord.InvalidRequestError, match="max_in_flight"):
        prefill.push(decode.target, [0], [0], max_in_flight=0)
    with pytest.raises(accord.InvalidRequestError, match="timeout"):
        decode.pull(prefill.source, [0], [0], timeout=-1)
    with pytest.raises(accord.InvalidRequestError, match="elements are 4 bytes"):
        PrefillCache(pair[0], LAYOUT, num_blocks=4, cache=np.zeros(LAYOUT.shape(4), np.float32))


def test_cancel_stops_submitting_and_the_wait_names_the_request() -> None:
    p, d = silent_pair()
    with p, d:
        prefill = PrefillCache(p, LAYOUT, num_blocks=16)
        decode = DecodeCache(d, LAYOUT, num_blocks=16)
        pull = decode.pull(
            prefill.source, list(range(0, 16, 2)), list(range(8)), request="req-c", max_in_flight=2, blocks_per_read=1
        )
        # The window fills, and no read is submitted past it while none completes.
        deadline = time.monotonic() + 10
        while pull.parts_submitted < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.1)
        assert pull.parts_submitted == pull.parts_in_flight == 2
        assert pull.cancel()
        with pytest.raises(accord.CancelledError, match="KV pull 'req-c' cancelled: 2 of 8 parts.*undefined"):
            pull.wait(timeout=60)
        assert pull.done() and pull.parts_in_flight == 0 and pull.parts_submitted == 2


def test_a_timeout_given_at_pull_time_cancels_the_same_way() -> None:
    p, d = silent_pair()
    with p, d:
        prefill = PrefillCache(p, LAYOUT, num_blocks=16)
        decode = DecodeCache(d, LAYOUT, num_blocks=16)
        pull = decode.pull(prefill.source, list(range(0, 16, 2)), list(range(8)), request="req-t", timeout=0.2,
                           max_in_flight=2, blocks_per_read=1)
        with pytest.raises(accord.TimeoutError, match="KV pull 'req-t' cancelled after its timeout of 0.2 s"):
            pull.wait(timeout=60)
        assert pull.done() and pull.parts_in_flight == 0 and pull.parts_submitted <= 2


def test_a_push_whose_timeout_passed_submits_nothing(pair: Pair) -> None:
    prefill_engine, decode_engine = pair
    prefill = PrefillCache(prefill_engine, LAYOUT, num_blocks=4, cache=filled(4))
    decode = DecodeCache(decode_engine, LAYOUT, num_blocks=4)
    push = prefill.push(decode.target, [0, 1], [2, 3], request="late", imm=43, timeout=0)
    with pytest.raises(accord.TimeoutError, match="KV push 'late' cancelled after its timeout"):
        push.wait(timeout=60)
    assert push.parts_submitted == 0
    assert not decode.cache.any() and decode_engine.imm_counter(43).value == 0


def test_a_cancelled_push_is_over_with_nothing_in_flight(pair: Pair) -> None:
    # Whether the cancel comes before the last write is up to the scheduler: either the push
    # completed, or it raises CancelledError; in both cases it is over, nothing in flight.
    prefill_engine, decode_engine = pair
    prefill = PrefillCache(prefill_engine, LAYOUT, num_blocks=32, cache=filled(32))
    decode = DecodeCache(decode_engine, LAYOUT, num_blocks=32)
    push = prefill.push(decode.target, range(32), range(32), request="c2", max_in_flight=1, pages_per_write=1)
    push.cancel()
    try:
        push.wait(timeout=60)
        assert push.parts_submitted == push.parts_total
    except accord.CancelledError as e:
        assert "KV push 'c2' cancelled" in str(e)
        assert push.parts_submitted < push.parts_total
    assert push.done() and push.parts_in_flight == 0


@pytest.fixture(params=ROUTES)
def two_pairs(request: pytest.FixtureRequest) -> Iterator[tuple[Pair, Pair]]:
    """Two pairs of connected engines with a 0.3 s idle timeout (a closed peer is noticed soon),
    all four closed after the test."""
    pairs = (make_pair(request.param, idle_timeout=0.3), make_pair(request.param, idle_timeout=0.3))
    yield pairs
    for engine in (*pairs[0], *pairs[1]):
        engine.close()


def test_a_prefill_engine_going_away_fails_the_pull_not_the_decode_engine(two_pairs: tuple[Pair, Pair]) -> None:
    (p1, d), (p2, _) = two_pairs
    p2.add_peer(d.address)
    source = PrefillCache(p1, LAYOUT, num_blocks=4, cache=filled(4)).source
    p1.close()
    decode = DecodeCache(d, LAYOUT, num_blocks=4)
    pull = decode.pull(source, [0, 1], [0, 1], request="orphan")
    with pytest.raises(accord.PeerError, match="KV pull 'orphan'"):
        pull.wait(timeout=60)
    # The decode engine goes on: another prefill engine's blocks arrive.
    prefill = PrefillCache(p2, LAYOUT, num_blocks=4, cache=filled(4))
    decode.pull(prefill.source, [2, 3], [2, 3], request="next").wait(timeout=60)
    assert (decode.cache[:, :, [2, 3]] == prefill.cache[:, :, [2, 3]]).all()


def test_a_decode_engine_going_away_does_not_fail_the_prefill_engine(two_pairs: tuple[Pair, Pair]) -> None:
    (p, d1), (_, d2) = two_pairs
    p.add_peer(d2.address)
    prefill = PrefillCache(p, LAYOUT, num_blocks=8, cache=filled(8))
    gone = DecodeCache(d1, LAYOUT, num_blocks=8)
    pull = gone.pull(prefill.source, range(8), range(8), request="gone", max_in_flight=1)
    d1.close()
    try:  # the pull may have ended before the close: then it succeeded
        pull.wait(timeout=60)
    except accord.AccordError as e:
        assert "KV pull 'gone'" in str(e)
    assert pull.done() and pull.parts_in_flight == 0
    # The prefill engine goes on serving another decode engine, by pull and by push.
    decode = DecodeCache(d2, LAYOUT, num_blocks=8)
    decode.pull(prefill.source, [5, 6], [0, 1], request="pulled").wait(timeout=60)
    prefill.push(decode.target, [7], [2], request="pushed").wait(timeout=60)
    assert (decode.cache[:, :, [0, 1, 2]] == prefill.cache[:, :, [5, 6, 7]]).all()


def test_two_processes_on_the_network_route_push_and_pull_byte_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """The roles of kv_gpu_bench's ``network`` case (a prefill process, IPC and shared memory
    off: every byte over loopback UDP) on host memory, with a push of 2,560 pieces of 32 KiB
    (80 blocks of 16 layers' K and V, block ids scattered) and a pull of the same by batched
    READ; every wait bounded."""
    import multiprocessing as mp

    import kv_roles

    monkeypatch.setenv("ACCORD_DEVICE_IPC", "0")
    monkeypatch.setenv("ACCORD_SHM", "0")
    layout_args, pool, n = (16, 16, 8, 128), 96, 80
    layout = KvLayout(*layout_args, dtype="bfloat16")
    assert layout.block_nbytes == 32 << 10
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=kv_roles.kv_prefill, args=(child, layout_args, pool), daemon=True)
    proc.start()
    try:
        with accord.Engine() as d:
            decode = DecodeCache(d, layout, pool, cache=np.zeros(layout.shape(pool), dtype=np.uint16))
            assert parent.poll(60), "the prefill process said nothing within 60 s"
            hello = parent.recv()
            assert "source" in hello, hello
            parent.send((decode.target, d.address))
            want = kv_roles.kv_cache(layout, pool, 3)
            src, dst = scattered(n, pool, 5), scattered(n, pool, 6)
            parent.send((src, dst, 61))
            assert parent.poll(150), "the prefill process did not answer its push within 150 s"
            pushed = parent.recv()
            assert "pushed" in pushed, pushed
            assert d.imm_counter(61).wait(1, timeout=30) == 1
            assert (decode.cache[:, :, dst] == want[:, :, src]).all(), "pushed blocks differ"
            decode.cache[:] = 0
            src2, dst2 = scattered(n, pool, 7), scattered(n, pool, 8)
            pull = decode.pull(hello["source"], src2, dst2, request="net-pull", imm=62, timeout=60)
            pull.wait(timeout=120)
            assert pull.parts_total == DecodeCache.reads_per_pull(layout, src2, dst2) == 1
            assert (decode.cache[:, :, dst2] == want[:, :, src2]).all(), "pulled blocks differ"
            assert d.imm_counter(62).wait(1, timeout=30) == 1
            assert d.stats()["reads_sent"] == 1, "one request for 2,560 pieces"
            parent.send("exit")
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)


def test_closing_the_decode_engine_ends_a_pull_its_owner_never_answers() -> None:
    # Before, the pull's read stayed pending forever once the engine's workers were gone: its
    # thread, and anyone waiting on the pull, waited with it.
    p, d = silent_pair()
    with p:
        prefill = PrefillCache(p, LAYOUT, num_blocks=4)
        decode = DecodeCache(d, LAYOUT, num_blocks=4)
        pull = decode.pull(prefill.source, [0, 1], [2, 3], request="req-closed")
        with pytest.raises(accord.TimeoutError):
            pull.wait(timeout=0.2)
        d.close()
        with pytest.raises(accord.ShutdownError, match="KV pull 'req-closed'"):
            pull.wait(timeout=10)
        assert pull.done() and pull.parts_in_flight == 0


def test_push_page_maps_list_each_block_group_in_every_plane_before_the_next() -> None:
    from accord.kv import _pages_block_major

    src, dst = np.array([3, 4, 5, 9, 0, 15]), np.array([0, 1, 2, 7, 9, 3])
    src_pages, dst_pages = _pages_block_major(4, 16, 10, src, dst)
    # Blocks 3,4,5 -> 0,1,2 are one group (consecutive on both sides); the others stand alone.
    want = []
    for group in ([0, 1, 2], [3], [4], [5]):
        for plane in range(4):
            want += [(plane * 16 + int(src[i]), plane * 10 + int(dst[i])) for i in group]
    assert list(zip(src_pages.tolist(), dst_pages.tolist())) == want
    # The same pieces as plane by plane, reordered only.
    planes = np.arange(4)[:, None]
    plain = set(zip((planes * 16 + src).ravel().tolist(), (planes * 10 + dst).ravel().tolist()))
    assert set(want) == plain and len(want) == len(plain)
    empty = _pages_block_major(4, 16, 10, np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    assert empty[0].size == empty[1].size == 0
    # Every block a group of its own (scattered ids, built by one broadcast), and a lone block:
    # the same order, block by block, every plane of a block before the next block.
    for src, dst in ((np.array([7, 2, 11, 3]), np.array([4, 9, 0, 1])), (np.array([5]), np.array([6]))):
        src_pages, dst_pages = _pages_block_major(4, 16, 10, src, dst)
        want = [(p * 16 + int(s), p * 10 + int(d)) for s, d in zip(src, dst) for p in range(4)]
        assert list(zip(src_pages.tolist(), dst_pages.tolist())) == want
