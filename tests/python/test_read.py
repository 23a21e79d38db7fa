"""READ (a one-sided pull), strided paged writes and batch registration, between two engines
of one process over both routes (a checked memcpy, and the network stack over loopback)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import accord

Pair = tuple[accord.Engine, accord.Engine]


class DlpackOnly:
    """Exposes an array through DLPack alone (no buffer protocol), like a torch tensor."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.arr.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def pattern(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def test_read_pulls_bytes_and_counts_the_immediate_at_the_reader(pair: Pair) -> None:
    owner, reader = pair
    src, dst = pattern(256 * 1024, seed=3), np.zeros(300 * 1024, dtype=np.uint8)
    with owner.register(src) as s, reader.register(dst) as d:
        reader.read(d, s.descriptor, 4096, dst_offset=100, src_offset=8192, imm=31).wait(timeout=10)
        assert (dst[100 : 100 + 4096] == src[8192 : 8192 + 4096]).all()
        assert not dst[:100].any() and not dst[100 + 4096 :].any()
        assert reader.imm_counter(31).wait(1, timeout=10) == 1
        assert owner.imm_counter(31).value == 0
        reader.read(d, s.descriptor, src.size).wait(timeout=10)
        assert (dst[: src.size] == src).all()


def test_bad_reads_are_refused_and_place_nothing(pair: Pair) -> None:
    owner, reader = pair
    with owner.alloc(4096) as s, reader.alloc(4096) as d:
        with pytest.raises(accord.InvalidRequestError, match="remote source bytes .* outside"):
            reader.read(d, s.descriptor, 100, src_offset=4000)
        with pytest.raises(accord.InvalidRequestError, match="local destination bytes .* outside"):
            reader.read(d, s.descriptor, 100, dst_offset=4000)
        with pytest.raises(accord.InvalidBufferError, match="past the end"):
            reader.read(d, s.descriptor, dst_offset=5000)
        stale = s.descriptor
    # The owner's region is closed: the owner refuses the read, as it would a write.
    with reader.alloc(64) as d2:
        with pytest.raises(accord.RemoteAccessError):
            reader.read(d2, stale, 64, imm=2).wait(timeout=10)
        assert not bytes(d2.obj).strip(b"\0")
        assert reader.imm_counter(2).value == 0


@pytest.mark.parametrize("route", ["memcpy", "network"])
def test_strided_paged_write_places_pages_by_offset_and_stride(route: str) -> None:
    force = route == "network"
    with accord.Engine(ignore_env=True, force_network=force) as a, accord.Engine(
        ignore_env=True, force_network=force
    ) as b:
        a.add_peer(b.address)
        b.add_peer(a.address)
        page = 256
        # The source holds blocks of [K, V] halves; move only the V halves of blocks 1, 3, 4
        # into every other slot of the destination, after a 16-byte header.
        src = pattern(8 * 2 * page, seed=5)
        dst = np.zeros(16 + 10 * 2 * page, dtype=np.uint8)
        with a.register(src) as s, b.register(dst) as d:
            a.write_paged(
                s,
                d.descriptor,
                page_nbytes=page,
                src_pages=[1, 3, 4],
                dst_pages=np.array([0, 4, 9], dtype=np.int64),
                src_offset=page,
                src_stride=2 * page,
                dst_offset=16,
                dst_stride=2 * page,
                imm=12,
            ).wait(timeout=10)
            want = np.zeros_like(dst)
            for sp, dp in [(1, 0), (3, 4), (4, 9)]:
                at = 16 + dp * 2 * page
                want[at : at + page] = src[page + sp * 2 * page : page + sp * 2 * page + page]
            assert (dst == want).all()
            assert b.imm_counter(12).wait(1, timeout=10) == 1
            with pytest.raises(accord.InvalidRequestError, match="destination stride"):
                a.write_paged(s, d.descriptor, page_nbytes=page, src_pages=[0], dst_pages=[0], dst_stride=page - 1)
            with pytest.raises(accord.InvalidBufferError, match="outside the remote region"):
                a.write_paged(s, d.descriptor, page_nbytes=page, src_pages=[0], dst_pages=[10], dst_stride=2 * page)
            with pytest.raises(accord.InvalidRequestError, match="overflows"):
                a.write_paged(s, d.descriptor, page_nbytes=page, src_pages=[2**62], dst_pages=[0], src_stride=8)
            assert (dst == want).all(), "refused writes placed nothing"


def test_register_many_registers_all_or_none(engine: accord.Engine) -> None:
    arrays = [np.zeros(1000, dtype=np.float32), np.zeros((4, 16), dtype=np.int16), bytearray(10)]
    regions = engine.register_many([*arrays, DlpackOnly(np.zeros(33, dtype=np.uint8))])
    assert [r.nbytes for r in regions] == [4000, 128, 10, 33]
    assert len({r.descriptor for r in regions}) == 4
    src = np.arange(1000, dtype=np.float32)
    with engine.register(src) as s:
        engine.write(s, regions[0].descriptor).wait(timeout=5)
    assert (arrays[0] == src).all()
    for r in regions:
        r.close()
    with pytest.raises(accord.InvalidBufferError, match="read-only"):
        engine.register_many([np.zeros(8, dtype=np.uint8), bytes(8)])
    assert engine.register_many([]) == []


def test_register_many_takes_torch_cpu_tensors(engine: accord.Engine) -> None:
    torch = pytest.importorskip("torch")
    tensors = [torch.zeros(64, dtype=torch.float32) for _ in range(3)]
    regions = engine.register_many(tensors)
    src = np.arange(64, dtype=np.float32)
    with engine.register(src) as s:
        for r in regions:
            engine.write(s, r.descriptor).wait(timeout=5)
    assert all(torch.equal(t, torch.arange(64, dtype=torch.float32)) for t in tensors)
    for r in regions:
        r.close()


def test_read_into_a_torch_cpu_tensor(pair: Pair) -> None:
    torch = pytest.importorskip("torch")
    owner, reader = pair
    src = np.arange(256, dtype=np.float32)
    dst = torch.zeros(256, dtype=torch.float32)
    with owner.register(src) as s, reader.register(dst) as d:
        reader.read(d, s.descriptor).wait(timeout=10)
    assert torch.equal(dst, torch.arange(256, dtype=torch.float32))


def test_engine_stats_count_reads_at_both_ends() -> None:
    from conftest import make_pair

    owner, reader = make_pair("network")
    try:
        with owner.alloc(4096) as s, reader.alloc(4096) as d:
            reader.read(d, s.descriptor, 4096).wait(timeout=10)
            mine, theirs = reader.stats(), owner.stats()
            assert mine["reads_sent"] == 1 and theirs["reads_served"] == 1
            assert theirs["reads_refused"] == 0 and mine["reads_unanswered"] == 0
            assert theirs["reads_into_device_mapped"] == 0, "host memory: no IPC"
            landing = {"landing_chunks_landed", "landing_asks_refused", "landing_control_refused",
                       "landing_control_dropped", "landing_slots_reclaimed", "landing_chunks_inline",
                       "landing_inline_duplicates"}
            assert landing <= mine.keys() and all(mine[k] == 0 for k in landing), "host memory: nothing landed"
    finally:
        owner.close()
        reader.close()


def test_read_paged_pulls_pages_of_every_plane_in_one_request(pair: Pair) -> None:
    owner, reader = pair
    page, blocks, planes = 512, 12, 5
    plane = page * blocks
    src = pattern(planes * plane, seed=9)
    dst = np.zeros(planes * plane, dtype=np.uint8)
    src_ids, dst_ids = [7, 0, 1, 11], np.array([2, 3, 4, 0], dtype=np.uint32)
    with owner.register(src) as s, reader.register(dst) as d:
        reader.read_paged(
            d,
            s.descriptor,
            page_nbytes=page,
            src_pages=src_ids,
            dst_pages=dst_ids,
            planes=planes,
            src_plane_stride=plane,
            dst_plane_stride=plane,
            imm=33,
        ).wait(timeout=10)
        want = np.zeros_like(dst)
        for p in range(planes):
            for sp, dp in zip(src_ids, dst_ids):
                at, frm = p * plane + int(dp) * page, p * plane + sp * page
                want[at : at + page] = src[frm : frm + page]
        assert (dst == want).all()
        assert reader.imm_counter(33).wait(1, timeout=10) == 1
        assert owner.imm_counter(33).value == 0
        if reader.stats()["reads_sent"]:  # the network route: one request for every page
            assert reader.stats()["reads_sent"] == 1 and owner.stats()["reads_served"] == 1


def test_bad_batched_reads_are_refused_and_place_nothing(pair: Pair) -> None:
    owner, reader = pair
    with owner.alloc(4096) as s, reader.alloc(4096) as d:
        bad: list[tuple[dict[str, Any], str]] = [
            ({"src_pages": [16], "dst_pages": [0]}, "remote source bytes"),
            ({"src_pages": [0], "dst_pages": [16]}, "local destination bytes"),
            ({"src_pages": [0, 1], "dst_pages": [0]}, "one destination per source page"),
            ({"src_pages": [0], "dst_pages": [0], "dst_stride": 255}, "overlap"),
            ({"src_pages": [0], "dst_pages": [0], "planes": 0}, "planes"),
            ({"src_pages": [2**32], "dst_pages": [0]}, "2\\^32"),
            ({"src_pages": [0], "dst_pages": [0], "planes": 2, "src_plane_stride": 4000}, "plane 1"),
        ]
        for kwargs, says in bad:
            with pytest.raises(accord.InvalidRequestError, match=says):
                reader.read_paged(d, s.descriptor, page_nbytes=256, **kwargs)
        stale = s.descriptor
    with reader.alloc(4096) as d2:
        with pytest.raises(accord.RemoteAccessError):
            reader.read_paged(d2, stale, page_nbytes=256, src_pages=[0], dst_pages=[0], imm=3).wait(timeout=10)
        assert not bytes(d2.obj).strip(b"\0")
        assert reader.imm_counter(3).value == 0
