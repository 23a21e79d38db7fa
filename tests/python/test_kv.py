"""accord.kv: a decode cache pulls a request's blocks from a prefill cache by READ, byte-exact
for every layer's K and V, with bad block ids refused and a silent prefill engine timed out."""

from __future__ import annotations

import numpy as np
import pytest

import accord
from accord.kv import DecodeCache, KvLayout, PrefillCache

Pair = tuple[accord.Engine, accord.Engine]
LAYOUT = KvLayout(layers=3, block_size=4, heads=2, head_dim=8, dtype="float16")


def filled(num_blocks: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    return rng.standard_normal(LAYOUT.shape(num_blocks)).astype(np.float16)


def test_decode_pulls_blocks_by_id_byte_exact(pair: Pair) -> None:
    prefill_engine, decode_engine = pair
    prefill = PrefillCache(prefill_engine, LAYOUT, num_blocks=16, cache=filled(16))
    decode = DecodeCache(decode_engine, LAYOUT, num_blocks=10)
    src, dst = [3, 4, 5, 9, 0, 15], [0, 1, 2, 7, 9, 3]
    decode.pull(prefill.source, src, dst, request="req-1", imm=40).wait(timeout=20)
    assert (decode.cache[:, :, dst] == prefill.cache[:, :, src]).all()
    untouched = [b for b in range(10) if b not in dst]
    assert not decode.cache[:, :, untouched].any()
    reads = DecodeCache.reads_per_pull(LAYOUT, src, dst)
    assert reads == 3 * 2 * 4  # runs: 3-5 -> 0-2, 9 -> 7, 0 -> 9, 15 -> 3
    assert decode_engine.imm_counter(40).wait(reads, timeout=10) == reads
    decode.close()
    prefill.close()


def test_bad_block_ids_and_layouts_are_refused_before_sending(pair: Pair) -> None:
    prefill_engine, decode_engine = pair
    prefill = PrefillCache(prefill_engine, LAYOUT, num_blocks=4)
    decode = DecodeCache(decode_engine, LAYOUT, num_blocks=4)
    with pytest.raises(accord.InvalidRequestError, match="source block ids"):
        decode.pull(prefill.source, [4], [0])
    with pytest.raises(accord.InvalidRequestError, match="destination block ids"):
        decode.pull(prefill.source, [0], [-1])
    with pytest.raises(accord.InvalidRequestError, match="2 source blocks but 1"):
        decode.pull(prefill.source, [0, 1], [0])
    other = DecodeCache(decode_engine, KvLayout(3, 4, 2, 16), num_blocks=4)
    with pytest.raises(accord.InvalidRequestError, match="layouts differ"):
        other.pull(prefill.source, [0], [0])
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
