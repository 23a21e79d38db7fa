"""Rank bodies of tests/python/test_torch_inplace.py: the "accord" backend's all_to_all forms,
all_gather_into_tensor and reduce_scatter_tensor on CPU tensors, each against Gloo in the same
job, and whether the backend copied anything (torch copies made by its Python code, and the
binding's staging, seen as a call that did not touch the registration cache).

A module of its own so `accord.run`'s spawned children can import it."""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=30)


class Copies:
    """Counts torch copies (``Tensor.copy_``, ``Tensor.clone``, ``torch.cat``, and
    ``Tensor.contiguous`` where it copies) made while on, from any thread."""

    def __init__(self) -> None:
        self.count = 0
        self.on = False
        T = torch.Tensor
        self.saved = (T.copy_, T.clone, T.contiguous, torch.cat)
        copy_, clone, contiguous, cat = self.saved
        me = self

        def counted(fn: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*a: Any, **k: Any) -> Any:
                if me.on:
                    me.count += 1
                return fn(*a, **k)

            return wrapper

        def contiguous_w(t: Any, *a: Any, **k: Any) -> Any:
            out = contiguous(t, *a, **k)
            if me.on and out.data_ptr() != t.data_ptr():
                me.count += 1
            return out

        T.copy_, T.clone, T.contiguous = counted(copy_), counted(clone), contiguous_w  # type: ignore[method-assign]
        torch.cat = counted(cat)  # type: ignore[assignment]

    def close(self) -> None:
        T = torch.Tensor
        T.copy_, T.clone, T.contiguous, torch.cat = self.saved  # type: ignore[method-assign]


def _value(rank: int, shape: tuple[int, ...], salt: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * salt + rank)
    return torch.randint(-50, 50, shape, generator=g).to(torch.float32)


def in_place_ops() -> dict[str, Any]:
    """Every case against Gloo; returns {case: copies seen} for the accord runs plus counts."""
    import accord.torch  # noqa: F401 - registers "accord"

    dist.init_process_group("gloo", timeout=TIMEOUT)
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    acc = dist.new_group(backend="accord", timeout=TIMEOUT)
    comm = acc._get_backend(torch.device("cpu"))._comm
    copies = Copies()
    seen: dict[str, Any] = {}

    def case(name: str, fn: Callable[[Any], list[torch.Tensor]]) -> None:
        want = fn(gloo)
        _, _, h0, m0 = comm._registration_stats()
        copies.count, copies.on = 0, True
        try:
            got = fn(acc)
        finally:
            copies.on = False
        _, _, h1, m1 = comm._registration_stats()
        assert len(want) == len(got), name
        for w, g in zip(want, got):
            assert w.shape == g.shape and torch.equal(w, g), f"{name}: gloo {w.tolist()} accord {g.tolist()}"
        seen[name] = (copies.count, (h1 + m1) - (h0 + m0))


    # all_to_all_single, even blocks: contiguous, a non-contiguous input, a non-contiguous output.
    def a2a_even(g: Any) -> list[torch.Tensor]:
        out = torch.zeros(2 * n, 3)
        dist.all_to_all_single(out, _value(rank, (2 * n, 3), 1), group=g)
        return [out]

    def strided(g: Any, call: Callable[[torch.Tensor, torch.Tensor], None], out: torch.Tensor, src: torch.Tensor) -> None:
        """``call(out, src)`` on the accord group as given; Gloo refuses strided tensors, so its
        reference runs on contiguous copies, the result written into ``out``."""
        if dist.get_backend(g) != "gloo":
            call(out, src)
            return
        dense = torch.zeros(out.shape)
        call(dense, src.contiguous())
        out.copy_(dense)

    def a2a_even_strided(g: Any) -> list[torch.Tensor]:
        src = _value(rank, (3, 2 * n), 2).t()  # (2n, 3), not contiguous
        base = torch.full((2 * n, 6), -1.0)
        # A non-contiguous output: the odd columns must stay -1.
        strided(g, lambda o, i: dist.all_to_all_single(o, i, group=g), base[:, ::2], src)
        return [base]

    # Uneven splits, with empty blocks: rank r sends (r + j) % 3 rows to rank j.
    def a2a_uneven(g: Any) -> list[torch.Tensor]:
        send = [(rank + j) % 3 for j in range(n)]
        recv = [(i + rank) % 3 for i in range(n)]
        out = torch.zeros(sum(recv), 2)
        dist.all_to_all_single(out, _value(rank, (sum(send), 2), 3), recv, send, group=g)
        return [out]

    # The last rank sends and receives nothing at all: it must still take part.
    def a2a_one_rank_idle(g: Any) -> list[torch.Tensor]:
        idle = n - 1
        send = [0 if (rank == idle or j == idle) else 2 for j in range(n)]
        recv = [0 if (rank == idle or i == idle) else 2 for i in range(n)]
        out = torch.zeros(sum(recv), 2)
        dist.all_to_all_single(out, _value(rank, (sum(send), 2), 4), recv, send, group=g)
        return [out]

    for name, fn in [
        ("a2a_even", a2a_even),
        ("a2a_even_strided", a2a_even_strided),
        ("a2a_uneven", a2a_uneven),
        ("a2a_one_rank_idle", a2a_one_rank_idle),
    ]:
        case(name, fn)

    # The list form. Gloo's reference is all_to_all_single on the concatenated blocks (torch
    # 2.11's Gloo has no list form). Block j to rank j has (rank + j) % 3 + 1 elements (uneven).
    send_sizes = [(rank + j) % 3 + 1 for j in range(n)]
    recv_sizes = [(i + rank) % 3 + 1 for i in range(n)]

    def listed(make_ins: Callable[[], list[torch.Tensor]], make_outs: Callable[[], tuple[list[torch.Tensor], torch.Tensor | None]]):
        def fn(g: Any) -> list[torch.Tensor]:
            ins = make_ins()
            outs, whole = make_outs()
            if dist.get_backend(g) == "gloo":
                flat = torch.zeros(sum(recv_sizes))
                dist.all_to_all_single(flat, torch.cat([i.reshape(-1) for i in ins]), recv_sizes, send_sizes, group=g)
                for o, part in zip(outs, flat.split(recv_sizes)):
                    o.copy_(part.view(o.shape))
            else:
                dist.all_to_all(outs, ins, group=g)
            return [whole] if whole is not None else outs

        return fn

    def views_in() -> list[torch.Tensor]:
        return list(_value(rank, (sum(send_sizes),), 5).split(send_sizes))

    def views_out() -> tuple[list[torch.Tensor], torch.Tensor | None]:
        whole = torch.full((sum(recv_sizes),), -1.0)
        return list(whole.split(recv_sizes)), whole

    def reversed_views_out() -> tuple[list[torch.Tensor], torch.Tensor | None]:
        # Blocks of one tensor, stored last rank first, with a gap of 2 between them.
        whole = torch.full((sum(recv_sizes) + 2 * n,), -1.0)
        outs, at = [None] * n, 0
        for i in reversed(range(n)):
            outs[i] = whole[at : at + recv_sizes[i]]
            at += recv_sizes[i] + 2
        return outs, whole  # type: ignore[return-value]

    def loose_in() -> list[torch.Tensor]:
        return [_value(10 * rank + j, (s,), 5) for j, s in enumerate(send_sizes)]  # separate allocations

    def loose_out() -> tuple[list[torch.Tensor], torch.Tensor | None]:
        return [torch.full((s,), -1.0) for s in recv_sizes], None

    def strided_in() -> list[torch.Tensor]:
        return [torch.stack([t, -t], 1)[:, 0] for t in views_in()]  # every other element

    for name, fn in [
        ("a2a_list_views", listed(views_in, views_out)),
        ("a2a_list_reversed_gaps", listed(views_in, reversed_views_out)),
        ("a2a_list_loose", listed(loose_in, loose_out)),
        ("a2a_list_strided_in", listed(strided_in, views_out)),
    ]:
        case(name, fn)

    # A list with empty blocks: nothing goes to or comes from the next rank.
    def list_empty(g: Any) -> list[torch.Tensor]:
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        ss = [0 if j == nxt else 2 for j in range(n)]
        rs = [0 if i == prv else 2 for i in range(n)]
        src = _value(rank, (sum(ss),), 6)
        whole = torch.full((sum(rs),), -1.0)
        if dist.get_backend(g) == "gloo":
            dist.all_to_all_single(whole, src, rs, ss, group=g)
        else:
            dist.all_to_all(list(whole.split(rs)), list(src.split(ss)), group=g)
        return [whole]

    case("a2a_list_empty_blocks", list_empty)

    # all_gather_into_tensor and reduce_scatter_tensor, contiguous and strided.
    def gather(g: Any) -> list[torch.Tensor]:
        out = torch.zeros(n * 4, 3)
        dist.all_gather_into_tensor(out, _value(rank, (4, 3), 7), group=g)
        return [out]

    def gather_strided(g: Any) -> list[torch.Tensor]:
        base = torch.full((n * 4, 6), -1.0)
        src = _value(rank, (3, 4), 8).t()
        strided(g, lambda o, i: dist.all_gather_into_tensor(o, i, group=g), base[:, ::2], src)
        return [base]

    def scatter(g: Any) -> list[torch.Tensor]:
        out = torch.zeros(2, 3)
        dist.reduce_scatter_tensor(out, _value(rank, (2 * n, 3), 9), group=g)
        return [out]

    def scatter_strided(g: Any) -> list[torch.Tensor]:
        base = torch.full((2, 6), -1.0)
        src = _value(rank, (3, 2 * n), 10).t()
        strided(g, lambda o, i: dist.reduce_scatter_tensor(o, i, group=g), base[:, ::2], src)
        return [base]

    # The list forms of all_gather and reduce_scatter on views of one tensor in rank order.
    def gather_list_views(g: Any) -> list[torch.Tensor]:
        whole = torch.full((n * 4,), -1.0)
        dist.all_gather(list(whole.chunk(n)), _value(rank, (4,), 11), group=g)
        return [whole]

    def gather_list_loose(g: Any) -> list[torch.Tensor]:
        outs = [torch.full((4,), -1.0) for _ in range(n)]
        dist.all_gather(outs, _value(rank, (4,), 12), group=g)
        return outs

    def scatter_list_views(g: Any) -> list[torch.Tensor]:
        out = torch.zeros(3)
        dist.reduce_scatter(out, list(_value(rank, (3 * n,), 13).chunk(n)), group=g)
        return [out]

    for name, fn in [
        ("all_gather_list_views", gather_list_views),
        ("all_gather_list_loose", gather_list_loose),
        ("reduce_scatter_list_views", scatter_list_views),
        ("all_gather_into_tensor", gather),
        ("all_gather_into_tensor_strided", gather_strided),
        ("reduce_scatter_tensor", scatter),
        ("reduce_scatter_tensor_strided", scatter_strided),
    ]:
        case(name, fn)

    copies.close()
    dist.barrier()
    dist.destroy_process_group()
    return seen


def sync_and_async_in_order() -> list[float]:
    """Async ops in flight, then a synchronous one, then an async one waited on at once: every
    result right, in call order (each op adds to what the one before produced)."""
    import accord.torch  # noqa: F401

    dist.init_process_group("accord", timeout=TIMEOUT)
    rank, n = dist.get_rank(), dist.get_world_size()
    t = torch.full((50_000,), float(rank))
    works = [dist.all_reduce(t, async_op=True) for _ in range(3)]
    dist.all_reduce(t)  # synchronous, queued behind the three
    assert all(w.is_completed() for w in works)
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    # sum over ranks of rank = s; each all_reduce multiplies by n after the first.
    s = sum(range(n))
    want = s * n**4
    assert torch.all(t == want), (t[:3], want)
    fut = dist.all_reduce(t, async_op=True).get_future()
    assert torch.equal(fut.wait()[0], torch.full((50_000,), float(want * n)))
    dist.destroy_process_group()
    return [float(t[0])]


def gil_released_during_a_sync_op() -> bool:
    """Rank 1 joins a synchronous all_reduce only after a thread of rank 0 wrote a store key
    while rank 0's main thread was inside that op: if the op held the GIL, the thread could not
    run and both ranks would time out."""
    import accord.torch  # noqa: F401

    dist.init_process_group("accord", timeout=TIMEOUT)
    rank = dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    t = torch.ones(16)
    if rank == 0:
        entered = threading.Event()

        def announce() -> None:
            entered.wait(30)
            time.sleep(0.2)  # let the main thread get into the op
            store.set("gil-test/thread-ran", "1")

        thread = threading.Thread(target=announce)
        thread.start()
        entered.set()
        dist.all_reduce(t)
        thread.join(30)
    else:
        store.wait(["gil-test/thread-ran"], datetime.timedelta(seconds=30))
        dist.all_reduce(t)
    ok = bool(torch.all(t == 2))
    dist.destroy_process_group()
    return ok
