"""accord.ep's plan on the CPU: the layout against a loop, and whole dispatch/combine rounds of
1-4 ranks run in one process with the kernels (scatter, one put a segment, the reduce) emulated
exactly as ep.cu does them, against the naive dispatcher (explicit permutation) and a
per-token sum. The GPU path runs the same plan functions; examples/ep_bench.py checks it on GPUs.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch

torch = pytest.importorskip("torch")

import accord.ep  # noqa: E402
import accord.nvrtc  # noqa: E402
from accord import _ep_plan as planning  # noqa: E402


def random_routing(tokens: int, experts: int, topk: int, seed: int, masked: float = 0.1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(tokens, experts, generator=g)
    idx = scores.topk(topk, dim=1).indices.to(torch.int64)
    drop = torch.rand(tokens, topk, generator=g) < masked
    return torch.where(drop, torch.full_like(idx, -1), idx)


def test_layout_matches_a_loop() -> None:
    ranks, experts, topk = 4, 32, 6
    idx = random_routing(50, experts, topk, seed=1, masked=0.3)
    per_rank, per_expert, in_rank = planning.dispatch_layout(idx, experts, ranks)
    want_in = torch.zeros(50, ranks, dtype=torch.bool)
    want_expert = torch.zeros(experts, dtype=torch.int32)
    for t in range(50):
        for e in idx[t].tolist():
            if e >= 0:
                want_in[t, e // (experts // ranks)] = True
                want_expert[e] += 1
    assert torch.equal(in_rank, want_in)
    assert torch.equal(per_expert, want_expert)
    assert torch.equal(per_rank, want_in.sum(0, dtype=torch.int32))
    assert per_rank.dtype == torch.int32 and per_expert.dtype == torch.int32


def test_meta_rows_round_trip() -> None:
    idx = random_routing(7, 16, 3, seed=2)
    weights = torch.rand(7, 3)
    meta = planning.pack_meta(idx, weights)
    assert meta.shape == (7, planning.meta_row_bytes(3)) and planning.meta_row_bytes(3) % 16 == 0
    got_idx, got_w, got_src = planning.unpack_meta(meta, 3)
    assert torch.equal(got_idx, idx) and torch.equal(got_w, weights)
    assert got_src.tolist() == list(range(7))


def scatter_rows(src: torch.Tensor, n: int, rows: torch.Tensor, targets: list[torch.Tensor]) -> None:
    """ep_scatter_rows: row i of src to targets[f][rows[i, f]] where rows[i, f] >= 0, i < n."""
    for i in range(n):
        for f, r in enumerate(rows[i].tolist()):
            if r >= 0:
                targets[f][r] = src[i]


def put_segments(me: int, args: torch.Tensor, src: torch.Tensor, dsts: list[torch.Tensor]) -> None:
    """ep_put_segments: for each peer r != me, args[r] = (rows, src row, dst row)."""
    for r, (count, at, to) in enumerate(args.tolist()):
        if r != me and count > 0:
            dsts[r][to : to + count] = src[at : at + count]


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_dispatch_and_combine_rounds_match_the_naive_dispatcher(ranks: int) -> None:
    experts, topk, hidden, tokens_max = 8 * ranks, min(4, 8 * ranks), 5, 12
    rows_max = ranks * tokens_max
    g = torch.Generator().manual_seed(ranks)
    for round_ in range(3):
        sizes = [int(torch.randint(0, tokens_max + 1, (1,), generator=g)) for _ in range(ranks)]
        sizes[round_ % ranks] = tokens_max  # a full rank every round, an empty one sometimes
        xs = [torch.randn(n, hidden, generator=g) for n in sizes]
        idxs = [random_routing(n, experts, topk, seed=100 * ranks + 10 * round_ + s) for s, n in enumerate(sizes)]
        weights = [torch.rand(n, topk, generator=g) for n in sizes]
        layouts = [planning.dispatch_layout(i, experts, ranks) for i in idxs]
        matrix = torch.stack([planning.count_row(pr, pe) for pr, pe, _ in layouts])
        chunks = 1 + round_ % 3  # 1, 2 and 3 chunks a segment
        plans = [planning.plan(matrix, layouts[s][2], s, rows_max, chunks) for s in range(ranks)]

        # Dispatch: pack (own rows straight to the receive window), then one put a peer.
        send = [torch.zeros(rows_max, hidden) for _ in range(ranks)]
        recv = [torch.full((rows_max, hidden), float("nan")) for _ in range(ranks)]
        send_meta = [torch.zeros(rows_max, planning.meta_row_bytes(topk), dtype=torch.uint8) for _ in range(ranks)]
        recv_meta = [torch.zeros_like(m) for m in send_meta]
        for s in range(ranks):
            targets = [send[s]] * ranks
            targets[s] = recv[s]
            scatter_rows(xs[s], sizes[s], plans[s].dispatch_rows, targets)
            meta_targets = [send_meta[s]] * ranks
            meta_targets[s] = recv_meta[s]
            scatter_rows(planning.pack_meta(idxs[s], weights[s]), sizes[s], plans[s].dispatch_rows, meta_targets)
        # The exact-size output, copied as accord.ep's _copy_out_by_chunk does: own rows at once,
        # then each chunk's rows of every sender as soon as that chunk arrived, before later
        # chunks land (the receive window starts as NaN: a span reaching into rows not yet
        # landed fails).
        prefixes = [plans[s].chunk_prefix for s in range(ranks)]
        spans = [
            planning.copy_out_spans(
                planning.chunk_receive_bounds(matrix, prefixes, r).reshape(-1).tolist(), ranks, r, chunks,
                int(plans[r].recv_total),
            )
            for r in range(ranks)
        ]
        copied = [torch.full((rows_max, hidden), float("nan")) for _ in range(ranks)]
        for r in range(ranks):
            first, end = spans[r].own
            assert not recv[r][first:end].isnan().any(), f"rank {r}'s own rows are not all packed"
            copied[r][first:end] = recv[r][first:end]
        for s in range(ranks):
            assert torch.equal(prefixes[s][-1], plans[s].dispatch_puts[:, 0]), "the chunks cover each segment"
        for c in range(chunks):
            # The rows in chunks (as the packing kernel puts them), every sender's chunk c.
            for s in range(ranks):
                prefix = prefixes[s]
                count = prefix[c + 1] - prefix[c]
                args = torch.stack([count, plans[s].dispatch_puts[:, 1] + prefix[c], plans[s].dispatch_puts[:, 2] + prefix[c]], 1)
                put_segments(s, args, send[s], recv)
            for r in range(ranks):
                for first, end in spans[r].per_chunk[c]:
                    assert not recv[r][first:end].isnan().any(), f"rank {r} copies rows of chunk {c} before they landed"
                    copied[r][first:end] = recv[r][first:end]
        for s in range(ranks):
            put_segments(s, plans[s].dispatch_puts, send_meta[s], recv_meta)

        reference = planning.reference_dispatch(xs, idxs, experts)
        for r in range(ranks):
            n = int(plans[r].recv_total)
            want_x, want_idx, want_src = reference[r]
            assert n == want_x.shape[0], f"rank {r} received {n} rows, want {want_x.shape[0]}"
            assert torch.equal(recv[r][:n], want_x), f"round {round_} rank {r}: rows differ"
            assert torch.equal(copied[r][:n], want_x), f"round {round_} rank {r}: the chunk-by-chunk copy differs"
            got_idx, _, got_src = planning.unpack_meta(recv_meta[r][:n], topk)
            assert torch.equal(got_idx, want_idx) and torch.equal(got_src, want_src)
            local, _ = planning.localize(got_idx, torch.ones_like(got_idx, dtype=torch.float32), r, experts // ranks)
            assert bool(((local >= 0) == ((want_idx // (experts // ranks)) == r)).all())

        # Combine: each rank's "expert" scales what it received by (rank + 1); the source sums.
        outs = [recv[r] * (r + 1) for r in range(ranks)]
        comb_send = [torch.zeros(rows_max, hidden) for _ in range(ranks)]
        comb_recv = [torch.full((rows_max, hidden), float("nan")) for _ in range(ranks)]
        for r in range(ranks):
            # ep_combine_send: other ranks' rows to the same rows of the send window, then each
            # chunk's part of every other rank's range put to it.
            n = int(plans[r].recv_total)
            puts = plans[r].combine_puts
            for s_, (count, first, _) in enumerate(puts.tolist()):
                if s_ != r:
                    comb_send[r][first : first + count] = outs[r][first : first + count]
            parts = planning.combine_chunk_puts(puts, n, r, chunks)
            moved = sum(p[:, 0] for p in parts)
            assert torch.equal(moved, torch.where(torch.arange(ranks) == r, 0, puts[:, 0])), "the chunks cover each range"
            for c, part in enumerate(parts):
                put_segments(r, part, comb_send[r], comb_recv)
                # The reduce's view (ep_plan's walk): each answer row this chunk put at rank s is
                # one that rank s waits for in chunk c of rank r.
                for s_, (count, _, to) in enumerate(part.tolist()):
                    if count:
                        delta, per = planning.combine_walk(matrix, s_, chunks)[r].tolist()
                        assert {(j + delta) // per for j in range(to, to + count)} == {c}
        for s in range(ranks):
            # ep_reduce: dispatch's rows index combine's receive window for other ranks and
            # combine's input (the receive order) for this rank's own.
            rows = plans[s].dispatch_rows
            got = torch.zeros(sizes[s], hidden)
            for t in range(sizes[s]):
                for r, at in enumerate(rows[t].tolist()):
                    if at >= 0:
                        got[t] += (outs[s] if r == s else comb_recv[s])[at]
            in_rank = layouts[s][2].to(torch.float32)
            want = xs[s] * (in_rank * torch.arange(1, ranks + 1, dtype=torch.float32)).sum(1, keepdim=True)
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    ("bounds", "culprit"),
    [
        ([0, 5, 4, 9, 3, 12], "rank 0"),  # sender 0's chunk ends before it starts
        ([0, 3, 2, 9, 4, 12], "rank 1"),  # sender 1's segment starts inside sender 0's
        ([0, 4, 2, 9, 4, 13], "rank 1"),  # past the 12 rows received
        ([-1, 4, 2, 9, 4, 12], "rank 0"),  # before the window
    ],
)
def test_copy_out_spans_refuse_bounds_that_do_not_fit(bounds: list[int], culprit: str) -> None:
    """The chunk bounds come from what peers announced: bounds that would copy outside the rows
    received, or the same rows twice, are refused with the sender named (2 ranks, 2 chunks)."""
    with pytest.raises(ValueError, match=culprit):
        planning.copy_out_spans(bounds, 2, 0, 2, 12)
    with pytest.raises(ValueError, match="bounds"):
        planning.copy_out_spans(bounds[:-1], 2, 0, 2, 12)


def test_fp8_metadata_rows_carry_the_scales_after_the_token_index() -> None:
    # DeepSeek-V3: top-8, hidden 7168 in blocks of 128 -> 56 float32 scales a row.
    assert planning.meta_row_bytes(8) == 112  # 8 ids, 8 weights, the index: 100 bytes, to 16
    assert planning.meta_row_bytes(8, 56) == 336  # plus 224 bytes of scales: 324, to 16
    assert planning.meta_row_bytes(1, 1) % planning.META_ALIGN == 0


def test_copy_out_spans_skip_empty_chunks_and_own_rows() -> None:
    # 3 ranks, 2 chunks, rank 1's view: sender 0 rows 0..4 (chunk 0: 0..4, chunk 1 empty), own
    # rows 4..6, sender 2 rows 6..9 (chunk 0 empty, chunk 1: 6..9).
    bounds = [0, 4, 6, 4, 5, 6, 4, 6, 9]
    spans = planning.copy_out_spans(bounds, 3, 1, 2, 9)
    assert spans.own == (4, 6)
    assert spans.per_chunk == [[(0, 4)], [(6, 9)]]


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_all_to_all_v_plan_matches_concatenation(ranks: int) -> None:
    """all_to_all_v with split sizes on the GPU: every rank's input grouped by destination, one
    segment a destination (its own copied locally), lands in source-rank order."""
    g = torch.Generator().manual_seed(7 + ranks)
    splits = torch.randint(0, 5, (ranks, ranks), generator=g)
    splits[0, ranks - 1] = 0  # an empty segment
    inputs = [torch.randn(int(splits[s].sum()), 3, generator=g) for s in range(ranks)]
    recv = [torch.full((4 * ranks * ranks, 3), float("nan")) for _ in range(ranks)]
    for s in range(ranks):
        puts, _ = planning.a2av_plan(splits, s)
        for r, (count, at, to) in enumerate(puts.tolist()):
            recv[r][to : to + count] = inputs[s][at : at + count]
    for r in range(ranks):
        _, summary = planning.a2av_plan(splits, r)
        want = torch.cat([inputs[s][int(splits[s, :r].sum()) : int(splits[s, : r + 1].sum())] for s in range(ranks)])
        assert int(summary[0]) == want.shape[0] and summary[1:].tolist() == splits[:, r].tolist()
        assert torch.equal(recv[r][: want.shape[0]], want)


def test_plan_needs_no_host_round_trip_shapes() -> None:
    """Every plan tensor's shape follows from the inputs' shapes, not their values (so the GPU
    path never waits on the host)."""
    ranks, experts = 3, 12
    for seed in range(3):
        idx = random_routing(9, experts, 2, seed=seed, masked=0.5)
        _, _, in_rank = planning.dispatch_layout(idx, experts, ranks)
        matrix = torch.randint(0, 9, (ranks, ranks + experts), dtype=torch.int64)
        p = planning.plan(matrix, in_rank, 1, 30, chunks=4)
        assert p.chunk_prefix.shape == (5, ranks)
        assert p.send_pos.shape == (9, ranks) and p.dispatch_rows.shape == (9, ranks)
        assert p.dispatch_puts.shape == (ranks, 3) and p.combine_puts.shape == (ranks, 3)
        assert p.recv_total.shape == (1,)


def test_ep_kernels_compile_with_nvrtc() -> None:
    """ep.cu (with the device header) compiles for Hopper wherever NVRTC is importable."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from accord import nvrtc

    source = (nvrtc.KERNEL_DIR / "ep.cu").read_text()
    cubin = nvrtc.compile_cubin(source, "ep.cu", "sm_90")
    assert len(cubin) > 1000
    defined = set(re.findall(r'extern "C" __global__ void(?: __launch_bounds__\(\w+\))? (\w+)\(', source))
    assert set(accord.ep.KERNELS) <= defined, f"launched but not defined: {set(accord.ep.KERNELS) - defined}"


def test_buffer_refuses_bad_arguments_before_touching_a_gpu() -> None:
    import accord.ep

    with pytest.raises(ValueError, match="dtype"):
        accord.ep.Buffer(hidden=8, num_experts=4, num_topk=2, max_tokens_per_rank=4, dtype=torch.int32)
    with pytest.raises(ValueError, match="hidden"):
        accord.ep.Buffer(hidden=0, num_experts=4, num_topk=2, max_tokens_per_rank=4)
    with pytest.raises(ValueError, match="low_latency"):
        accord.ep.Buffer(hidden=8, num_experts=4, num_topk=2, max_tokens_per_rank=4, dtype=torch.float32, low_latency=True)
    if not torch.cuda.is_available():
        with pytest.raises(accord.ep.EpError, match="CUDA"):
            accord.ep.Buffer(hidden=8, num_experts=4, num_topk=2, max_tokens_per_rank=4)


@pytest.mark.parametrize(
    ("wait", "loading", "lanes", "descriptors", "host"),
    [
        ("gpu", "", 0, 1, False),  # asked for: kept, whatever the environment
        ("host", "EAGER", 1, 1, True),
        ("auto", "EAGER", 1, 1, False),  # eager loading, every peer on a lane
        ("auto", "eager", 1, 1, False),
        ("auto", "", 1, 1, True),  # lazy loading (the default): a spinning wait can stall
        ("auto", "LAZY", 1, 1, True),
        ("auto", "EAGER", 0, 1, True),  # the network route: its staging synchronises the GPU
        ("auto", "EAGER", 2, 3, True),  # one of three peers not on a lane
    ],
)
def test_auto_waits_on_the_gpu_only_where_it_cannot_stall(
    wait: str, loading: str, lanes: int, descriptors: int, host: bool
) -> None:
    import accord.ep

    ranks = descriptors + 1
    assert accord.ep.waits_on_host(wait, loading, lanes, descriptors, ranks) is host


@pytest.mark.parametrize(
    ("struct", "offsets", "size"),
    [
        # ep.cu's structs passed by value, laid out as the C compiler lays them out (natural
        # alignment): a field moved on one side only would hand the kernels wrong pointers.
        ("_ChunkPuts", {"table": 0, "me": 8, "chunks": 12, "dst_window": 16, "src_window": 20, "sig": 24,
                        "per_chunk": 32, "prefix": 40, "segments": 48, "done": 56, "status": 64, "meta_segments": 72,
                        "meta_dst_window": 80, "meta_src_window": 84, "meta_sig": 88}, 96),
        ("_CombinePuts", {"table": 0, "me": 8, "chunks": 12, "dst_window": 16, "src_window": 20, "sig": 24,
                          "segments": 32, "done": 40, "status": 48}, 56),
        ("_ChunkWait", {"table": 0, "walk": 8, "epoch": 16, "timeout_ns": 24, "status": 32, "sig_base": 40}, 48),
        ("_LowLatency", {"table": 0, "me": 8, "ranks": 12, "experts": 16, "k": 20, "max_tokens": 24, "row_bytes": 32,
                         "recv_window": 40, "src_window": 44, "count_window": 48, "comb_window": 52, "sig": 56,
                         "blocks_done": 64, "status": 72}, 80),
    ],
)
def test_kernel_argument_structs_match_the_c_layout(struct: str, offsets: dict[str, int], size: int) -> None:
    import ctypes

    cls = getattr(accord.ep, struct)
    assert {name: getattr(cls, name).offset for name, _ in cls._fields_} == offsets
    assert ctypes.sizeof(cls) == size
    # The C side declares the same fields in the same order (names match ep.cu's).
    source = (accord.nvrtc.KERNEL_DIR / "ep.cu").read_text()
    body = source[source.index("struct " + struct.lstrip("_").replace("LowLatency", "LowLatency") + " {") :]
    body = body[: body.index("};")]
    declared = re.findall(r"(\w+)(?:\s*,|\s*;)", re.sub(r"//[^\n]*", "", body))
    assert declared == list(offsets), declared
