"""accord.ep against the naive dispatcher (permute + NCCL all_to_all_single) and DeepEP, at the
DeepSeek-V3 shape (hidden 7168, top-8 of 256 experts, bf16), checked bit for bit first.

    torchrun --nproc-per-node 2 examples/ep_bench.py                  # normal mode, 4096 tokens a rank
    torchrun --nproc-per-node 2 examples/ep_bench.py --tokens 128 --graph   # + graph-replayed, no host sync

Every rank builds its own routing (random top-k scores, seeded by rank), dispatches it with
accord.ep and with the naive dispatcher over NCCL (the reference: explicit permutation and
all_to_all_single), and compares received rows, expert ids and source indices bit for bit, then
combine within bf16 tolerance (fp32 sums). Then it times each side with CUDA events, the ranks
meeting at a barrier before each measurement, and rank 0 prints one table (time per call and
GB/s in DeepEP's accounting: bytes of the rows this rank received, its own included).

DeepEP is measured when ``import deep_ep`` works (scripts/device/ep.sh builds it from its public
source), with its default intranode config at ``--sms`` SMs. Exits 0 when every check passed, 1
on a wrong result, 2 when torch, CUDA or NCCL is missing.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any


def stage(rank: int, what: str) -> None:
    """A progress line on stderr (unbuffered), so a run cut short shows how far each rank got."""
    print(f"[ep_bench rank {rank} +{time.monotonic() - START:.1f}s] {what}", file=sys.stderr, flush=True)


START = time.monotonic()


def missing(why: str) -> SystemExit:
    print(f"ep_bench: {why}", file=sys.stderr, flush=True)
    return SystemExit(2)


def fp8_pair(torch: Any, x: Any) -> tuple[Any, Any]:
    """DeepEP's fp8 form of bf16 rows: e4m3 values and a float32 scale per 128 values (the
    block's largest magnitude over e4m3's largest, 448)."""
    blocks = x.float().view(x.shape[0], -1, 128)
    scales = blocks.abs().amax(dim=2).clamp(min=1e-4) / 448.0
    values = (blocks / scales.unsqueeze(2)).view(x.shape).to(torch.float8_e4m3fn)
    return values.contiguous(), scales.contiguous()


def routing(torch: Any, tokens: int, experts: int, topk: int, seed: int, device: Any) -> tuple[Any, Any]:
    g = torch.Generator(device="cpu").manual_seed(seed)
    scores = torch.rand(tokens, experts, generator=g)
    weights, idx = scores.topk(topk, dim=1)
    return idx.to(torch.int64).to(device), weights.to(torch.float32).to(device)


def routing_variants(torch: Any, x: Any, experts: int, topk: int, ranks: int, rank: int) -> dict[str, tuple[Any, Any, Any]]:
    """Routings that stress the plan, each (x, topk_idx, topk_weights) for this rank: a skew where
    expert 0 takes half the tokens; no token choosing the upper half of the experts (so those
    experts, and with 2 ranks the last rank, receive nothing); a tenth of the slots masked (-1);
    and rank 1 with no tokens at all."""
    tokens, dev = x.shape[0], x.device
    g = torch.Generator(device="cpu").manual_seed(7000 + rank)
    scores = torch.rand(tokens, experts, generator=g)
    skew = scores.clone()
    skew[: tokens // 2, 0] = 2.0
    low = scores.clone()
    low[:, experts // 2 :] = -1.0
    out = {}
    for name, sc in (("skew", skew), ("upper experts empty", low), ("masked slots", scores)):
        w, idx = sc.topk(min(topk, experts // 2), dim=1) if name == "upper experts empty" else sc.topk(topk, dim=1)
        if idx.shape[1] < topk:  # fewer experts to choose from than k: pad with -1
            pad = topk - idx.shape[1]
            idx = torch.cat([idx, torch.full((tokens, pad), -1, dtype=idx.dtype)], 1)
            w = torch.cat([w, torch.zeros(tokens, pad)], 1)
        if name == "masked slots":
            mask = torch.rand(tokens, topk, generator=g) < 0.1
            idx = torch.where(mask, -1, idx)
            w = torch.where(mask, 0.0, w)
        out[name] = (x, idx.to(torch.int64).to(dev), w.to(torch.float32).to(dev))
    empty = x[:0] if rank == 1 else x
    idx, w = out["skew"][1][: empty.shape[0]], out["skew"][2][: empty.shape[0]]
    out["rank 1 without tokens"] = (empty, idx, w)
    return out


class Naive:
    """What users fall back to: permute per destination, all_to_all_single over NCCL, and back."""

    def __init__(self, torch: Any, dist: Any, ranks: int, experts: int) -> None:
        self.torch, self.dist, self.ranks, self.experts = torch, dist, ranks, experts

    def dispatch(self, x: Any, topk_idx: Any) -> tuple[Any, Any, Any, tuple[Any, list[int], list[int]]]:
        torch, dist = self.torch, self.dist
        from accord import _ep_plan as planning

        _, _, in_rank = planning.dispatch_layout(topk_idx, self.experts, self.ranks)
        picks = [in_rank[:, r].nonzero().reshape(-1) for r in range(self.ranks)]
        order = torch.cat(picks)
        send_splits = [int(p.numel()) for p in picks]
        counts = torch.tensor(send_splits, dtype=torch.int64, device=x.device)
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts)
        recv_splits = recv_counts.tolist()
        total = sum(recv_splits)
        recv_x = torch.empty(total, x.shape[1], dtype=x.dtype, device=x.device)
        dist.all_to_all_single(recv_x, x.index_select(0, order), recv_splits, send_splits)
        recv_idx = torch.empty(total, topk_idx.shape[1], dtype=torch.int64, device=x.device)
        dist.all_to_all_single(recv_idx, topk_idx.index_select(0, order), recv_splits, send_splits)
        recv_src = torch.empty(total, dtype=torch.int64, device=x.device)
        dist.all_to_all_single(recv_src, order, recv_splits, send_splits)
        return recv_x, recv_idx, recv_src, (order, send_splits, recv_splits)

    def combine(self, y: Any, tokens: int, ctx: tuple[Any, list[int], list[int]]) -> Any:
        torch, dist = self.torch, self.dist
        order, send_splits, recv_splits = ctx
        back = torch.empty(sum(send_splits), y.shape[1], dtype=y.dtype, device=y.device)
        dist.all_to_all_single(back, y, send_splits, recv_splits)
        out = torch.zeros(tokens, y.shape[1], dtype=torch.float32, device=y.device)
        out.index_add_(0, order, back.to(torch.float32))
        return out.to(y.dtype)


def low_latency_round(
    torch: Any, dist: Any, ll: Any, x: Any, topk_idx: Any, topk_w: Any, rank: int, ranks: int, experts: int
) -> tuple[dict[str, bool], Any, Any]:
    """One checked low-latency dispatch and combine: every (token, expert) row each local expert
    received, against all ranks' inputs gathered here (as a set per expert and source: slots are
    claimed in no particular order), bit for bit; combine against the weighted sum of the
    stand-in experts' outputs in fp32. Returns the checks and the dispatch's result."""
    tokens, k = topk_idx.shape
    local = experts // ranks
    xs = [torch.empty_like(x) for _ in range(ranks)]
    idxs = [torch.empty_like(topk_idx) for _ in range(ranks)]
    dist.all_gather(xs, x)
    dist.all_gather(idxs, topk_idx)
    got = ll.low_latency_dispatch(x, topk_idx)
    x_all, idx_all = torch.stack(xs), torch.stack(idxs)  # [R, T, H], [R, T, k]
    counts, layout = got.recv_count.tolist(), got.handle.layout.tolist()
    rows_ok = True
    for lo in range(local):
        e = rank * local + lo
        n = counts[lo]
        want = int((idx_all == e).sum())
        offsets = [v >> 32 for v in layout[lo]] + [n]
        sources = torch.cat([torch.full((offsets[s + 1] - offsets[s],), s, dtype=torch.int64) for s in range(ranks)]).to(x.device)
        tj = got.handle.src_info[lo, :n].to(torch.int64)
        t, j = tj // k, tj % k
        keys = sources * tokens * k + tj
        rows_ok = rows_ok and n == want and keys.unique().numel() == n
        if n:
            rows_ok = rows_ok and bool((idx_all[sources, t, j] == e).all()) and torch.equal(got.x[lo, :n], x_all[sources, t])
    # The experts: rank r's scale their rows by r + 1 (exact in bf16).
    y = expert(torch, got.x, rank)
    out = ll.low_latency_combine(y, topk_idx, topk_w, got.handle)
    per_rank = torch.where(topk_idx >= 0, topk_idx // local + 1, 0).to(torch.float32)  # the expert's rank + 1, or 0
    scaled = (x.unsqueeze(1).to(torch.float32) * per_rank.unsqueeze(2)).to(x.dtype).to(torch.float32)  # [T, k, H]
    want_out = (scaled * topk_w.unsqueeze(2)).sum(1)
    checks = {
        "low-latency dispatch rows bit for bit": rows_ok,
        "low-latency combine within bf16 tolerance": torch.allclose(out.float(), want_out, rtol=1e-2, atol=1e-2),
    }
    return checks, got, out


def timed(torch: Any, dist: Any, fn: Callable[[], Any], iters: int, warmup: int = 3) -> float:
    """Seconds per call: warm-up, a barrier, then `iters` calls between CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / 1e3 / iters


def profile(
    torch: Any, dist: Any, rank: int, calls: dict[str, Callable[[], Any]], trace_dir: str = "", tag: str = "ep"
) -> None:
    """Host time per call (no synchronisation), then torch.profiler's tables, on rank 0, and each
    rank's timeline (kernels, the proxy's copies, host calls) as a Chrome trace in `trace_dir`,
    where each call of `calls` is marked by a record_function range of its name."""
    for name, fn in calls.items():
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(10):
            fn()
        host = (time.perf_counter() - t0) / 10
        torch.cuda.synchronize()
        if rank == 0:
            print(f"# profile: {name} host time per call without synchronisation {host * 1e6:.1f} us", flush=True)
        # Where that host time goes, by Python function (the launches, the tensor views, the
        # allocations): cProfile over 20 calls, the slowest functions by their own time.
        import cProfile
        import pstats

        dist.barrier()
        prof_host = cProfile.Profile()
        prof_host.enable()
        for _ in range(20):
            fn()
        prof_host.disable()
        torch.cuda.synchronize()
        if rank == 0:
            print(f"# profile: {name}: cProfile of 20 calls (tottime = own time; seconds over the 20 calls)", flush=True)
            pstats.Stats(prof_host).sort_stats("tottime").print_stats(22)
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    torch.cuda.synchronize()
    dist.barrier()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            for name, fn in calls.items():
                with record_function(f"ep:{name}"):
                    fn()
                torch.cuda.synchronize()
                dist.barrier()
        # The same calls back to back, as the timed loop runs them: where the GPU waits between
        # calls in the steady state (scripts/device/trace_summary.py --range "ep:steady <name>").
        for name, fn in calls.items():
            with record_function(f"ep:steady {name}"):
                for _ in range(4):
                    fn()
            torch.cuda.synchronize()
            dist.barrier()
    if rank == 0:
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=30), flush=True)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20), flush=True)
    if trace_dir:
        prof.export_chrome_trace(os.path.join(trace_dir, f"{tag}_trace_rank{rank}.json"))


def captured(torch: Any, dist: Any, step: Callable[[], Any]) -> tuple[Any, Any]:
    """``step`` run twice on a side stream (warm-up), then captured once in a CUDA graph, every
    rank in step (a barrier before and after the capture): the graph and the captured result."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    dist.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    torch.cuda.synchronize()
    dist.barrier()
    return graph, out


def replays_with_new_routing(
    torch: Any, graph: Any, static: tuple[Any, Any], shape: tuple[int, int, int], seed: int, rank: int, device: Any
) -> Iterator[tuple[int, Any, Any]]:
    """Three replays of ``graph``, each after new routing (``shape`` is tokens, experts, top-k;
    seeded by ``seed``, the replay and the rank) was copied into its ``static`` index and weight
    tensors: yields the replay's number and that routing once the replay finished."""
    static_idx, static_w = static
    for replay in range(3):
        new_idx, new_w = routing(torch, *shape, seed=seed * (replay + 1) + rank, device=device)
        static_idx.copy_(new_idx)
        static_w.copy_(new_w)
        graph.replay()
        torch.cuda.synchronize()
        yield replay, new_idx, new_w


def expert(torch: Any, recv_x: Any, rank: int) -> Any:
    """A stand-in for the experts: a per-rank scale, exact in bf16."""
    return (recv_x.to(torch.float32) * (rank + 1)).to(recv_x.dtype)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--sms", type=int, default=24, help="accord.ep pack/reduce blocks and DeepEP's num_sms")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--graph", action="store_true", help="also time dispatch+combine captured in a CUDA graph (num_worst_tokens)")
    p.add_argument("--no-peers", action="store_true", help="accord.ep only (the network route: nothing else runs there)")
    p.add_argument("--timeout", type=float, default=60.0, help="accord.ep's bound on every wait (s)")
    p.add_argument("--wait", choices=["auto", "gpu", "host"], default="auto", help="accord.ep's waits: a kernel, or the host")
    p.add_argument("--lanes", choices=["on", "off"], default="on", help="the proxy's stream lanes (off: engine writes)")
    p.add_argument("--chunks", type=int, default=None, help="accord.ep puts a segment in this many chunks as it packs (0: one put after; default: the Buffer's)")
    p.add_argument("--lane-aside-bytes", type=int, default=0, help="the proxy lanes put a batch's stores on a second stream from this many bytes (0, the default: never)")
    p.add_argument("--profile", action="store_true", help="print torch.profiler tables of dispatch and combine (rank 0)")
    p.add_argument("--trace-dir", default="", help="with --profile: write each rank's Chrome trace here")
    p.add_argument("--low-latency", action="store_true", help="also check and time low_latency_dispatch/combine (a second buffer)")
    p.add_argument("--label", default="", help="printed with the table (e.g. the route)")
    args = p.parse_args(argv)
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        raise missing(f"needs torch ({e})") from None
    if not torch.cuda.is_available():
        raise missing("needs CUDA GPUs")
    import accord.ep

    # A rank stuck for three wait bounds prints every thread's Python stack (then keeps going).
    faulthandler.dump_traceback_later(3 * args.timeout + 15, repeat=True)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, ranks = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", local)
    T, H, E, K = args.tokens, args.hidden, args.experts, args.topk
    g = torch.Generator(device="cpu").manual_seed(1000 + rank)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16).to(dev)
    topk_idx, topk_w = routing(torch, T, E, K, seed=rank, device=dev)
    rows: list[tuple[str, float, float]] = []
    failures: list[str] = []

    t0 = time.time()
    buffer = accord.ep.Buffer(
        dist.group.WORLD, hidden=H, num_experts=E, num_topk=K, max_tokens_per_rank=T, sms=args.sms, timeout=args.timeout, wait=args.wait, lanes=args.lanes == "on",
        **({} if args.chunks is None else {"chunks": args.chunks}), lane_stores_aside_bytes=args.lane_aside_bytes,
    )
    setup_s = time.time() - t0
    naive = Naive(torch, dist, ranks, E)

    stage(rank, "buffer up")
    # ---- correctness: accord.ep against the naive dispatcher ----
    got = buffer.dispatch(x, topk_idx, topk_w)
    ref_x, ref_idx, ref_src, ctx = naive.dispatch(x, topk_idx)
    from accord import _ep_plan as planning

    ref_local, _ = planning.localize(ref_idx, torch.ones_like(ref_idx, dtype=torch.float32), rank, E // ranks)
    checks = {
        "dispatch rows bit for bit": torch.equal(got.x, ref_x),
        "dispatch expert ids": torch.equal(got.topk_idx, ref_local),
        "dispatch source index": torch.equal(got.src_index.to(torch.int64), ref_src),
        "per-expert counts": got.num_recv_tokens_per_expert
        == torch.bincount(ref_local[ref_local >= 0], minlength=E // ranks).tolist(),
    }
    y = expert(torch, got.x, rank)
    combined = buffer.combine(y, got.handle)
    ref_combined = naive.combine(expert(torch, ref_x, rank), T, ctx)
    diff = (combined.float() - ref_combined.float()).abs().max().item() if T else 0.0
    checks["combine within bf16 tolerance"] = torch.allclose(combined.float(), ref_combined.float(), rtol=1e-2, atol=1e-2)
    checks["combine bit for bit"] = torch.equal(combined, ref_combined)
    worst = buffer.dispatch(x, topk_idx, topk_w, num_worst_tokens=ranks * T)
    n = int(worst.num_recv.item())
    checks["num_worst_tokens rows"] = n == ref_x.shape[0] and torch.equal(worst.x[:n], ref_x)
    checks["num_worst_tokens combine"] = torch.equal(buffer.combine(expert(torch, worst.x, rank), worst.handle), combined)
    stage(rank, "first round checked")
    for name, (v_x, v_idx, v_w) in routing_variants(torch, x, E, K, ranks, rank).items():
        stage(rank, f"routing {name}")
        v_got = buffer.dispatch(v_x, v_idx, v_w)
        v_ref_x, v_ref_idx, v_ref_src, v_ctx = naive.dispatch(v_x, v_idx)
        v_local, _ = planning.localize(v_ref_idx, torch.ones_like(v_ref_idx, dtype=torch.float32), rank, E // ranks)
        v_comb = buffer.combine(expert(torch, v_got.x, rank), v_got.handle)
        v_want = naive.combine(expert(torch, v_ref_x, rank), v_x.shape[0], v_ctx)
        v_worst = buffer.dispatch(v_x, v_idx, v_w, num_worst_tokens=ranks * T)
        v_n = int(v_worst.num_recv.item())
        checks[f"routing '{name}': dispatch and combine"] = (
            torch.equal(v_got.x, v_ref_x)
            and torch.equal(v_got.topk_idx, v_local)
            and torch.equal(v_got.src_index.to(torch.int64), v_ref_src)
            and torch.allclose(v_comb.float(), v_want.float(), rtol=1e-2, atol=1e-2)
            and v_n == v_ref_x.shape[0]
            and torch.equal(v_worst.x[:v_n], v_ref_x)
        )
    required = [name for name in checks if name != "combine bit for bit"]  # the issue asks bf16 tolerance
    failures.extend(f"rank {rank}: {name}" for name in required if not checks[name])
    recv_bytes = ref_x.numel() * ref_x.element_size()

    if args.profile:
        calls = {
            "dispatch num_worst": lambda: buffer.dispatch(x, topk_idx, topk_w, num_worst_tokens=ranks * T),
            "dispatch exact": lambda: buffer.dispatch(x, topk_idx, topk_w),
            "combine": lambda: buffer.combine(y, got.handle),
        }
        profile(torch, dist, rank, calls, args.trace_dir)

    stage(rank, "timing")
    # ---- timing ----
    def add(name: str, seconds: float, moved: int = 0) -> None:
        """A timed row; GB/s over `moved` bytes (default: the received bf16 rows)."""
        rows.append((name, seconds * 1e6, (moved or recv_bytes) / seconds / 1e9))
        stage(rank, f"timed {name}: {seconds * 1e6:.1f} us")  # kept even if a later part fails

    add("accord.ep dispatch", timed(torch, dist, lambda: buffer.dispatch(x, topk_idx, topk_w), args.iters))
    add(
        "accord.ep dispatch, zero_copy",
        timed(torch, dist, lambda: buffer.dispatch(x, topk_idx, topk_w, zero_copy=True), args.iters),
    )
    add(
        "accord.ep dispatch, num_worst_tokens",
        timed(torch, dist, lambda: buffer.dispatch(x, topk_idx, topk_w, num_worst_tokens=ranks * T), args.iters),
    )
    # The same buffer copying the output with its SMs as each chunk arrives, instead of with the
    # copy engine.
    def checked_row(what: str, call: Callable[[], Any]) -> None:
        """Checks one dispatch variant's rows against the reference, then times it as the row
        "accord.ep <what>"."""
        checks[what] = torch.equal(call().x, ref_x)
        if not checks[what]:
            failures.append(f"rank {rank}: {what}")
        add(f"accord.ep {what}", timed(torch, dist, call, args.iters))

    # The output copied by the copy engine instead: the whole of it after the last chunk, or
    # (exact size) chunk by chunk as each arrives. The default copies it with the SMs as the
    # chunks arrive (Buffer._pipelined_output).
    pipelined = buffer._pipelined_output
    buffer._pipelined_output = False
    checked_row("dispatch, output copied by the copy engine after the last chunk", lambda: buffer.dispatch(x, topk_idx, topk_w))
    add(
        "accord.ep dispatch, num_worst_tokens, output copied by the copy engine after the last chunk",
        timed(torch, dist, lambda: buffer.dispatch(x, topk_idx, topk_w, num_worst_tokens=ranks * T), args.iters),
    )
    buffer._copy_by_chunk = True
    checked_row("dispatch, output copied by the copy engine chunk by chunk", lambda: buffer.dispatch(x, topk_idx, topk_w))
    buffer._copy_by_chunk = False
    buffer._pipelined_output = pipelined
    add("accord.ep combine", timed(torch, dist, lambda: buffer.combine(y, got.handle), args.iters))
    fp8 = fp8_pair(torch, x) if H % 128 == 0 else None
    if fp8 is not None:
        # DeepEP's fp8 dispatch: (e4m3 rows, float32 scale per 128 values), checked bit for bit
        # against the naive dispatcher moving the same bytes, then timed (GB/s over fp8 rows +
        # scales received, DeepEP's accounting).
        x8, s8 = fp8
        got8 = buffer.dispatch(fp8, topk_idx, topk_w)
        want8, want_s = naive.dispatch(x8.view(torch.uint8), topk_idx)[0], naive.dispatch(s8, topk_idx)[0]
        worst8 = buffer.dispatch(fp8, topk_idx, topk_w, num_worst_tokens=ranks * T)
        n8 = want8.shape[0]
        checks["fp8 dispatch rows and scales bit for bit"] = (
            got8.x_scales is not None and worst8.x_scales is not None
            and torch.equal(got8.x.view(torch.uint8), want8) and torch.equal(got8.x_scales, want_s)
            and torch.equal(got8.topk_idx, got.topk_idx) and torch.equal(got8.src_index, got.src_index)
            and torch.equal(worst8.x[:n8].view(torch.uint8), want8) and torch.equal(worst8.x_scales[:n8], want_s)
            and bool((worst8.x_scales[n8:] == 0).all())
        )
        if not checks["fp8 dispatch rows and scales bit for bit"]:
            failures.append(f"rank {rank}: fp8 dispatch")
        # Combine after an fp8 dispatch (DeepEP's flow): its handle's puts are at bf16 row size.
        # The rows are the bf16 dispatch's, in the same order (checked above).
        checks["combine after fp8 dispatch"] = torch.equal(buffer.combine(y, got8.handle), combined)
        if not checks["combine after fp8 dispatch"]:
            failures.append(f"rank {rank}: combine after fp8 dispatch")
        fp8_bytes = n8 * (H + 4 * (H // 128))
        add("accord.ep dispatch, fp8", timed(torch, dist, lambda: buffer.dispatch(fp8, topk_idx, topk_w), args.iters), fp8_bytes)
        add(
            "accord.ep dispatch, fp8, num_worst_tokens",
            timed(torch, dist, lambda: buffer.dispatch(fp8, topk_idx, topk_w, num_worst_tokens=ranks * T), args.iters),
            fp8_bytes,
        )
    # all_to_all_v with the split sizes on the GPU, against NCCL's all_to_all_single given the
    # same splits as host lists (which its callers must first copy to the host).
    order, send_splits, recv_splits = ctx
    grouped = x.index_select(0, order)
    splits_gpu = torch.tensor(send_splits, dtype=torch.int64, device=dev)
    a2av, a2av_splits = buffer.all_to_all_v(grouped, splits_gpu)
    checks["all_to_all_v rows bit for bit"] = torch.equal(a2av, ref_x) and a2av_splits.tolist() == recv_splits
    if not checks["all_to_all_v rows bit for bit"]:
        failures.append(f"rank {rank}: all_to_all_v rows")
    add("accord.ep all_to_all_v, splits on the GPU", timed(torch, dist, lambda: buffer.all_to_all_v(grouped, splits_gpu, out_rows=ranks * T), args.iters))
    a2a_out = torch.empty_like(ref_x)
    if not args.no_peers:
        add(
            "NCCL all_to_all_single, splits on the host",
            timed(torch, dist, lambda: dist.all_to_all_single(a2a_out, grouped, recv_splits, send_splits), args.iters),
        )
    if buffer.chunks > 0:
        # The same buffer shape putting each segment once after packing, in the same run.
        plain = accord.ep.Buffer(
            dist.group.WORLD, hidden=H, num_experts=E, num_topk=K, max_tokens_per_rank=T, sms=args.sms,
            timeout=args.timeout, wait=args.wait, lanes=args.lanes == "on", chunks=0,
        )
        again = plain.dispatch(x, topk_idx, topk_w)
        checks["chunks=0 dispatch rows"] = torch.equal(again.x, ref_x)
        if not checks["chunks=0 dispatch rows"]:
            failures.append(f"rank {rank}: chunks=0 dispatch rows")
        add(
            "accord.ep dispatch, num_worst_tokens, chunks=0",
            timed(torch, dist, lambda: plain.dispatch(x, topk_idx, topk_w, num_worst_tokens=ranks * T), args.iters),
        )
        plain.close()
    if not args.no_peers:
        add("naive dispatch (permute + NCCL all_to_all_single)", timed(torch, dist, lambda: naive.dispatch(x, topk_idx), args.iters))
        yr = expert(torch, ref_x, rank)
        add("naive combine (NCCL all_to_all_single + index_add)", timed(torch, dist, lambda: naive.combine(yr, T, ctx), args.iters))
        try:
            import deep_ep
        except ImportError as e:
            if rank == 0:
                print(f"# DeepEP not importable ({e}): its rows are left out", flush=True)
        else:
            deep_ep.Buffer.set_num_sms(args.sms)
            db = deep_ep.Buffer(dist.group.WORLD, int(2e9), 0)
            per_rank, _, per_expert, in_rank, _ = db.get_dispatch_layout(topk_idx, E)
            dcfg, ccfg = deep_ep.Buffer.get_dispatch_config(ranks), deep_ep.Buffer.get_combine_config(ranks)
            kw = dict(
                num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                topk_idx=topk_idx, topk_weights=topk_w, config=dcfg,
            )
            d_x, d_idx, _, _, d_handle, _ = db.dispatch(x, **kw)
            checks["DeepEP dispatch rows equal the reference"] = torch.equal(d_x, ref_x)
            d_comb, _, _ = db.combine(expert(torch, d_x, rank), d_handle, config=ccfg)
            add(f"DeepEP dispatch ({args.sms} SMs)", timed(torch, dist, lambda: db.dispatch(x, **kw), args.iters))
            add(
                f"DeepEP dispatch, num_worst_tokens ({args.sms} SMs)",
                timed(torch, dist, lambda: db.dispatch(x, num_worst_tokens=ranks * T, **kw), args.iters),
            )
            d_y = expert(torch, d_x, rank)
            add(f"DeepEP combine ({args.sms} SMs)", timed(torch, dist, lambda: db.combine(d_y, d_handle, config=ccfg), args.iters))
            if fp8 is not None:
                try:
                    (d_x8, d_s8), *_ = db.dispatch(fp8, **kw)
                except Exception as e:  # DeepEP's own refusal: its fp8 rows are left out, ours stay
                    if rank == 0:
                        print(f"# DeepEP fp8 dispatch refused ({type(e).__name__}: {e}): its fp8 rows are left out", flush=True)
                else:
                    checks["DeepEP fp8 dispatch equals the reference"] = (
                        torch.equal(d_x8.view(torch.uint8), want8) and torch.equal(d_s8, want_s)
                    )
                    add(f"DeepEP dispatch, fp8 ({args.sms} SMs)", timed(torch, dist, lambda: db.dispatch(fp8, **kw), args.iters), fp8_bytes)
                    add(
                        f"DeepEP dispatch, fp8, num_worst_tokens ({args.sms} SMs)",
                        timed(torch, dist, lambda: db.dispatch(fp8, num_worst_tokens=ranks * T, **kw), args.iters),
                        fp8_bytes,
                    )
            checks["DeepEP combine matches ours"] = torch.allclose(d_comb.float(), combined.float(), rtol=1e-2, atol=1e-2)

    stage(rank, "graph")
    if args.graph and not buffer.waits_on_host:
        # Capture dispatch + experts + combine once; replay with new routing each time.
        static_idx, static_w = topk_idx.clone(), topk_w.clone()

        def dispatch_and_combine() -> tuple[Any, Any]:
            d = buffer.dispatch(x, static_idx, static_w, num_worst_tokens=ranks * T)
            return d, buffer.combine(expert(torch, d.x, rank), d.handle)

        graph, (d, out) = captured(torch, dist, dispatch_and_combine)
        for replay, new_idx, _ in replays_with_new_routing(torch, graph, (static_idx, static_w), (T, E, K), 10_000, rank, dev):
            r_x, _, _, r_ctx = naive.dispatch(x, new_idx)
            want = naive.combine(expert(torch, r_x, rank), T, r_ctx)
            nn = int(d.num_recv.item())
            if not (nn == r_x.shape[0] and torch.equal(d.x[:nn], r_x) and torch.equal(out, want)):
                failures.append(f"rank {rank}: graph replay {replay} with new routing differs from the reference")
        add("accord.ep dispatch+combine, CUDA graph replay", timed(torch, dist, graph.replay, args.iters))

    if args.low_latency:
        stage(rank, "low-latency buffer")
        ll = accord.ep.Buffer(
            dist.group.WORLD, hidden=H, num_experts=E, num_topk=K, max_tokens_per_rank=T, sms=args.sms,
            timeout=args.timeout, wait=args.wait, lanes=args.lanes == "on", low_latency=True,
        )
        stage(rank, "low-latency round")
        ll_checks, ll_got, _ = low_latency_round(torch, dist, ll, x, topk_idx, topk_w, rank, ranks, E)
        stage(rank, f"low-latency round: {ll_checks}")
        for name, (v_x, v_idx, v_w) in routing_variants(torch, x, E, K, ranks, rank).items():
            if name != "rank 1 without tokens":  # its all_gather needs equal shapes on every rank
                v_checks, _, _ = low_latency_round(torch, dist, ll, v_x, v_idx, v_w, rank, ranks, E)
                ll_checks[f"low-latency routing '{name}'"] = all(v_checks.values())
        checks.update(ll_checks)
        failures.extend(f"rank {rank}: {name}" for name, ok in ll_checks.items() if not ok)
        ll_y = expert(torch, ll_got.x, rank)
        stage(rank, "low-latency timing")
        if args.profile:
            ll_calls = {
                "low-latency dispatch": lambda: ll.low_latency_dispatch(x, topk_idx),
                "low-latency combine": lambda: ll.low_latency_combine(ll_y, topk_idx, topk_w, ll_got.handle),
            }
            profile(torch, dist, rank, ll_calls, args.trace_dir, tag="ep_ll")
        add("accord.ep low-latency dispatch", timed(torch, dist, lambda: ll.low_latency_dispatch(x, topk_idx), args.iters))
        add(
            "accord.ep low-latency combine",
            timed(torch, dist, lambda: ll.low_latency_combine(ll_y, topk_idx, topk_w, ll_got.handle), args.iters),
        )
        if not ll.waits_on_host:
            static_idx, static_w = topk_idx.clone(), topk_w.clone()

            def ll_dispatch_and_combine() -> tuple[Any, Any]:
                # Identity experts: the stand-in's scale would touch every padded row of the
                # [E/R, R * M, hidden] buffer and time that instead of the communication.
                ll_d = ll.low_latency_dispatch(x, static_idx)
                return ll_d, ll.low_latency_combine(ll_d.x, static_idx, static_w, ll_d.handle)

            graph, (ll_d, ll_out) = captured(torch, dist, ll_dispatch_and_combine)
            replay_ok = True
            for _, _, new_w in replays_with_new_routing(torch, graph, (static_idx, static_w), (T, E, K), 20_000, rank, dev):
                want = (x.to(torch.float32).unsqueeze(1) * new_w.unsqueeze(2)).sum(1)
                replay_ok = replay_ok and torch.allclose(ll_out.float(), want, rtol=1e-2, atol=1e-2)
            checks["low-latency graph replays with new routing"] = replay_ok
            if not replay_ok:
                failures.append(f"rank {rank}: low-latency graph replay with new routing differs from the reference")
            add("accord.ep low-latency dispatch+combine (identity experts), CUDA graph replay", timed(torch, dist, graph.replay, args.iters))
            # Each direction alone, replayed (a dispatch frees its peers' buffers itself; the
            # combine reuses one dispatch's handle).
            graph_d, graph_c = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph_d):
                ll.low_latency_dispatch(x, static_idx)
            with torch.cuda.graph(graph_c):
                ll.low_latency_combine(ll_d.x, static_idx, static_w, ll_d.handle)
            torch.cuda.synchronize()
            dist.barrier()
            add("accord.ep low-latency dispatch, CUDA graph replay", timed(torch, dist, graph_d.replay, args.iters))
            add("accord.ep low-latency combine, CUDA graph replay", timed(torch, dist, graph_c.replay, args.iters))
        stage(rank, "low-latency done")
        ll.check()
        ll.close()
    buffer.check()
    stats = buffer._dc.stats()
    buffer.close()
    verdicts: list[Any] = [None] * ranks
    dist.all_gather_object(verdicts, (failures, rows, checks, diff, stats))
    if rank == 0:
        print(f"# accord.ep bench {args.label}: chunks {buffer.chunks} (lane stores aside from {args.lane_aside_bytes} B, 0: never), {ranks} ranks, {T} tokens/rank, hidden {H}, top-{K} of {E}, bf16; "
              f"waits on the {'host' if buffer.waits_on_host else 'GPU'}; buffer setup {setup_s:.2f} s; received {recv_bytes / 1e6:.1f} MB on rank 0", flush=True)
        for name, ok in checks.items():
            print(f"# check {name}: {'ok' if ok else 'FAILED'} (rank 0)", flush=True)
        print(f"# combine max |diff| vs reference (rank 0): {diff:g}; proxy stats rank 0: "
              f"{ {k: v for k, v in stats.items() if k in ('descriptors_executed', 'lane_batches')} }", flush=True)
        print("| what | rank 0 µs/call | rank 0 GB/s | " + " | ".join(f"rank {r} µs" for r in range(1, ranks)) + " |")
        print("|---|---|---|" + "---|" * (ranks - 1))
        for i, (name, us, gbs) in enumerate(rows):
            others = " | ".join(f"{v[1][i][1]:.1f}" for v in verdicts[1:])
            print(f"| {name} | {us:.1f} | {gbs:.1f} | {others} |", flush=True)
    all_failures = [f for v in verdicts for f in v[0]]
    dist.destroy_process_group()
    if all_failures:
        if rank == 0:
            print("ep_bench: FAILED: " + "; ".join(all_failures), file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
