"""accord.ep: expert-parallel dispatch and combine for mixture-of-experts models, on any route.

A ``Buffer`` sends each token to the ranks that hold its top-k experts (``dispatch``) and sums
the experts' outputs back per token (``combine``), with DeepEP's shape so that Megatron, SGLang
or vLLM code moves over with small changes::

    buffer = accord.ep.Buffer(group, hidden=7168, num_experts=256, num_topk=8, max_tokens_per_rank=4096)
    per_rank, per_expert, in_rank = buffer.get_dispatch_layout(topk_idx)      # on the GPU
    out = buffer.dispatch(x, topk_idx, topk_weights)                           # received tokens
    y = experts(out.x, out.topk_idx, out.topk_weights)                         # this rank's experts
    combined = buffer.combine(y, out.handle)                                   # [tokens, hidden]

How the bytes move (``accord/kernels/ep.cu`` for the kernels, ``accord/_ep_plan.py`` for the
plan's torch twin): the counts are exchanged by the device API (``accord.device``) and stay on the
GPU; a kernel packs each token once per destination rank into registered windows (the only SMs
spent: ``sms`` blocks) and, as each of ``chunks`` chunks is packed, asks the CPU proxy to move that
part of each peer's contiguous segment (``chunks=0``: one put a peer after packing), by copy
engine between GPUs of one host and by the engine's network route between hosts, each chunk with
a signal of its own. Combine sends back the same way, chunk by chunk, and with GPU waits its
reduce sums each token as soon as the chunks holding its answers arrived. Nothing in the data
path waits on the host, so a stream keeps its order; only sizing an exact-size output reads the
counts on the host (as DeepEP's normal mode does: the plan kernel stores them into pinned memory
the host polls), and ``num_worst_tokens`` avoids even that. ``Buffer(low_latency=True)`` adds
DeepEP's low-latency layout (``low_latency_dispatch`` / ``low_latency_combine``): per-expert
receive buffers filled by per-token direct stores over the peer mapping, one host only.

Waits: with ``wait="gpu"`` one GPU thread waits for each signal (a one-thread kernel, or the
first thread of the kernel that needs it, as ``ep_plan`` for the count exchange), so nothing in a call waits
on the host (``num_worst_tokens``) and a CUDA graph can capture dispatch and combine. That needs
``CUDA_MODULE_LOADING=EAGER`` in the environment before CUDA starts: under lazy loading, the
first use of a kernel (PyTorch's, the driver's own copy kernels) synchronises the GPU, so it waits
for the spinning wait kernel, which waits for a peer whose proxy waits for the same lock: both
ranks stall until the wait times out (seen on the 2xH200 host; examples/ep_bench.py). ``wait="host"``
synchronises the buffer's stream and waits on the host instead, safe under lazy loading; ``"auto"``
(the default) picks ``"gpu"`` when ``CUDA_MODULE_LOADING=EAGER`` is set and every peer is on this
host (the proxy's copy-engine lanes), else ``"host"`` (``Buffer.waits_on_host`` says which).

Outputs of ``dispatch`` are fresh tensors (``zero_copy=True`` returns views of the receive
window instead, valid until the next ``dispatch`` or ``all_to_all_v`` on this buffer); with GPU
waits the ``sms`` blocks copy each row into the output as soon as its chunk arrived, this rank's
own rows first (``ep_copy_out``), so only the last chunk's rows are copied after the last
arrival; ``Buffer._pipelined_output = False`` copies the whole output with the copy engine
after the last chunk instead (``Buffer._copy_by_chunk``: a copy-engine copy a chunk, each behind
its chunk's wait). Failures never hang: every wait is bounded by ``timeout`` and a failure names
the rank, raised as ``accord.ep.EpError`` at the next host synchronisation (or
``Buffer.check()``); a failed buffer refuses further calls.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import os
import threading
import time
from typing import Any, NamedTuple

import torch

import accord
import accord.device
from accord import _ep_plan as planning
from accord import nvrtc
from accord._torchrun import StoreAdapter

__all__ = [
    "Buffer", "Dispatched", "EpError", "Handle", "LowLatencyDispatched", "LowLatencyHandle", "get_dispatch_layout",
    "waits_on_host",
]

get_dispatch_layout = planning.dispatch_layout

# Windows, in registration order (the same ids on every rank).
W_RECV_X, W_SEND_X, W_RECV_META, W_SEND_META, W_COUNTS, W_COMB_SEND, W_COMB_RECV = range(7)
# Signals.
SIG_COUNTS, SIG_DATA, SIG_COMB_FREE, SIG_A2AV = range(4)
# GPU-resident epochs of the waits (ep.cu's ep_wait `slot`).
SLOT_COUNTS, SLOT_DATA, SLOT_COMB_FREE, SLOT_COMB, SLOT_A2AV = range(5)
# Low-latency mode (Buffer(low_latency=True)): its windows after the seven above, its signals
# (all raised by direct stores) and its wait epochs.
W_LL_RECV, W_LL_SRC, W_LL_COUNTS, W_LL_COMB = range(7, 11)
SIG_LL_DISPATCH, SIG_LL_COMBINE, SIG_LL_RECV_FREE, SIG_LL_COMB_FREE = range(4, 8)
# Combine's chunks signal one id each, SIG_COMB + c (COMBINE_CHUNKS_MAX ids), so the reduce can sum
# a token as soon as the chunks holding its answers arrived, in whatever order they arrive.
SIG_COMB, COMBINE_CHUNKS_MAX = 8, 8
# Dispatch's chunks the same way, SIG_DISPATCH + c, so the output is copied chunk by chunk as the
# chunks arrive (ep_copy_out); the metadata signals SIG_DATA.
SIG_DISPATCH, DISPATCH_CHUNKS_MAX = 16, 8
SLOT_LL_DISPATCH, SLOT_LL_COMBINE, SLOT_LL_RECV_FREE, SLOT_LL_COMB_FREE = range(5, 9)
SLOT_DISPATCH = 9
# The kernels of accord/kernels/ep.cu a buffer launches.
KERNELS = (
    "ep_layout_tokens", "ep_layout_scan", "ep_plan", "ep_pack_tokens", "ep_unpack_meta", "ep_combine_send",
    "ep_put_segments", "ep_signal_peers", "ep_wait", "ep_wait_epoch", "ep_reduce_bf16", "ep_reduce_f32", "ep_a2av_plan",
    "ep_copy_segment", "ep_copy_out", "ep_ll_probe", "ep_ll_dispatch", "ep_ll_unpack", "ep_ll_combine_send", "ep_ll_reduce_bf16",
    "ep_ll_signal",
)
# Tokens a block of ep.cu's ep_layout_tokens (its EP_LAYOUT_THREADS).
LAYOUT_THREADS = 256
# fp8 dispatch: one float32 scale per this many values of a row (DeepEP's per-block scales).
FP8_BLOCK = 128
# Stages named in a failure.
STAGES = {
    1: "count exchange",
    2: "dispatch data",
    3: "combine (peers' previous combine)",
    4: "combine data",
    5: "layout (an expert id out of range)",
    6: "all_to_all_v data",
    7: "low-latency dispatch",
    8: "low-latency combine",
    9: "low-latency dispatch data",
    10: "low-latency combine data",
    11: "low-latency (peers' previous call)",
}
STATUS_NAMES = {1: "timed out", 2: "proxy error", 3: "bad argument", 4: "not direct"}

_COUNTER = 0
_COUNTER_LOCK = threading.Lock()


class _ChunkPuts(ctypes.Structure):
    """ep.cu's ChunkPuts, passed by value to ep_pack_tokens (natural alignment on both sides)."""

    _fields_ = [
        ("table", ctypes.c_uint64),
        ("me", ctypes.c_uint32),
        ("chunks", ctypes.c_uint32),
        ("dst_window", ctypes.c_uint32),
        ("src_window", ctypes.c_uint32),
        ("sig", ctypes.c_uint32),
        ("per_chunk", ctypes.c_uint64),
        ("prefix", ctypes.c_uint64),
        ("segments", ctypes.c_uint64),
        ("done", ctypes.c_uint64),
        ("status", ctypes.c_uint64),
        ("meta_segments", ctypes.c_uint64),
        ("meta_dst_window", ctypes.c_uint32),
        ("meta_src_window", ctypes.c_uint32),
        ("meta_sig", ctypes.c_uint32),
    ]


class _CombinePuts(ctypes.Structure):
    """ep.cu's CombinePuts, passed by value to ep_combine_send (natural alignment on both sides)."""

    _fields_ = [
        ("table", ctypes.c_uint64),
        ("me", ctypes.c_uint32),
        ("chunks", ctypes.c_uint32),
        ("dst_window", ctypes.c_uint32),
        ("src_window", ctypes.c_uint32),
        ("sig", ctypes.c_uint32),
        ("segments", ctypes.c_uint64),
        ("done", ctypes.c_uint64),
        ("status", ctypes.c_uint64),
    ]


class _LowLatency(ctypes.Structure):
    """ep.cu's LowLatency, passed by value to the low-latency kernels (natural alignment on both sides)."""

    _fields_ = [
        ("table", ctypes.c_uint64),
        ("me", ctypes.c_uint32),
        ("ranks", ctypes.c_uint32),
        ("experts", ctypes.c_uint32),
        ("k", ctypes.c_uint32),
        ("max_tokens", ctypes.c_uint64),
        ("row_bytes", ctypes.c_uint64),
        ("recv_window", ctypes.c_uint32),
        ("src_window", ctypes.c_uint32),
        ("count_window", ctypes.c_uint32),
        ("comb_window", ctypes.c_uint32),
        ("sig", ctypes.c_uint32),
        ("blocks_done", ctypes.c_uint64),
        ("status", ctypes.c_uint64),
    ]


class _ChunkWait(ctypes.Structure):
    """ep.cu's ChunkWait, passed by value to the reduce kernels (natural alignment on both sides)."""

    _fields_ = [
        ("table", ctypes.c_uint64),
        ("walk", ctypes.c_uint64),
        ("epoch", ctypes.c_uint64),
        ("timeout_ns", ctypes.c_uint64),
        ("status", ctypes.c_uint64),
        ("sig_base", ctypes.c_uint32),
    ]


# ep.cu's structures passed by value, by their C names (nvrtc.parameter_formats).
KERNEL_STRUCTS: dict[str, type[ctypes.Structure]] = {
    "ChunkPuts": _ChunkPuts, "CombinePuts": _CombinePuts, "LowLatency": _LowLatency, "ChunkWait": _ChunkWait,
}


class EpError(accord.AccordError):
    """A dispatch or combine failed: a peer did not answer in time, or the proxy refused a put.
    The message names the stage and the rank; the buffer is unusable afterwards."""


class Handle(NamedTuple):
    """What ``combine`` needs from the ``dispatch`` it answers (GPU tensors of that dispatch's plan)."""

    rows: torch.Tensor  # [T * R] int64: where token t's answer from rank r lands (ep.cu's ep_plan), -1 if none
    combine_puts: torch.Tensor  # [R * 3] int64: (bytes, source offset, destination offset) back to each rank
    walk: torch.Tensor  # [R * 2] int64: in which of a rank's combine chunks each answer comes (ep.cu's ep_plan)
    recv_total: torch.Tensor  # [1] int64: rows received
    num_tokens: int
    num_recv: int | None  # rows received, when known on the host


class LowLatencyHandle(NamedTuple):
    """What ``low_latency_combine`` needs from the ``low_latency_dispatch`` it answers."""

    src_info: torch.Tensor  # [E/R, R * M] int32: each packed row's (token * k + slot) at its source
    layout: torch.Tensor  # [E/R, R] int64: per local expert and source rank, (offset << 32) | count
    recv_count: torch.Tensor  # [E/R] int32: rows each local expert received
    num_tokens: int


class LowLatencyDispatched(NamedTuple):
    """The result of ``low_latency_dispatch`` (DeepEP's low-latency layout)."""

    x: torch.Tensor  # [E/R, R * M, hidden]: each local expert's rows, source rank by source rank; the first recv_count[e] valid
    recv_count: torch.Tensor  # [E/R] int32 on the GPU
    handle: LowLatencyHandle


class Dispatched(NamedTuple):
    """The result of ``dispatch``: received rows in source-rank, then token order."""

    x: torch.Tensor  # [N, hidden] (torch.float8_e4m3fn for fp8 input)
    topk_idx: torch.Tensor  # [N, k] int64: local expert index, -1 for experts elsewhere
    topk_weights: torch.Tensor  # [N, k] float32: 0 where topk_idx is -1
    num_recv_tokens_per_expert: list[int] | torch.Tensor  # host list, or [E/R] int64 on the GPU (num_worst_tokens)
    handle: Handle
    src_index: torch.Tensor  # [N] int32: each row's token index at its source rank
    num_recv: torch.Tensor  # [1] int64 on the GPU: the valid rows (N, or fewer with num_worst_tokens)
    x_scales: torch.Tensor | None = None  # fp8 input: [N, hidden / 128] float32, 0 in padding rows


def waits_on_host(wait: str, module_loading: str, lane_batches: int, descriptors: int, ranks: int) -> bool:
    """Whether a buffer waits on the host: ``wait`` itself unless it is ``"auto"``, which waits on
    the GPU only under eager module loading (``module_loading``, the value of
    CUDA_MODULE_LOADING) and when the priming exchange (``descriptors`` executed, one a peer) went
    entirely through the proxy's copy-engine lanes."""
    if wait != "auto":
        return wait == "host"
    eager = module_loading.strip().upper() == "EAGER"
    all_lanes = lane_batches >= ranks - 1 and lane_batches == descriptors
    return not (eager and all_lanes)


def _group_communicator(group: Any, timeout: float) -> tuple[accord.Communicator, int]:
    """An accord.Communicator over the ranks of a torch.distributed group, met through the
    default store (namespaced per buffer), and the local GPU."""
    import torch.distributed as dist

    global _COUNTER
    store = dist.distributed_c10d._get_default_store()
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    with _COUNTER_LOCK:
        _COUNTER += 1
        serial = _COUNTER
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(size))
    prefix = f"accord/ep/{'-'.join(map(str, ranks))}/{serial}/"
    comm = accord.Communicator(rank, size, timeout=timeout, store=StoreAdapter(store), store_prefix=prefix)
    return comm, torch.cuda.current_device()


class Buffer:
    """The windows, proxies and kernels of one expert-parallel group (collective to create and
    to close; one per MoE layer shape, reused by every layer). ``lane_stores_aside_bytes`` is
    passed to ``accord.device.DeviceComm`` (0, off: docs/results/2026-11-26-ep.md, stop 37,
    measured it slowing dispatch)."""

    def __init__(
        self,
        group: Any = None,
        *,
        comm: accord.Communicator | None = None,
        hidden: int,
        num_experts: int,
        num_topk: int,
        max_tokens_per_rank: int,
        dtype: torch.dtype = torch.bfloat16,
        sms: int = 24,
        timeout: float = 60.0,
        gpu: int | None = None,
        wait: str = "auto",
        lanes: bool = True,
        chunks: int = 4,
        low_latency: bool = False,
        lane_stores_aside_bytes: int = 0,
    ) -> None:
        if dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"accord.ep.Buffer: dtype {dtype} is not supported: give torch.bfloat16 or torch.float32")
        for name, value in (("hidden", hidden), ("num_experts", num_experts), ("num_topk", num_topk)):
            if value <= 0:
                raise ValueError(f"accord.ep.Buffer: {name} {value} must be positive")
        if not 0 <= chunks <= DISPATCH_CHUNKS_MAX:
            raise ValueError(
                f"accord.ep.Buffer: chunks {chunks}: give 0 (one put a peer after packing) to {DISPATCH_CHUNKS_MAX}"
            )
        if max_tokens_per_rank <= 0 or sms <= 0 or not math.isfinite(timeout) or timeout <= 0:
            raise ValueError("accord.ep.Buffer: max_tokens_per_rank, sms and timeout must be positive")
        if low_latency and dtype != torch.bfloat16:
            raise ValueError("accord.ep.Buffer: low_latency mode moves bfloat16 rows; give dtype=torch.bfloat16")
        if wait not in ("auto", "gpu", "host"):
            raise ValueError(f"accord.ep.Buffer: wait {wait!r}: give 'auto', 'gpu' (a one-thread kernel waits) or 'host'")

        if not torch.cuda.is_available():
            raise EpError("accord.ep.Buffer needs a CUDA GPU: torch.cuda.is_available() is False")
        if comm is None:
            comm, local = _group_communicator(group, timeout)
            gpu = local if gpu is None else gpu
        gpu = torch.cuda.current_device() if gpu is None else gpu
        ranks = comm.world_size
        if num_experts % ranks != 0:
            raise ValueError(f"accord.ep.Buffer: num_experts {num_experts} is not a multiple of the {ranks} ranks")
        if ranks > 32 or num_experts > 4096:
            raise ValueError(
                f"accord.ep.Buffer: {ranks} ranks and {num_experts} experts: at most 32 ranks (a warp fans a token out)"
                " and 4096 experts are supported"
            )
        if hidden % (8 if dtype == torch.bfloat16 else 4) != 0:
            raise ValueError(f"accord.ep.Buffer: hidden {hidden} must be a multiple of 16 bytes")
        self.rank, self.num_ranks = comm.rank, ranks
        self.hidden, self.num_experts, self.num_topk = hidden, num_experts, num_topk
        self.experts_per_rank = num_experts // ranks
        self.max_tokens_per_rank = max_tokens_per_rank
        self.dtype, self.sms, self.timeout, self.chunks = dtype, sms, timeout, chunks
        self._comb_chunks = min(max(chunks, 1), COMBINE_CHUNKS_MAX)
        # Dispatch's output (GPU waits): True copies each row with the sms blocks as soon as its
        # chunk arrived (ep_copy_out: this rank's own rows first, while the copy engines still
        # move the other ranks' chunks, so only the last chunk's rows are copied after the last
        # arrival); False copies the whole output with the copy engine after the last chunk.
        # Measured on 2xH100 (4096 tokens, docs/results/2026-11-26-ep.md, stop 36), so it is the
        # default; examples/ep_bench.py times both.
        self._pipelined_output = True
        # The copy engine's copy of an exact-size output (GPU waits): True queues one copy per
        # sender and chunk behind that chunk's wait, so the copies overlap the puts still in
        # flight (_copy_out_by_chunk); False copies the whole output once every chunk arrived,
        # all of it after the last chunk. The chunked copy did not pay on 2xH100 (4096 tokens, two
        # alternated rounds in one call: 775 and 790 us a dispatch against 663 and 547 for the
        # whole copy, docs/results/2026-11-26-ep.md), so it stays off (it applies only with
        # _pipelined_output False).
        self._copy_by_chunk = False
        # A count row: tokens per rank, per expert, then the rows to each rank before each chunk
        # boundary ([chunks + 1][ranks], ep_layout_scan), which receivers need for ep_copy_out.
        self._count_width = ranks + num_experts + (max(chunks, 1) + 1) * ranks
        self.device = torch.device("cuda", gpu)
        self._rows_max = ranks * max_tokens_per_rank
        self._row_bytes = hidden * torch.tensor([], dtype=dtype).element_size()
        self._meta_bytes = planning.meta_row_bytes(num_topk)
        # fp8 dispatch (x given as (e4m3 rows, float32 scales per FP8_BLOCK values)) on a bf16
        # buffer: the rows move as `hidden` bytes and the scales in the metadata rows, so the
        # metadata windows are sized for the longer rows; combine stays bf16.
        self._fp8_scale_words = hidden // FP8_BLOCK if dtype == torch.bfloat16 and hidden % FP8_BLOCK == 0 else 0
        self._meta_bytes_fp8 = planning.meta_row_bytes(num_topk, self._fp8_scale_words)
        self._timeout_ns = int(timeout * 1e9)
        self._failed: str | None = None
        self._host_wait = True  # the priming exchange waits on the host; `wait` applies after it
        self._host_epochs = [0] * 16

        with torch.cuda.device(self.device):
            module = nvrtc.KernelModule("ep.cu", gpu, torch.cuda.get_device_capability(gpu))
            # Each kernel bound to its parameters as ep.cu declares them: launches pack plain
            # ints (nvrtc.Launcher), the by-value structures' fields flattened in order.
            self._k = {
                name: module.kernel(name).bind(nvrtc.parameter_formats(module.source, name, KERNEL_STRUCTS)) for name in KERNELS
            }
            rows = self._rows_max
            dev = self.device
            self._windows = [
                torch.zeros(rows, hidden, dtype=dtype, device=dev),  # W_RECV_X
                torch.zeros(rows, hidden, dtype=dtype, device=dev),  # W_SEND_X
                torch.zeros(rows, self._meta_bytes_fp8, dtype=torch.uint8, device=dev),  # W_RECV_META
                torch.zeros(rows, self._meta_bytes_fp8, dtype=torch.uint8, device=dev),  # W_SEND_META
                torch.zeros(ranks, self._count_width, dtype=torch.int64, device=dev),  # W_COUNTS
                torch.zeros(rows, hidden, dtype=dtype, device=dev),  # W_COMB_SEND
                torch.zeros(rows, hidden, dtype=dtype, device=dev),  # W_COMB_RECV
            ]
            self.low_latency = low_latency
            if low_latency:
                # Each local expert's receive buffer: max_tokens_per_rank rows from every rank;
                # combine's buffer: a row per (token, slot) of this rank's own tokens.
                cells = self.experts_per_rank * ranks * max_tokens_per_rank
                self._windows += [
                    torch.zeros(cells, hidden, dtype=dtype, device=dev),  # W_LL_RECV
                    torch.zeros(cells, dtype=torch.int32, device=dev),  # W_LL_SRC
                    torch.zeros(self.experts_per_rank * ranks, dtype=torch.int64, device=dev),  # W_LL_COUNTS
                    torch.zeros(max_tokens_per_rank * num_topk, hidden, dtype=dtype, device=dev),  # W_LL_COMB
                ]
                self._ll_counts = torch.zeros(num_experts, dtype=torch.int32, device=dev)
                self._ll_blocks = torch.zeros(2, dtype=torch.int32, device=dev)
                self._ll_blocks_ptr = self._ll_blocks.data_ptr()
            self._side: Any = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
            self._stream_handle = int(self._side.cuda_stream)
            self._entered, self._left = torch.cuda.Event(), torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._state = torch.zeros(16, dtype=torch.int64, device=dev)
            # Where the plan kernels publish what an exact-size output needs on the host (see
            # _published): [seq, status, values...], pinned and stored to by the GPU directly.
            # The values: the summary (rows received, tokens per local expert), then the receive
            # rows of every sender's dispatch chunks ([chunks + 1][ranks], ep_plan).
            self._host = torch.zeros(
                3 + self.experts_per_rank + (DISPATCH_CHUNKS_MAX + 1) * ranks, dtype=torch.int64, pin_memory=True
            )
            self._host_view = self._host.numpy()
            self._host_seq = 0
            self._status = torch.zeros(1, dtype=torch.int32, device=dev)
            # Addresses every call passes, read once (a data_ptr() is a few hundred ns of host time).
            self._status_ptr = self._status.data_ptr()
            self._state_ptr = self._state.data_ptr()
            # combine's rows copied a chunk (ep_combine_send resets each to 0 when its chunk is put).
            self._comb_done = torch.zeros(COMBINE_CHUNKS_MAX, dtype=torch.int32, device=dev)
            self._comb_done_ptr = self._comb_done.data_ptr()
            torch.cuda.synchronize(dev)
            self._host_device = nvrtc.mapped_device_pointer(self._host.data_ptr())
            self._dc = accord.device.DeviceComm(
                comm, gpu=gpu, user_signals=SIG_DISPATCH + DISPATCH_CHUNKS_MAX, stream_lane=lanes,
                lane_stores_aside_bytes=lane_stores_aside_bytes,
            )
            for want, tensor in enumerate(self._windows):
                got = self._dc.register_window(tensor)
                if got != want:
                    raise EpError(f"accord.ep.Buffer: window {want} was registered as {got}")
            self._table = int(self._dc.table_ptr)
            self._window_ptrs = [t.data_ptr() for t in self._windows]
            # fp8 rows lie packed at `hidden` bytes a row from the receive window's start: the
            # view, made once (a view costs host time on every call).
            recv_bytes = self._windows[W_RECV_X].view(torch.uint8).view(-1)[: self._rows_max * hidden]
            self._fp8_window = recv_bytes.view(torch.float8_e4m3fn).view(self._rows_max, hidden)
            x_bases = [self._window_ptrs[W_SEND_X]] * ranks
            x_bases[self.rank] = self._window_ptrs[W_RECV_X]
            meta_bases = [self._window_ptrs[W_SEND_META]] * ranks
            meta_bases[self.rank] = self._window_ptrs[W_RECV_META]

            def as_tensor(values: list[Any]) -> torch.Tensor:
                return torch.tensor(values, dtype=torch.int64, device=dev)

            self._x_bases = as_tensor(x_bases)
            self._meta_bases = as_tensor(meta_bases)
            # The count exchange's one segment a peer: this rank's row, to the same row there.
            width = self._count_width * 8
            self._exchange = as_tensor([[width, self.rank * width, self.rank * width]] * ranks)
            self._exchange_ptr = self._exchange.data_ptr()
            self._x_bases_ptr, self._meta_bases_ptr = self._x_bases.data_ptr(), self._meta_bases.data_ptr()
            self._counts_ptr = self._window_ptrs[W_COUNTS]
            self._prime_routes()
            if low_latency:
                self._probe_direct()
        self._host_wait = self._host_waits(wait)

    # ---- plumbing ------------------------------------------------------------------------

    def _prime_routes(self) -> None:
        """One count exchange at creation, waited for by the host: it starts every route's
        lazily created machinery (the network route's pinned staging and landing pools, whose
        allocation synchronises the GPU) while no wait kernel spins on this GPU. Started under a
        spinning wait, that synchronisation would wait for the kernel, and the kernel for the
        peer's count, on both ranks at once."""
        self._put_segments(self._exchange_ptr, W_COUNTS, W_COUNTS, SIG_COUNTS, 1)
        self._side.synchronize()
        try:
            self._dc.wait_signal(SIG_COUNTS, self.num_ranks - 1, self.timeout)
        except accord.AccordError as e:
            raise EpError(f"accord.ep.Buffer on rank {self.rank}: the first count exchange failed: {e}") from None
        self._state[SLOT_COUNTS] = 1
        self._host_epochs[SLOT_COUNTS] = 1
        torch.cuda.synchronize(self.device)
        self._dc.barrier()

    def _enter(self) -> None:
        """Orders this buffer's side stream after the caller's current stream. The kernels run
        there: a non-blocking stream, so a copy the engine or the driver puts on the legacy
        default stream (the network route's staging) is never queued behind a spinning wait.
        One event reused (a wait takes the event's state when it is queued, so re-recording it
        later changes no earlier wait), instead of a new event a call (``wait_stream``)."""
        self._entered.record(torch.cuda.current_stream(self.device))
        self._side.wait_event(self._entered)

    def _leave(self) -> None:
        """Orders the caller's current stream after everything launched on the side stream."""
        self._left.record(self._side)
        torch.cuda.current_stream(self.device).wait_event(self._left)

    def _launch(self, name: str, grid: int, block: int, *args: int) -> None:
        self._k[name](grid, block, self._stream_handle, *args)

    def _status_args(self, stage: int) -> tuple[int, int]:
        return stage, self._status_ptr

    def _put_segments(self, args: int, dst: int, src: int, sig: int, stage: int) -> None:
        """One put a peer, with signal `sig`: `args` the address of ``[ranks][3]`` int64
        (bytes, destination offset, source offset)."""
        self._launch(
            "ep_put_segments", 1, 64, self._table, self.rank, self.num_ranks, args,
            dst, src, sig, *self._status_args(stage),
        )

    def _wait(self, sig: int, per_peer: int, lag: int, slot: int, stage: int) -> None:
        """Waits, bounded, until every other rank raised `sig` `per_peer` more times this call
        (calls after the first `lag` only): a one-warp kernel, or the host (wait="host")."""
        if self._host_wait:
            self._wait_on_host(range(sig, sig + 1), per_peer, lag, slot, stage)
            return
        self._launch(
            "ep_wait", 1, 32, self._table, self.rank, self.num_ranks, sig, per_peer, lag,
            self._state_ptr, slot, self._timeout_ns, *self._status_args(stage),
        )

    def _wait_on_host(self, sigs: range, per_peer: int, lag: int, slot: int, stage: int) -> None:
        """The host waits (after the side stream's work so far) until every other rank raised
        each signal of `sigs` `per_peer` times a call (calls after the first `lag`), bounded by
        the buffer's timeout; a failure names the stage and, through the device API, the rank."""
        if torch.cuda.is_current_stream_capturing():
            raise EpError(
                "accord.ep: a CUDA graph capture needs GPU waits: start the process with CUDA_MODULE_LOADING=EAGER "
                "and create the Buffer with wait='gpu' (or 'auto')"
            )
        self._side.synchronize()
        self._host_epochs[slot] += 1
        epoch = self._host_epochs[slot]
        if epoch <= lag:
            return
        target = per_peer * (self.num_ranks - 1) * (epoch - lag)
        for sig in sigs:
            try:
                self._dc.wait_signal(sig, target, self.timeout)
            except accord.AccordError as e:
                where = f" (chunk {sig - sigs.start})" if len(sigs) > 1 else ""
                self._failed = f"accord.ep on rank {self.rank}: {STAGES.get(stage)}{where}: {e}; {self._diagnosis()}"
                raise EpError(self._failed) from None

    def _next_publication(self) -> tuple[int, int]:
        """The (device address, sequence number) arguments under which the next plan kernel
        publishes its summary to the host (see _published)."""
        self._host_seq += 1
        return self._host_device, self._host_seq

    def _published(self, count: int) -> list[int]:
        """The `count` values the last plan kernel published, and the status word checked, read
        from pinned memory the kernel stored into: no copy, event or blocking CUDA call. (A
        synchronous ``.cpu()`` here sat in the driver while the wait kernel spun, and on the
        2xH200 host the proxy's next copy then waited for it: both ranks stalled until the wait
        timed out; an asynchronous copy and a polled event needed several torch calls and a
        conversion kernel, with the GPU idle meanwhile in the profile.)
        Spins first, then sleeps briefly, bounded by the buffer's timeout."""
        view, seq = self._host_view, self._host_seq
        deadline = time.monotonic() + self.timeout + 5.0
        spins = 0
        while int(view[0]) != seq:
            spins += 1
            if spins > 20_000:
                if time.monotonic() > deadline:
                    raise EpError(
                        f"accord.ep on rank {self.rank}: the GPU did not finish the count exchange within {self.timeout + 5:g} s"
                        f" (published sequence {int(view[0])}, waiting for {seq})"
                    )
                time.sleep(20e-6)
        values = [int(v) for v in view[2 : 2 + count]]
        if int(view[1]) != 0:
            self.check()
        return values

    def _failure(self) -> str | None:
        """The recorded failure (reads the status word: a host synchronisation on it)."""
        if self._failed is None:
            code = int(self._status.item())
            errors = self._dc.errors()
            if code != 0:
                stage, rank, status = code >> 24, (code >> 8) & 0xFFFF, code & 0xFF
                what = STATUS_NAMES.get(status, f"status {status}")
                self._failed = (
                    f"accord.ep on rank {self.rank}: {STAGES.get(stage, f'stage {stage}')} with rank {rank} {what}"
                    f" (timeout {self.timeout:g} s)" + (f"; proxy errors: {errors[:3]}" if errors else "")
                    + f"; {self._diagnosis()}"
                )
            elif errors:
                self._failed = f"accord.ep on rank {self.rank}: the proxy refused or failed puts: {errors[:3]}"
        return self._failed

    def _diagnosis(self) -> str:
        """Where this rank stands, for a failure's message: the proxy's progress on ring 0, the
        signals and the GPU-side epochs."""
        consumed, completed, error = self._dc.ring_control(0)
        names = (
            ("counts", SIG_COUNTS), ("metadata", SIG_DATA), ("dispatch chunk 0", SIG_DISPATCH), ("combine chunk 0", SIG_COMB),
            ("combine_free", SIG_COMB_FREE),
        )
        signals = {name: self._dc.read_signal(sig) for name, sig in names}
        time.sleep(1.0)  # a late signal shows as a change here
        later = {name: self._dc.read_signal(sig) for name, sig in names}
        stats = self._dc.stats()
        keys = ("descriptors_executed", "lane_batches", "signal_writes_issued", "ring_full_events")
        return (
            f"ring 0: {consumed} descriptors taken, {completed} completed, error word {error}; signals {signals}, "
            f"1 s later {later}; "
            f"epochs {self._state[:4].tolist()}; proxy {({k: stats[k] for k in keys})}"
        )

    def _host_waits(self, wait: str) -> bool:
        """Whether waits run on the host. ``auto`` picks GPU waits only where they cannot stall:
        eager module loading (see the module's doc), and every peer reached by the proxy's
        stream lanes (one host, CUDA IPC). The network route's staging and landing make CUDA calls
        that synchronise the GPU: under a spinning wait they stalled both ranks until the wait
        timed out even with eager loading (2xH200 host, ACCORD_DEVICE_IPC=0), so it waits on the
        host. The priming exchange tells which route each peer took."""
        stats = self._dc.stats()
        return waits_on_host(
            wait, os.environ.get("CUDA_MODULE_LOADING", ""), stats["lane_batches"], stats["descriptors_executed"], self.num_ranks
        )

    @property
    def waits_on_host(self) -> bool:
        """Whether this buffer's waits run on the host (``wait="host"``, or what ``"auto"`` chose)."""
        return self._host_wait

    def check(self) -> None:
        """Raises EpError if an earlier dispatch or combine failed (synchronises with the GPU's
        status word)."""
        failure = self._failure()
        if failure is not None:
            raise EpError(failure)

    def _usable(self, op: str) -> None:
        if self._failed is not None:
            raise EpError(f"{op}: this buffer failed earlier ({self._failed}); create a new one")
        if self._dc.closed:
            raise EpError(f"{op}: this buffer is closed")

    # ---- the API ------------------------------------------------------------------------

    def get_dispatch_layout(self, topk_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens per rank ``[R]``, tokens per expert ``[E]``, token-in-rank mask ``[T, R]``), on the GPU."""
        return planning.dispatch_layout(topk_idx, self.num_experts, self.num_ranks)

    def _check_fp8(self, op: str, pair: tuple[Any, ...], zero_copy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """DeepEP's fp8 input, (e4m3 rows, float32 scales), checked and made contiguous."""
        if len(pair) != 2 or not all(isinstance(t, torch.Tensor) for t in pair):
            raise ValueError(f"{op}: an fp8 x is a pair (x_e4m3 [T, hidden], scales [T, hidden / {FP8_BLOCK}])")
        if self._fp8_scale_words == 0:
            raise ValueError(
                f"{op}: fp8 rows need a bfloat16 buffer whose hidden ({self.hidden}) is a multiple of {FP8_BLOCK}"
            )
        if zero_copy:
            raise ValueError(f"{op}: zero_copy returns the receive window's rows; give fp8 rows without it")
        rows, scales = pair
        words = self._fp8_scale_words
        if rows.device != self.device or scales.device != self.device:
            raise ValueError(f"{op}: the fp8 rows and scales must be on {self.device}")
        if rows.dtype != torch.float8_e4m3fn or rows.dim() != 2 or rows.shape[1] != self.hidden:
            raise ValueError(f"{op}: fp8 rows must be [T, {self.hidden}] torch.float8_e4m3fn, got {list(rows.shape)} {rows.dtype}")
        if scales.dtype != torch.float32 or tuple(scales.shape) != (rows.shape[0], words):
            raise ValueError(f"{op}: fp8 scales must be [{rows.shape[0]}, {words}] float32, got {list(scales.shape)} {scales.dtype}")
        if rows.shape[0] > self.max_tokens_per_rank:
            raise ValueError(f"{op}: {rows.shape[0]} rows exceed this buffer's {self.max_tokens_per_rank}")
        return rows.contiguous(), scales.contiguous()

    def _check_inputs(self, op: str, x: torch.Tensor, rows_max: int) -> None:
        if not isinstance(x, torch.Tensor) or x.device != self.device:
            raise ValueError(f"{op}: x must be a tensor on {self.device}, got {getattr(x, 'device', type(x))}")
        if x.dtype != self.dtype or x.dim() != 2 or x.shape[1] != self.hidden:
            raise ValueError(f"{op}: x must be [rows, {self.hidden}] {self.dtype}, got {list(x.shape)} {x.dtype}")
        if x.shape[0] > rows_max:
            raise ValueError(f"{op}: {x.shape[0]} rows exceed this buffer's {rows_max}")

    def dispatch(
        self,
        x: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        *,
        num_tokens_per_rank: torch.Tensor | None = None,
        num_tokens_per_expert: torch.Tensor | None = None,
        is_token_in_rank: torch.Tensor | None = None,
        num_worst_tokens: int = 0,
        zero_copy: bool = False,
    ) -> Dispatched:
        """Sends every token to each rank holding one of its experts. ``x`` ``[T, hidden]``,
        ``topk_idx`` ``[T, k]`` int64 global expert ids (``-1``: none), ``topk_weights`` ``[T, k]``.
        ``num_tokens_per_rank``, ``num_tokens_per_expert`` and ``is_token_in_rank`` are taken for
        DeepEP's signature and not read: one kernel derives the same from ``topk_idx`` as part of
        the plan, so computing them here as well would only repeat that work.
        ``num_worst_tokens > 0`` skips the host read of the counts: outputs then have that many
        rows, of which ``num_recv`` are valid. ``x`` may also be DeepEP's fp8 pair (a bfloat16
        buffer with ``hidden`` a multiple of 128): ``(x_e4m3 [T, hidden] torch.float8_e4m3fn,
        scales [T, hidden / 128] float32)``; the rows then move as fp8, their scales beside them,
        and the result's ``x`` holds the received e4m3 rows and ``x_scales`` their scales (not with
        ``zero_copy``)."""
        op = "accord.ep.Buffer.dispatch"
        self._usable(op)
        scales: torch.Tensor | None = None
        if isinstance(x, tuple):
            x, scales = self._check_fp8(op, x, zero_copy)
        else:
            self._check_inputs(op, x, self.max_tokens_per_rank)
        row_bytes, meta_bytes = (self.hidden, self._meta_bytes_fp8) if scales is not None else (self._row_bytes, self._meta_bytes)
        scale_words = self._fp8_scale_words if scales is not None else 0
        tokens = x.shape[0]
        if topk_idx.shape != (tokens, self.num_topk) or topk_weights.shape != (tokens, self.num_topk):
            raise ValueError(f"{op}: topk_idx and topk_weights must be [{tokens}, {self.num_topk}]")
        if topk_idx.device != self.device or topk_weights.device != self.device:
            raise ValueError(f"{op}: topk_idx and topk_weights must be on {self.device}")
        if not 0 <= num_worst_tokens <= self._rows_max:
            raise ValueError(f"{op}: num_worst_tokens {num_worst_tokens} must be in 0..={self._rows_max}")
        if num_worst_tokens == 0 and torch.cuda.is_current_stream_capturing():
            raise ValueError(f"{op}: an exact-size dispatch reads the counts on the host; a CUDA graph capture needs num_worst_tokens")
        del num_tokens_per_rank, num_tokens_per_expert, is_token_in_rank  # see the doc above
        x = x.contiguous()
        topk_idx = topk_idx.to(torch.int64).contiguous()
        topk_weights = topk_weights.to(torch.float32).contiguous()
        ranks, dev = self.num_ranks, self.device

        # 1. This rank's count row and each token's index per destination, then the exchange.
        # One workspace for the plan's arrays (one allocation a call); the handle keeps it.
        # Every rank uses the buffer's chunk count (its peers count its signals by it), also with
        # no token: then the packing kernel signals every chunk empty.
        chunks = self.chunks
        per_chunk = -(-tokens // chunks) if chunks and tokens else 1
        layout_blocks = max(1, -(-tokens // LAYOUT_THREADS))
        sizes = (
            tokens * ranks, tokens * ranks, 9 * ranks, 1 + self.experts_per_rank, (chunks + 1) * ranks,
            chunks + 1, (tokens + 1) // 2, layout_blocks * self.num_experts, 2 * ranks,
        )
        work = torch.empty(sum(sizes), dtype=torch.int64, device=dev)
        # The pieces' addresses by arithmetic, and tensor views only of what the handle and the
        # outputs keep (a view costs about a microsecond of host time; this is a hot path).
        starts = list(itertools.accumulate(sizes, initial=0))
        base = work.data_ptr()
        within, rows, puts, summary, chunk_prefix, chunk_done, masks, partial, walk = (base + 8 * o for o in starts[:-1])
        puts_x, puts_meta, puts_comb = puts, puts + 3 * ranks * 8, puts + 6 * ranks * 8
        own_counts = self._counts_ptr + self.rank * self._count_width * 8
        self._enter()
        if tokens > 0:
            self._launch(
                "ep_layout_tokens", layout_blocks, LAYOUT_THREADS, topk_idx.data_ptr(), tokens,
                self.num_topk, ranks, self.num_experts, masks, partial, self._status_ptr,
            )
        # The scan ends in the count exchange's puts, and the plan begins with its wait (GPU
        # waits), so the exchange costs no launch of its own.
        self._launch(
            "ep_layout_scan", 1, 1024, masks, tokens, ranks, self.num_experts, partial,
            layout_blocks if tokens > 0 else 0, within, own_counts, chunks, per_chunk, chunk_prefix, chunk_done,
            own_counts + (ranks + self.num_experts) * 8, self._table, self.rank, self._exchange_ptr, W_COUNTS, SIG_COUNTS,
            self._status_ptr,
        )
        if self._host_wait:
            self._wait_on_host(range(SIG_COUNTS, SIG_COUNTS + 1), 1, 0, SLOT_COUNTS, 1)
            plan_wait: tuple[int, ...] = (self._table, SIG_COUNTS, 0, SLOT_COUNTS, 0, 0)
        else:
            # The plan also bumps the epoch of this call's chunk signals, which ep_copy_out reads.
            plan_wait = (
                self._table, SIG_COUNTS, self._state_ptr, SLOT_COUNTS, self._timeout_ns, self._state_ptr + 8 * SLOT_DISPATCH
            )

        # 2. The plan, on the GPU (ep.cu's ep_plan; _ep_plan.plan is its reference).
        self._launch(
            "ep_plan", 1, 1024, self._counts_ptr, ranks, self.num_experts, self.rank, tokens, within, rows,
            row_bytes, meta_bytes, self._row_bytes, puts_x, puts_meta, puts_comb, summary,
            *(self._next_publication() if num_worst_tokens == 0 else (0, 0)),
            self._status_ptr, self._comb_chunks, walk, self._count_width, max(chunks, 1), *plan_wait,
        )

        # 3. Pack (one read of each token) and put the rows: chunk by chunk from the packing
        # kernel as each chunk is packed, or (chunks=0) one put a peer after it; then the metadata.
        # With chunks, the packing kernel also puts the metadata after its last token.
        if tokens > 0 or chunks > 0:
            chunk_args = (  # ep.cu's ChunkPuts
                self._table, self.rank, chunks, W_RECV_X, W_SEND_X, SIG_DISPATCH, per_chunk, chunk_prefix, puts_x,
                chunk_done, self._status_ptr, puts_meta if chunks > 0 else 0, W_RECV_META, W_SEND_META, SIG_DATA,
            )
            self._launch(
                "ep_pack_tokens", self.sms, 1024, x.data_ptr(), row_bytes, topk_idx.data_ptr(),
                topk_weights.data_ptr(), self.num_topk, tokens, ranks, rows, self._x_bases_ptr, self._meta_bases_ptr,
                meta_bytes, scales.data_ptr() if scales is not None else 0, scale_words, *chunk_args,
            )
        if chunks == 0:
            self._put_segments(puts_x, W_RECV_X, W_SEND_X, SIG_DISPATCH, 2)
            self._put_segments(puts_meta, W_RECV_META, W_SEND_META, SIG_DATA, 2)

        # 4. Output size: from the host (DeepEP's normal mode) or the caller's worst case. Read
        # only now, with the packing and the puts already queued behind the plan: the GPU never
        # idles while the host reads the counts and launches.
        per_expert: list[int] | torch.Tensor
        bounds: list[int] = []
        summary_view = work[starts[3] : starts[4]]
        if num_worst_tokens == 0:
            local = self.experts_per_rank
            # Published by the plan kernel: the summary, then where each sender's chunks land.
            host = self._published(1 + local + (max(chunks, 1) + 1) * ranks)
            num_recv: int | None = host[0]
            rows_out = host[0]
            per_expert = host[1 : 1 + local]
            bounds = host[1 + local :]
        else:
            num_recv = None
            rows_out = num_worst_tokens
            per_expert = summary_view[1:]

        # 5. The rows, as every peer's chunks arrive (a peer's chunk count is the buffer's, the
        # same on every rank, however many tokens it has), then the metadata. The outputs are
        # allocated on the caller's stream and filled on the side stream.
        window = self._windows[W_RECV_X]
        copy_out = not zero_copy and self._pipelined_output and not self._host_wait
        by_chunk = (
            not zero_copy and not copy_out and self._copy_by_chunk and not self._host_wait and num_worst_tokens == 0
            and scales is None
        )
        fresh = copy_out or by_chunk
        if scales is not None:
            window = self._fp8_window
        out_dtype = torch.float8_e4m3fn if scales is not None else self.dtype
        recv_x = torch.empty(rows_out, self.hidden, dtype=out_dtype, device=dev) if fresh else window[:rows_out]
        if self._host_wait:
            self._wait_on_host(range(SIG_DISPATCH, SIG_DISPATCH + max(chunks, 1)), 1, 0, SLOT_DISPATCH, 2)
        # (GPU waits: ep_plan bumped this call's epoch of the chunk signals.)
        if by_chunk:
            self._copy_out_by_chunk(window, recv_x, bounds, max(chunks, 1), rows_out)
        elif not self._host_wait:
            arrivals = (
                self._table, 0, self._state_ptr + 8 * SLOT_DISPATCH, self._timeout_ns,
                self._status_ptr, SIG_DISPATCH,
            )
            self._launch(
                "ep_copy_out", self.sms, 1024, self._window_ptrs[W_RECV_X], recv_x.data_ptr() if copy_out else 0,
                row_bytes, rows_out, self._counts_ptr, self._count_width, ranks,
                self.num_experts, self.rank, max(chunks, 1), *arrivals,
            )
        self._wait(SIG_DATA, 1, 0, SLOT_DATA, 2)
        k = self.num_topk
        recv_idx = torch.empty(rows_out, k, dtype=torch.int64, device=dev)
        recv_weights = torch.empty(rows_out, k, dtype=torch.float32, device=dev)
        src_index = torch.empty(rows_out, dtype=torch.int32, device=dev)
        recv_scales = torch.empty(rows_out, scale_words, dtype=torch.float32, device=dev) if scales is not None else None
        if rows_out > 0:
            items = rows_out * (k + 1)
            self._launch(
                "ep_unpack_meta", max(1, min(self.sms * 4, (items + 255) // 256)), 256, self._window_ptrs[W_RECV_META],
                meta_bytes, k, self.rank, self.experts_per_rank, summary,
                rows_out, recv_idx.data_ptr(), recv_weights.data_ptr(), src_index.data_ptr(),
                scale_words, recv_scales.data_ptr() if recv_scales is not None else 0,
            )
        self._leave()
        if not zero_copy and not fresh:
            recv_x = recv_x.clone()
        recv_total = summary_view[:1]
        rows_view = work[starts[1] : starts[2]]
        comb_puts_view = work[starts[2] + 6 * ranks : starts[3]]
        handle = Handle(rows_view, comb_puts_view, work[starts[8] : starts[9]], recv_total, tokens, num_recv)
        return Dispatched(recv_x, recv_idx, recv_weights, per_expert, handle, src_index, recv_total, recv_scales)

    def _copy_out_by_chunk(self, window: torch.Tensor, out: torch.Tensor, bounds: list[int], chunks: int, rows: int) -> None:
        """Queues the exact-size output's copy on the side stream as the rows arrive: this rank's
        own rows at once (packed locally, earlier on the stream), then per chunk a one-thread wait
        for that chunk's signal from every peer (ep_wait_epoch, against the epoch the ep_wait
        before it bumped) followed by one copy-engine copy per sender of that chunk's rows. The
        copies of early chunks run while later chunks are still being packed and put, so only the
        last chunk's copy follows the last arrival, instead of the whole output's. ``bounds`` are
        the plan kernel's published chunk rows (_ep_plan.copy_out_spans checks them)."""
        try:
            spans = planning.copy_out_spans(bounds, self.num_ranks, self.rank, chunks, rows)
        except ValueError as e:
            self._failed = f"accord.ep on rank {self.rank}: dispatch: the count exchange gave bad chunk bounds: {e}"
            raise EpError(self._failed) from None
        epoch = self._state_ptr + 8 * SLOT_DISPATCH
        with torch.cuda.stream(self._side):
            first, end = spans.own
            if end > first:
                out[first:end].copy_(window[first:end])  # cudaMemcpyAsync: the copy engine, no SM
            for c, parts in enumerate(spans.per_chunk):
                self._launch(
                    "ep_wait_epoch", 1, 32, self._table, self.rank, self.num_ranks, SIG_DISPATCH + c, epoch,
                    self._timeout_ns, *self._status_args(2),
                )
                for first, end in parts:
                    out[first:end].copy_(window[first:end])

    def combine(self, x: torch.Tensor, handle: Handle) -> torch.Tensor:
        """Sends each received row's expert output back to its source and returns, per original
        token, the sum over the ranks it went to (fp32 accumulation): ``[T, hidden]``. ``x`` has the
        rows of the dispatch that gave ``handle``, in the same order (at least its valid rows)."""
        op = "accord.ep.Buffer.combine"
        self._usable(op)
        self._check_inputs(op, x, self._rows_max)
        if not isinstance(handle, Handle):
            raise ValueError(f"{op}: handle must be the Handle of a dispatch on this buffer")
        if handle.num_recv is not None and x.shape[0] < handle.num_recv:
            raise ValueError(f"{op}: x has {x.shape[0]} rows, the dispatch received {handle.num_recv}")
        x = x.contiguous()
        rows = min(x.shape[0], self._rows_max)
        out = torch.empty(handle.num_tokens, self.hidden, dtype=self.dtype, device=self.device)
        self._enter()
        # Peers must have summed their previous combine before their receive window is reused.
        self._wait(SIG_COMB_FREE, 1, 1, SLOT_COMB_FREE, 3)
        # Other ranks' rows into the send window, each chunk put as soon as it is copied, with
        # its own signal.
        chunks = self._comb_chunks
        puts = (
            self._table, self.rank, chunks, W_COMB_RECV, W_COMB_SEND, SIG_COMB, handle.combine_puts.data_ptr(),
            self._comb_done_ptr, self._status_ptr,
        )
        self._launch(
            "ep_combine_send", self.sms, 1024, x.data_ptr(), self._row_bytes, handle.recv_total.data_ptr(),
            rows, self.num_ranks, self._window_ptrs[W_COMB_SEND], *puts,
        )
        if self._host_wait:
            # The host waits for every chunk; the reduce then sums without waiting.
            self._wait_on_host(range(SIG_COMB, SIG_COMB + chunks), 1, 0, SLOT_COMB, 4)
            answers = (self._table, 0, 0, 0, self._status_ptr, SIG_COMB)
        else:
            # Pipelined: this call's epoch (a wait for nothing bumps it), then the reduce sums
            # each token as soon as the chunks holding its answers arrived.
            self._launch(
                "ep_wait", 1, 32, self._table, self.rank, self.num_ranks, SIG_COMB, 0, 0,
                self._state_ptr, SLOT_COMB, self._timeout_ns, *self._status_args(4),
            )
            answers = (
                self._table, handle.walk.data_ptr(), self._state_ptr + 8 * SLOT_COMB, self._timeout_ns,
                self._status_ptr, SIG_COMB,
            )
        if handle.num_tokens > 0:
            kernel = "ep_reduce_bf16" if self.dtype == torch.bfloat16 else "ep_reduce_f32"
            self._launch(
                kernel, self.sms, 1024, out.data_ptr(), handle.num_tokens,
                self.hidden, self.num_ranks, handle.rows.data_ptr(),
                self._window_ptrs[W_COMB_RECV], self.rank, x.data_ptr(), *answers,
            )
        self._launch("ep_signal_peers", 1, 64, self._table, self.rank, self.num_ranks, SIG_COMB_FREE, *self._status_args(3))
        self._leave()
        return out

    def all_to_all_v(
        self, x: torch.Tensor, send_splits: torch.Tensor, *, out_rows: int = 0, zero_copy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """all_to_all_v with the split sizes on the GPU: ``x`` ``[N, hidden]`` holds this rank's rows
        grouped by destination, ``send_splits`` ``[R]`` (int, on this GPU) how many go to each rank.
        Returns ``(rows received in source-rank order, recv_splits [R] int64 on the GPU)``. Exact-size
        output reads the total on the host once; ``out_rows > 0`` returns that many rows instead
        (the first ``recv_splits.sum()`` valid) with no host synchronisation. Collective."""
        op = "accord.ep.Buffer.all_to_all_v"
        self._usable(op)
        self._check_inputs(op, x, self._rows_max)
        ranks, dev = self.num_ranks, self.device
        if send_splits.shape != (ranks,) or send_splits.device != dev or send_splits.is_floating_point():
            raise ValueError(f"{op}: send_splits must be an integer tensor of {ranks} on {dev}")
        if not 0 <= out_rows <= self._rows_max:
            raise ValueError(f"{op}: out_rows {out_rows} must be in 0..={self._rows_max}")
        x = x.contiguous()
        counts = self._windows[W_COUNTS]
        work = torch.empty(3 * ranks + 1 + ranks, dtype=torch.int64, device=dev)
        puts, summary = work[: 3 * ranks], work[3 * ranks :]
        self._enter()
        # The counts row: the split sizes (the experts' part stays zero), exchanged as dispatch's.
        with torch.cuda.stream(self._side):
            counts[self.rank].zero_()
            counts[self.rank, :ranks].copy_(send_splits)
        self._put_segments(self._exchange_ptr, W_COUNTS, W_COUNTS, SIG_COUNTS, 1)
        self._wait(SIG_COUNTS, 1, 0, SLOT_COUNTS, 1)
        # After the exchange: the peers have taken everything this rank put before from the
        # send window (they answered the exchange only after their last wait for it).
        with torch.cuda.stream(self._side):
            self._windows[W_SEND_X][: x.shape[0]].copy_(x)  # the copy engine: no SM
        self._launch(
            "ep_a2av_plan", 1, 32, counts.data_ptr(), ranks, counts.shape[1], self.rank,
            self._row_bytes, puts.data_ptr(), summary.data_ptr(),
            *(self._next_publication() if out_rows == 0 else (0, 0)), self._status_ptr,
        )
        self._launch(
            "ep_copy_segment", self.sms, 1024, x.data_ptr(), self._window_ptrs[W_RECV_X],
            puts[3 * self.rank :].data_ptr(),
        )
        self._put_segments(puts.data_ptr(), W_RECV_X, W_SEND_X, SIG_A2AV, 6)
        self._wait(SIG_A2AV, 1, 0, SLOT_A2AV, 6)
        # The total, read once the copies are queued (published by the plan kernel).
        rows_out = self._published(1)[0] if out_rows == 0 else out_rows
        self._leave()
        out = self._windows[W_RECV_X][:rows_out]
        return (out if zero_copy else out.clone()), summary[1:]

    # ---- low-latency mode ------------------------------------------------------------------

    def _probe_direct(self) -> None:
        """Refuses low-latency mode unless every peer's windows and signal slots are mapped here:
        its kernels store tokens straight into peers' GPU memory (one host, CUDA IPC)."""
        probe = torch.zeros(self.num_ranks, dtype=torch.int32, device=self.device)
        self._launch("ep_ll_probe", 1, 32, self._table, self.num_ranks, W_LL_RECV, probe.data_ptr())
        self._side.synchronize()
        unreachable = [r for r, ok in enumerate(probe.tolist()) if not ok]
        if unreachable:
            raise EpError(
                f"accord.ep.Buffer on rank {self.rank}: low_latency mode stores tokens directly into peers' GPU memory, and "
                f"rank(s) {unreachable} cannot be reached so (another host, or CUDA IPC off): use dispatch and combine there"
            )

    def _ll(self, sig: int, blocks: int) -> tuple[int, ...]:
        """ep.cu's LowLatency (``_LowLatency``'s fields, in order)."""
        return (
            self._table, self.rank, self.num_ranks, self.num_experts, self.num_topk, self.max_tokens_per_rank,
            self._row_bytes, W_LL_RECV, W_LL_SRC, W_LL_COUNTS, W_LL_COMB, sig,
            self._ll_blocks_ptr + 4 * blocks, self._status_ptr,
        )

    def _ll_signal(self, window: int, sig: int) -> None:
        self._launch(
            "ep_ll_signal", 1, 32, self._table, self.rank, self.num_ranks, window, sig,
            *self._status_args(11),
        )

    def low_latency_dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor) -> LowLatencyDispatched:
        """DeepEP's low-latency dispatch, for decode-sized batches (``Buffer(low_latency=True)``):
        each (token, expert) row goes by a direct store of the warp that reads it into that
        expert's fixed receive buffer at its rank, one kernel and one signal a rank; no host
        synchronisation, so CUDA graphs capture it and replay it with new routing. ``x``
        ``[T <= max_tokens_per_rank, hidden]`` bf16, ``topk_idx`` ``[T, k]`` global expert ids
        (``-1``: none; a token names an expert at most once). Returns each local expert's rows
        ``[E/R, R * max_tokens_per_rank, hidden]``, source rank by source rank (within one source
        in no particular order; ``handle.src_info`` names each row's token), and their counts."""
        op = "accord.ep.Buffer.low_latency_dispatch"
        self._usable(op)
        if not self.low_latency:
            raise EpError(f"{op}: create the Buffer with low_latency=True")
        self._check_inputs(op, x, self.max_tokens_per_rank)
        tokens = x.shape[0]
        if topk_idx.shape != (tokens, self.num_topk) or topk_idx.device != self.device:
            raise ValueError(f"{op}: topk_idx must be [{tokens}, {self.num_topk}] on {self.device}")
        x = x.contiguous()
        topk_idx = topk_idx.to(torch.int64).contiguous()
        local, ranks, m, dev = self.experts_per_rank, self.num_ranks, self.max_tokens_per_rank, self.device
        self._enter()
        # Peers must have unpacked the previous dispatch before their receive buffers are reused.
        self._wait(SIG_LL_RECV_FREE, 1, 1, SLOT_LL_RECV_FREE, 11)
        self._launch(
            "ep_ll_dispatch", self.sms, 1024, x.data_ptr(), topk_idx.data_ptr(), tokens,
            self._ll_counts.data_ptr(), *self._ll(SIG_LL_DISPATCH, 0),
        )
        self._wait(SIG_LL_DISPATCH, 1, 0, SLOT_LL_DISPATCH, 9)
        out = torch.empty(local, ranks * m, self.hidden, dtype=self.dtype, device=dev)
        src_info = torch.empty(local, ranks * m, dtype=torch.int32, device=dev)
        layout = torch.empty(local, ranks, dtype=torch.int64, device=dev)
        count = torch.empty(local, dtype=torch.int32, device=dev)
        self._launch(
            "ep_ll_unpack", self.sms, 1024, self._window_ptrs[W_LL_RECV],
            self._window_ptrs[W_LL_SRC], self._window_ptrs[W_LL_COUNTS], local, ranks,
            m, self._row_bytes, out.data_ptr(), src_info.data_ptr(), layout.data_ptr(),
            count.data_ptr(),
        )
        self._ll_signal(W_LL_RECV, SIG_LL_RECV_FREE)
        self._leave()
        return LowLatencyDispatched(out, count, LowLatencyHandle(src_info, layout, count, tokens))

    def low_latency_combine(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, handle: LowLatencyHandle
    ) -> torch.Tensor:
        """DeepEP's low-latency combine: each expert's output row (``x`` in the layout
        ``low_latency_dispatch`` returned) goes back to its token's rank by direct stores, and
        each token gets ``sum_j topk_weights[t, j] * out(expert topk_idx[t, j])`` (fp32 sums), ``[T,
        hidden]``. ``topk_idx`` and ``topk_weights`` are the dispatch's."""
        op = "accord.ep.Buffer.low_latency_combine"
        self._usable(op)
        if not self.low_latency:
            raise EpError(f"{op}: create the Buffer with low_latency=True")
        if not isinstance(handle, LowLatencyHandle):
            raise ValueError(f"{op}: handle must be the handle of a low_latency_dispatch on this buffer")
        local, ranks, m, tokens = self.experts_per_rank, self.num_ranks, self.max_tokens_per_rank, handle.num_tokens
        if x.shape != (local, ranks * m, self.hidden) or x.dtype != self.dtype or x.device != self.device:
            raise ValueError(f"{op}: x must be [{local}, {ranks * m}, {self.hidden}] {self.dtype} on {self.device}")
        for name, t in (("topk_idx", topk_idx), ("topk_weights", topk_weights)):
            if t.shape != (tokens, self.num_topk) or t.device != self.device:
                raise ValueError(f"{op}: {name} must be [{tokens}, {self.num_topk}] on {self.device}")
        x = x.contiguous()
        topk_idx = topk_idx.to(torch.int64).contiguous()
        topk_weights = topk_weights.to(torch.float32).contiguous()
        self._enter()
        # Peers must have summed the previous combine before their combine buffers are reused.
        self._wait(SIG_LL_COMB_FREE, 1, 1, SLOT_LL_COMB_FREE, 11)
        self._launch(
            "ep_ll_combine_send", self.sms, 1024, x.data_ptr(), handle.src_info.data_ptr(),
            handle.layout.data_ptr(), handle.recv_count.data_ptr(), local, *self._ll(SIG_LL_COMBINE, 1),
        )
        self._wait(SIG_LL_COMBINE, 1, 0, SLOT_LL_COMBINE, 10)
        out = torch.empty(tokens, self.hidden, dtype=self.dtype, device=self.device)
        if tokens > 0:
            self._launch(
                "ep_ll_reduce_bf16", self.sms, 1024, out.data_ptr(), self._window_ptrs[W_LL_COMB],
                topk_idx.data_ptr(), topk_weights.data_ptr(), tokens, self.num_topk, self.hidden,
            )
        self._ll_signal(W_LL_COMB, SIG_LL_COMB_FREE)
        self._leave()
        return out

    def close(self) -> None:
        """Collective: waits for this rank's GPU work, checks for failures, stops the proxies and
        releases the windows."""
        if self._dc.closed:
            return
        try:
            torch.cuda.synchronize(self.device)
        finally:
            failure = self._failure()
            self._dc.close()
        if failure is not None:
            raise EpError(failure)

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
