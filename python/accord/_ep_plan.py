"""The plan of an expert-parallel dispatch and combine (accord.ep), as torch operations.

On the GPU, accord.ep computes the plan with ep.cu's kernels; this module is their torch twin,
which the CPU tests (tests/python/test_ep.py) check against a reference, and
``dispatch_layout`` is ``Buffer.get_dispatch_layout``. ``dispatch_layout`` and ``plan`` run on the
tensors' device without a host round trip (no ``.item()``, no ``nonzero``, no shape that depends
on the data); ``combine_chunk_puts`` and ``combine_walk`` are host-side references of what the
kernels compute per chunk, for the tests only.

Notation: ``R`` ranks, this rank ``me``, ``E`` experts (``E // R`` a rank, rank ``r`` holds experts
``r * E // R ..``), ``T`` tokens here, ``k`` experts a token. After the count exchange every rank
holds the same matrix ``M`` (``R x (R + E)``): row ``s`` is what rank ``s`` announced, its tokens
per destination rank (``C = M[:, :R]``, ``C[s, r]`` tokens go from ``s`` to ``r``) and its tokens
per expert. Rows move in contiguous segments, one per (sender, receiver):

* the sender packs its rows for ``r`` at ``send_prefix[r] = sum(C[me, :r])`` in its send window,
  tokens in their original order;
* the receiver keeps rows from ``s`` at ``recv_prefix[s] = sum(C[:s, me])``, so what it received is
  in source-rank order, as DeepEP and ``all_to_all_single`` give it;
* combine sends each segment back to its sender, where it lands at the sender's
  ``send_prefix``; the sender then sums, for each token, the rows of every rank it went to (its
  own rank's straight from combine's input, which is in the receive order).

Dispatch's rows may also move in ``chunks`` pieces a segment (tokens ``[c*S, (c+1)*S)``, ``S =
ceil(T / chunks)``), each put as soon as its tokens are packed: ``chunk_prefix`` gives, per chunk
boundary and rank, the rows before it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

META_ALIGN = 16


def meta_row_bytes(num_topk: int, scale_words: int = 0) -> int:
    """Bytes of a token's metadata row: k int64 expert ids, k float32 weights, the int32 token
    index, then (fp8 rows) ``scale_words`` float32 scales, rounded up to 16 bytes."""
    return (12 * num_topk + 4 + 4 * scale_words + META_ALIGN - 1) // META_ALIGN * META_ALIGN


def dispatch_layout(
    topk_idx: torch.Tensor, num_experts: int, num_ranks: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeepEP's ``get_dispatch_layout``: (tokens per rank ``[R]`` int32, tokens per expert ``[E]``
    int32, token-in-rank mask ``[T, R]`` bool) from ``topk_idx`` (``[T, k]`` int64, ``-1`` = no expert).
    A token counts once for a rank however many of its experts live there."""
    valid = topk_idx >= 0
    idx = torch.where(valid, topk_idx, torch.zeros_like(topk_idx))
    per_expert = torch.zeros(num_experts, dtype=torch.int64, device=topk_idx.device)
    per_expert.scatter_add_(0, idx.reshape(-1), valid.reshape(-1).to(torch.int64))
    rank_of = idx // (num_experts // num_ranks)
    hits = torch.zeros(topk_idx.shape[0], num_ranks, dtype=torch.int32, device=topk_idx.device)
    hits.scatter_add_(1, rank_of, valid.to(torch.int32))
    in_rank = hits > 0
    return in_rank.sum(0, dtype=torch.int32), per_expert.to(torch.int32), in_rank


def count_row(num_tokens_per_rank: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
    """The row this rank announces in the count exchange: ``[R + E]`` int64."""
    return torch.cat([num_tokens_per_rank.to(torch.int64), num_tokens_per_expert.to(torch.int64)])


def exclusive_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.cumsum(x, dim) - x


class Plan(NamedTuple):
    """What one dispatch needs, and what its combine reuses (all on the tokens' device)."""

    counts: torch.Tensor  # C, [R, R] int64
    send_pos: torch.Tensor  # [T, R] int64: row of (t, r) in this rank's send layout, -1 if t skips r
    dispatch_rows: torch.Tensor  # [T, R] int64: scatter rows, send window for r != me, receive window for me
    dispatch_puts: torch.Tensor  # [R, 3] int64, rows: (count, src row, dst row) of this rank's segment to r
    recv_total: torch.Tensor  # [1] int64: rows received (sum of C[:, me])
    combine_puts: torch.Tensor  # [R, 3] int64: (count, src row, dst row) of segment sent back to r
    chunk_prefix: torch.Tensor  # [chunks + 1, R] int64: rows of this rank's segment to r before each chunk


def plan(matrix: torch.Tensor, in_rank: torch.Tensor, me: int, rows_max: int, chunks: int = 1) -> Plan:
    """The plan from the exchanged count matrix (``[R, R + E]``), this rank's token-in-rank mask,
    the number of rows a receive window holds and the chunks a segment moves in."""
    ranks = matrix.shape[0]
    counts = matrix[:, :ranks]
    hit = in_rank.to(torch.int64)
    within = exclusive_cumsum(hit, 0)  # index of token t among those this rank sends to r
    send_prefix = exclusive_cumsum(counts, 1)  # [s, r]: where s keeps its rows for r
    recv_prefix = exclusive_cumsum(counts, 0)  # [s, r]: where r keeps rows from s
    send_pos = torch.where(in_rank, send_prefix[me].unsqueeze(0) + within, -1)
    self_rows = torch.where(in_rank[:, me], recv_prefix[me, me] + within[:, me], -1)
    dispatch_rows = send_pos.clone()
    dispatch_rows[:, me] = self_rows
    dispatch_puts = torch.stack([counts[me], send_prefix[me], recv_prefix[me]], dim=1)

    # Receive side: combine copies each received row of another rank to the same row of its
    # send window (ep.cu's ep_combine_send) and sends each rank's range back from there.
    from_counts = counts[:, me]
    recv_total = from_counts.sum().reshape(1)
    # Segment back to s: C[s, me] rows from where s's rows landed here, to where s keeps its
    # rows for me.
    combine_puts = torch.stack([from_counts, recv_prefix[:, me], send_prefix[:, me]], dim=1)
    tokens = in_rank.shape[0]
    per_chunk = -(-tokens // chunks) if tokens else 0
    bounds = torch.tensor([min(c * per_chunk, tokens) for c in range(chunks + 1)], dtype=torch.int64)
    before = torch.cat([torch.zeros(1, ranks, dtype=torch.int64, device=hit.device), torch.cumsum(hit, 0)])
    chunk_prefix = before.index_select(0, bounds.to(hit.device))
    return Plan(counts, send_pos, dispatch_rows, dispatch_puts, recv_total, combine_puts, chunk_prefix)


def chunk_receive_bounds(matrix: torch.Tensor, sender_prefixes: list[torch.Tensor], me: int) -> torch.Tensor:
    """``[chunks + 1, R]``: the receive-window row where each sender's dispatch chunk starts at
    rank ``me`` (row ``chunks``: the end of its segment), as ep.cu's ep_plan publishes them to the
    host: ``recv_prefix[s, me] + chunk_prefix_s[c, me]``. ``sender_prefixes[s]`` is rank ``s``'s
    ``Plan.chunk_prefix`` (what its count row carries)."""
    ranks = matrix.shape[0]
    recv_prefix = exclusive_cumsum(matrix[:, :ranks], 0)
    return torch.stack([recv_prefix[s, me] + sender_prefixes[s][:, me] for s in range(ranks)], dim=1)


class CopySpans(NamedTuple):
    """The receive-window rows dispatch copies into its output, and when (``copy_out_spans``)."""

    own: tuple[int, int]  # this rank's own rows: packed locally, copied at once
    per_chunk: list[list[tuple[int, int]]]  # [chunk]: other senders' rows of that chunk, once its signal arrived


def copy_out_spans(bounds: list[int], ranks: int, me: int, chunks: int, rows: int) -> CopySpans:
    """What the exact-size dispatch copies from its receive window, chunk by chunk, on the copy
    engine (accord.ep's ``_copy_out_by_chunk``): from ``bounds`` (``chunk_receive_bounds`` flattened,
    ``[(chunks + 1) * ranks]``, published by the GPU) this rank's own rows, then for each chunk
    ``c`` the non-empty ``[first, end)`` row ranges of every other sender's chunk ``c``. The bounds
    derive from what peers announced, so they are checked: each sender's bounds must increase,
    its segment must follow the previous sender's, and all must fit the ``rows`` received;
    otherwise ValueError names the sender."""
    if len(bounds) != (chunks + 1) * ranks:
        raise ValueError(f"{len(bounds)} chunk bounds, want {(chunks + 1) * ranks}")
    previous_end = 0
    for s in range(ranks):
        column = [bounds[c * ranks + s] for c in range(chunks + 1)]
        ordered = all(a <= b for a, b in zip(column, column[1:]))
        if not ordered or column[0] < previous_end or column[-1] > rows:
            raise ValueError(f"rank {s}'s chunk bounds {column} are not increasing within rows {previous_end}..={rows}")
        previous_end = column[-1]
    own = (bounds[me], bounds[chunks * ranks + me])
    per_chunk = [
        [(bounds[c * ranks + s], bounds[(c + 1) * ranks + s]) for s in range(ranks)
         if s != me and bounds[(c + 1) * ranks + s] > bounds[c * ranks + s]]
        for c in range(chunks)
    ]
    return CopySpans(own, per_chunk)


def combine_chunk_puts(combine_puts: torch.Tensor, received: int, me: int, chunks: int) -> list[torch.Tensor]:
    """What ep.cu's ep_combine_send puts for each of ``chunks`` chunks: ``[R, 3]`` (rows,
    send-window row, row at the peer) per chunk, the part of each other rank's range that falls
    in the chunk (0 rows: a signal alone). The chunks split the ``m`` received rows that go back to
    other ranks (this rank's own range skipped) into ``ceil(m / chunks)``-row pieces in receive
    order. The kernel's reference for the CPU tests; it reads ``received`` on the host, which the
    kernel does not."""
    ranks = combine_puts.shape[0]
    own_first = min(int(combine_puts[me, 1]), received)
    own_count = min(int(combine_puts[me, 0]), received - own_first)
    m = received - own_count
    per = -(-m // chunks) if m else 1

    def row_of(j: int) -> int:
        return j if j < own_first else j + own_count

    out = []
    for c in range(chunks):
        rows = torch.zeros(ranks, 3, dtype=torch.int64)
        if c * per < m:
            lo, hi = c * per, min((c + 1) * per, m)
            first_row, end_row = row_of(lo), received if hi == m else row_of(hi)
            for r, (count, first, to) in enumerate(combine_puts.tolist()):
                a, b = max(first_row, first), min(end_row, first + count)
                if r != me and b > a:
                    rows[r] = torch.tensor([b - a, a, to + a - first])
        out.append(rows)
    return out


def combine_walk(matrix: torch.Tensor, me: int, chunks: int) -> torch.Tensor:
    """``[R, 2]`` (delta, chunk rows) per rank ``r``, as ep.cu's ep_plan computes them: this
    rank's answer row ``j`` from ``r`` (in ``r``'s segment of combine's receive window) comes in
    ``r``'s combine chunk ``(j + delta) // chunk_rows`` (see ``combine_chunk_puts``)."""
    ranks = matrix.shape[0]
    counts = matrix[:, :ranks]
    send_prefix = exclusive_cumsum(counts, 1)
    recv_prefix = exclusive_cumsum(counts, 0)
    out = torch.zeros(ranks, 2, dtype=torch.int64)
    for r in range(ranks):
        received, own_first, own_count = int(counts[:, r].sum()), int(recv_prefix[r, r]), int(counts[r, r])
        m = received - own_count
        start = int(recv_prefix[me, r])
        start = start if start < own_first else start - own_count
        out[r, 0] = start - int(send_prefix[me, r])
        out[r, 1] = -(-m // chunks) if chunks > 0 and m > 0 else 1
    return out


def pack_meta(topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """``[T, meta_row_bytes(k)]`` uint8 rows: the token's expert ids, weights and index."""
    tokens, k = topk_idx.shape
    width = meta_row_bytes(k)
    out = torch.zeros(tokens, width, dtype=torch.uint8, device=topk_idx.device)
    out[:, : 8 * k] = topk_idx.to(torch.int64).contiguous().view(torch.uint8).reshape(tokens, 8 * k)
    out[:, 8 * k : 12 * k] = topk_weights.to(torch.float32).contiguous().view(torch.uint8).reshape(tokens, 4 * k)
    index = torch.arange(tokens, dtype=torch.int32, device=topk_idx.device)
    out[:, 12 * k : 12 * k + 4] = index.view(torch.uint8).reshape(tokens, 4)
    return out


def unpack_meta(meta: torch.Tensor, num_topk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(expert ids ``[N, k]`` int64, weights ``[N, k]`` float32, source token index ``[N]`` int32)."""
    k = num_topk
    rows = meta.shape[0]
    idx = meta[:, : 8 * k].contiguous().view(torch.int64).reshape(rows, k)
    weights = meta[:, 8 * k : 12 * k].contiguous().view(torch.float32).reshape(rows, k)
    index = meta[:, 12 * k : 12 * k + 4].contiguous().view(torch.int32).reshape(rows)
    return idx, weights, index


def localize(
    topk_idx: torch.Tensor, topk_weights: torch.Tensor, me: int, experts_per_rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepEP's received ids: an expert of this rank becomes its local index, any other ``-1``
    (and its weight 0)."""
    local = topk_idx - me * experts_per_rank
    mine = (topk_idx >= 0) & (local >= 0) & (local < experts_per_rank)
    return torch.where(mine, local, -1), torch.where(mine, topk_weights, torch.zeros_like(topk_weights))


def reference_dispatch(
    xs: list[Any], idxs: list[Any], num_experts: int
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """What each rank must receive, by explicit permutation (the naive dispatcher, one process):
    rank r gets, in source-rank then token order, every token with an expert on r, with its
    global expert ids and its index at the source."""
    ranks = len(xs)
    out = []
    for r in range(ranks):
        parts_x, parts_idx, parts_src = [], [], []
        for s in range(ranks):
            _, _, in_rank = dispatch_layout(idxs[s], num_experts, ranks)
            take = in_rank[:, r].nonzero().reshape(-1)
            parts_x.append(xs[s].index_select(0, take))
            parts_idx.append(idxs[s].index_select(0, take))
            parts_src.append(take.to(torch.int32))
        out.append((torch.cat(parts_x), torch.cat(parts_idx), torch.cat(parts_src)))
    return out


def a2av_plan(matrix: torch.Tensor, me: int) -> tuple[torch.Tensor, torch.Tensor]:
    """all_to_all_v's plan (ep.cu's ep_a2av_plan) in rows: ``[R, 3]`` (rows, input row, row at the
    receiver) of this rank's segment to each rank, and ``[1 + R]`` (rows received, rows from each
    rank). ``matrix[s, r]``: rows rank ``s`` sends to ``r`` (its split sizes)."""
    ranks = matrix.shape[0]
    counts = matrix[:, :ranks]
    puts = torch.stack([counts[me], exclusive_cumsum(counts[me], 0), exclusive_cumsum(counts, 0)[me]], dim=1)
    summary = torch.cat([counts[:, me].sum().reshape(1), counts[:, me]])
    return puts, summary

