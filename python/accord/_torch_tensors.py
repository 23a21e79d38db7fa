"""The ``accord`` torch backend's checks and views of the tensors an op is given: which dtypes
and reduce ops it takes, the error it raises for anything else, and the flat host views (or
copies) the communicator runs on. Split from ``accord.torch`` (which re-exports
``BackendError``); nothing here holds state."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

_REDUCE_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.PRODUCT: "prod",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.AVG: "avg",
}

_DTYPES = {
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
}

# dtypes the GPU reduction kernels handle (all_reduce, reduce_scatter); copies take any dtype.
_GPU_REDUCE_DTYPES = {torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64}

class BackendError(RuntimeError):
    """An op the ``accord`` backend cannot run as asked (unsupported op, dtype, device, layout)."""

    __module__ = "accord.torch"  # where users import it from, as tracebacks name it


def _reduce_op_name(op: Any, what: str) -> str:
    for known, name in _REDUCE_OPS.items():
        if op == known:
            return name
    shown = str(getattr(op, "op", op)).rsplit(".", 1)[-1]
    raise BackendError(f"accord backend: {what} with reduce op {shown} is not supported: use SUM, PRODUCT, MIN, MAX or AVG")


def _check_tensor(t: Any, op: str, what: str = "tensor") -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise BackendError(f"accord backend: {op}: the {what} is a {type(t).__name__}, not a torch.Tensor")
    if not (t.is_cpu or t.is_cuda):  # not t.device.type: that makes a device object, 5x the cost
        raise BackendError(f"accord backend: {op}: the {what} is on {t.device}: pass cpu or cuda tensors")
    if t.dtype not in _DTYPES:
        raise BackendError(
            f"accord backend: {op}: dtype {t.dtype} is not supported: use float32/64, float16, bfloat16, "
            "int8, uint8, int32 or int64"
        )
    if t.is_sparse:
        raise BackendError(f"accord backend: {op}: sparse tensors are not supported")
    return t


def _one(tensors: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise BackendError(f"accord backend: {op}: pass exactly one tensor per rank (got {len(tensors)})")
    return _check_tensor(tensors[0], op)


def _same_dtype(op: str, *tensors: torch.Tensor) -> None:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise BackendError(f"accord backend: {op}: tensors of different dtypes {sorted(map(str, dtypes))}")


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A contiguous 1-D host view of ``t`` (a copy when ``t`` is strided or on a GPU)."""
    if not t.is_cuda and t.is_contiguous():
        return _flat_view(t)
    return t.detach().reshape(-1).contiguous().cpu()


def _flat_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself where it is already a flat tensor outside autograd (what the communicator
    reads is its memory), else a flat detached view of it. Why: ``detach().view(-1)`` makes two
    tensor objects, about 1 us of every op on a fast core and three times that on the 2xH200
    host's, where the Python layer's time per call is what issue 20's 10% at 1 MiB measures."""
    if t.dim() == 1 and not t.requires_grad:
        return t
    return t.detach().view(-1)


def _nothing() -> None:
    return None


def _host(t: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None]]:
    """A contiguous host tensor holding ``t``'s elements, and what copies it back into ``t``
    (nothing to copy, and no copy made, where ``t`` is a contiguous CPU tensor)."""
    if not t.is_cuda and t.is_contiguous():
        return _flat_view(t), _nothing
    flat = _flat(t)

    def back() -> None:
        t.copy_(flat.view(t.shape))

    return flat, back


def _dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself where it is contiguous, else a contiguous copy (queued on the current stream)."""
    return t if t.is_contiguous() else t.contiguous()


def _copy_back(dense: torch.Tensor, t: torch.Tensor) -> None:
    """Copies a contiguous stand-in back into ``t`` (nothing when it is ``t``)."""
    if dense.data_ptr() != t.data_ptr():
        t.copy_(dense.view(t.shape))


def _running_sums(counts: list[int]) -> list[int]:
    """Where each block starts when the blocks are packed in order."""
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out


def _span(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]] | None:
    """One 1-D view covering every non-empty tensor of ``tensors`` and each one's offset in it
    (elements; 0 for an empty one), where all are contiguous CPU tensors of one storage at
    element-aligned addresses; else None. Lets a list of views of one tensor (``split``,
    ``chunk``) be one registered buffer. None for a list of empty tensors too."""
    live = [t for t in tensors if t.numel()]
    if not live:
        return None
    first = live[0]
    if any(t.is_cuda or not t.is_contiguous() for t in live):
        return None
    storage = first.untyped_storage().data_ptr()
    if any(t.untyped_storage().data_ptr() != storage for t in live[1:]):
        return None
    es = first.element_size()
    base = min(t.data_ptr() for t in live)
    end = max(t.data_ptr() + t.numel() * es for t in live)
    if (base - storage) % es:
        return None
    offsets = [(t.data_ptr() - base) // es if t.numel() else 0 for t in tensors]
    span = torch.as_strided(first.detach(), ((end - base) // es,), (1,), (base - storage) // es)
    return span, offsets


def _disjoint(offsets: list[int], counts: list[int]) -> bool:
    """Whether the non-empty blocks at ``offsets`` of ``counts`` elements overlap nowhere."""
    blocks = sorted((o, o + c) for o, c in zip(offsets, counts) if c)
    return all(end <= start for (_, end), (start, _) in zip(blocks, blocks[1:]))


def _packed(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """One 1-D view over ``tensors`` where they are non-empty contiguous CPU views of one
    storage, each right after the one before (``list(x.chunk(n))`` of a contiguous ``x``); else
    None."""
    spanned = _span(tensors)
    if spanned is None or any(t.numel() == 0 for t in tensors):
        return None
    span, offsets = spanned
    if offsets != _running_sums([t.numel() for t in tensors]):
        return None
    return span


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).rsplit(".", 1)[-1]
