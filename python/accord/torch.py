"""``torch.distributed`` backend ``"accord"``: importing this module registers it.

    import accord.torch                       # registers the backend
    import torch.distributed as dist
    dist.init_process_group("accord")          # torchrun, env://, tcp://, file://, a store...

The backend is a Python ``ProcessGroup`` subclass (:class:`AccordProcessGroup`) over
``accord.Communicator``. It meets its peers through the c10d store that PyTorch hands the
backend's creator (engine addresses are published there), so it opens no port of its own and
works under any init method. Subgroups (``dist.new_group``) get their own communicator.

Ops run in call order, one at a time per group: an async op on the group's worker thread, a
synchronous one (``async_op=False``) with nothing queued before it on the calling thread (no
hand-off to the group's worker), with the GIL released while it moves data. Every op returns a :class:`Work`
whose ``wait`` blocks with the GIL released, ``get_future`` resolves with the op's output
tensors (so DDP communication hooks work), ``is_completed`` and ``exception`` poll. Point to
point ops are deferred until something waits on them (or the next collective): a batch of
``isend``/``irecv`` calls then runs as one schedule, so a ring of sends and receives cannot
deadlock.

CPU tensors go through Accord's host collectives, on the tensors' own memory (registered once
and cached) where they are contiguous: all_reduce, all_gather_into_tensor, reduce_scatter_tensor,
all_to_all_single and the all_to_all list form when its tensors are views of one storage
(``split``/``chunk``), the all_gather and reduce_scatter list forms when theirs are views of
one tensor in rank order; strided tensors, and list-form tensors that are separate
allocations, go through one contiguous copy.

CUDA tensors of a group whose ranks all run on one host, one GPU each, go through the copy-engine
GPU collectives (``accord.GpuCommunicator``), queued on the caller's current stream, with no SMs
for copies. The reductions run on the stream the op is queued on (``ACCORD_GPU_REDUCE_ON_CALLER``,
on by default here: a 2-GPU DDP step 13-16% faster on 2xH200,
docs/results/2026-11-26-torch-gpu-path.md; ``=0`` launches them from the progress thread), and
each group queues its ops on a stream of its own behind the caller's current stream, as NCCL
does, so compute queued after an async op (DDP's backward pass) runs beside it; ``Work.wait``
orders the caller's stream after the op (see :class:`_GpuPath`). Ops the GPU collectives do not
cover (gather, scatter, point to point, all_to_all with split sizes, reductions of float64 or
8-bit integers), and groups spanning hosts, are staged through host memory on the caller's
current stream (correct, not fast). ``ACCORD_TORCH_GPU=0`` stages every CUDA op so.

The collectives' bytes are moved by a host thread through the CUDA driver while the stream the op
is queued on waits. Two things can stall that thread, so the default (``ACCORD_TORCH_GPU=auto``)
takes the GPU collectives only where neither can happen, and says at the group's first CUDA op
why it stages otherwise (:func:`_gpu_verdict`):

- A thread that makes a blocking CUDA call (``tensor.cpu()`` or ``.item()`` right after the op)
  stalls the host thread until the op's deadline if both share PyTorch's CUDA context and its
  ``cudaMalloc`` memory (measured on 2×H100, docs/results/2026-11-26-torch-gpu-path.md). So
  importing this module before CUDA starts turns on PyTorch's ``expandable_segments:True``
  (``PYTORCH_CUDA_ALLOC_CONF``: memory of the virtual memory API, which no context owns, shared
  with peers as file descriptors) and ``ACCORD_GPU_PRIVATE_CONTEXT=1`` (the host thread copies
  from a context of its own); set either yourself to choose otherwise. These (and the loading
  below) are set in ``os.environ``, so processes started afterwards inherit them.
- Under lazy module loading, the first launch of a kernel while a collective holds a stream may
  synchronise the context and wait for that stream. So importing this module before CUDA starts
  sets ``CUDA_MODULE_LOADING=EAGER`` where the variable is unset. Every kernel of torch's CUDA
  libraries then loads when CUDA starts: 1,050 MiB more GPU memory and about 3.8 s more start-up
  a process on 2×H100 (docs/results/2026-11-28-torch-gpu-default.md).

Where CUDA had started before the import, ``auto`` stages, with a warning; ``ACCORD_TORCH_GPU=1``
takes the GPU collectives anyway where modules load eagerly (the old ``experimental`` means the
same), and warns of the stall. Peers map that memory by taking its file descriptors
(``pidfd_getfd``, which needs ptrace permission over the owner): before choosing, every rank
tries its peers' (a probe descriptor each, :func:`_descriptor_problem`), and where one may not
(Yama's ptrace scope 1, Ubuntu's default, between sibling ranks; a peer in another pid
namespace) the group stages, with a warning that names the rank and the cause.

The all_reduce that DDP calls at every bucket, and a synchronous all_reduce of a CPU tensor
used before, run in a compiled part (``accord._torch_native``, built once per torch version where
a C++ compiler is present; ``ACCORD_TORCH_NATIVE``): torch then reaches them without Python,
and a CUDA op's future is a C++ one. Every other case goes through the Python code here.
"""

from __future__ import annotations

import array
import collections
import datetime
import logging
import math
import threading
import warnings
import weakref
import os
import socket
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

import accord
from accord import _torch_native
from accord._torch_tensors import (
    _GPU_REDUCE_DTYPES,
    BackendError,
    _check_tensor,
    _copy_back,
    _dense,
    _disjoint,
    _dtype_name,
    _flat,
    _host,
    _nothing,
    _one,
    _packed,
    _reduce_op_name,
    _running_sums,
    _same_dtype,
    _span,
)
from accord._torch_work import _FUTURE_LOCK, _WAIT_SLACK_S, Work, _GpuPath, _MarkedWork, _StreamWork, _current_raw_stream
from accord._torchrun import StoreAdapter

BACKEND_NAME = "accord"

# Indices of AccordProcessGroup._words (read by the compiled backend, see _NativeProcessGroup).
_JOBS = 0
_P2P_PENDING = 1

_log = logging.getLogger("accord.torch")


_GPU_CHOICES = {"": "auto", "auto": "auto", "1": "1", "on": "1", "experimental": "1", "0": "0", "off": "0"}


def _gpu_choice() -> str:
    """``ACCORD_TORCH_GPU`` as ``"auto"`` (the default: the GPU collectives where they are safe,
    see the module doc), ``"1"`` (wherever they can run; ``experimental``, its old name, is taken
    too) or ``"0"`` (CUDA tensors staged through host memory)."""
    raw = os.environ.get("ACCORD_TORCH_GPU", "auto").strip().lower()
    choice = _GPU_CHOICES.get(raw)
    if choice is None:
        raise BackendError(f"accord backend: ACCORD_TORCH_GPU={raw!r} is not valid: use auto, 1 or 0")
    return choice


def _gpu_path_wanted() -> bool:
    """Whether ``ACCORD_TORCH_GPU`` lets CUDA tensors use the GPU collectives (an invalid value
    does not: the group's first CUDA op reports it)."""
    try:
        return _gpu_choice() != "0"
    except BackendError:
        return False


def _ask_for_eager_loading() -> None:
    """Sets ``CUDA_MODULE_LOADING=EAGER`` for this process where it still takes effect (see the
    module doc): CUDA not initialised, the variable unset, the GPU collectives wanted."""
    cuda_started: Callable[[], bool] = torch.cuda.is_initialized
    if _gpu_path_wanted() and "CUDA_MODULE_LOADING" not in os.environ and not cuda_started():
        os.environ["CUDA_MODULE_LOADING"] = "EAGER"


def _eager_loading() -> bool:
    return os.environ.get("CUDA_MODULE_LOADING", "").strip().upper() == "EAGER"


def _env_on(name: str) -> bool:
    """Whether switch ``name`` is on, in the words the Rust side accepts (``accord_knobs``'s
    ``parse_bool``: 1, true or on, any case)."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "on")


def _ask_for_vmm_memory() -> None:
    """With the GPU path asked for and CUDA not initialised: PyTorch's allocator on the virtual
    memory API (``expandable_segments:True``, memory no CUDA context owns) and the collectives'
    copies in a CUDA context of their own (``ACCORD_GPU_PRIVATE_CONTEXT=1``), so that a blocking
    CUDA call of the caller's thread no longer stalls them (see the module doc). A setting the
    user made is left alone."""
    cuda_started: Callable[[], bool] = torch.cuda.is_initialized
    if not _gpu_path_wanted() or cuda_started():
        return
    # The stall order cannot run in a private context (the collectives refuse it): a user who
    # chose it keeps the primary context.
    if os.environ.get("ACCORD_GPU_STREAM_ORDER", "").strip().lower() != "stall":
        os.environ.setdefault("ACCORD_GPU_PRIVATE_CONTEXT", "1")
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments" in conf or not _env_on("ACCORD_GPU_PRIVATE_CONTEXT"):
        return
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = f"{conf},expandable_segments:True" if conf else "expandable_segments:True"
    # The variable is read when the allocator starts; where torch was imported first, the setter
    # reaches the allocator too (both are harmless before the first CUDA allocation).
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is None:
        setter = getattr(torch.cuda.memory, "_set_allocator_settings", None)
    if setter is not None:
        try:
            setter("expandable_segments:True")
        except (RuntimeError, TypeError) as e:
            _log.warning("accord.torch: could not turn on expandable segments (%s)", e)


_ask_for_eager_loading()
_ask_for_vmm_memory()

# Largest receive buffer of one op on the GPU collectives; larger ops are staged. A receive buffer
# of VMM memory is registered as the mappings it spans, at most 32 (accord_coll's
# VMM_PIECES_INLINE): PyTorch's expandable segments map 20 MiB each, so 512 MiB spans at most 27.
_GPU_RECV_BYTES_MAX = 512 << 20


# The base as Any: torch types its pybind methods as overloads, which a Python override of
# one form cannot match for a type checker.
_ProcessGroupBase: Any = dist.ProcessGroup


def _host_identity() -> str:
    """What makes two ranks "on one host" for CUDA IPC: the hostname and the kernel's boot id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}"


def _vmm_allocator() -> bool:
    """Whether PyTorch's CUDA allocator maps memory no context owns (``expandable_segments``)."""
    return "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower()


def _gpu_identity(index: int) -> str:
    """The GPU behind CUDA ordinal ``index`` as every process names it alike (its UUID), so ranks
    that share one GPU are seen whatever their ``CUDA_VISIBLE_DEVICES``."""
    try:
        props = torch.cuda.get_device_properties(index)
    except (RuntimeError, AssertionError):
        return f"ordinal-{index}"
    uuid = getattr(props, "uuid", None)
    return str(uuid) if uuid is not None else f"ordinal-{index}"


def _gpu_entry(choice: str, index: int, probe_fd: int) -> str:
    """What a rank publishes before its group decides on the GPU collectives:
    ``letter|gpu|pid:fd|host``. The letter: ``0`` the rank stages (``ACCORD_TORCH_GPU=0``); ``L``
    it loads CUDA modules lazily; ``U`` its copies would share PyTorch's context or its
    ``cudaMalloc`` memory, which ``auto`` refuses; ``R`` the same risk taken with
    ``ACCORD_TORCH_GPU=1``; ``E`` nothing in the way (its memory is shared as file descriptors,
    which peers must be allowed to take: ``probe_fd`` is one of this process's descriptors for
    them to try, see :func:`_descriptor_problem`)."""
    if choice == "0":
        return f"0|-|-|{_host_identity()}"
    if not _eager_loading():
        letter = "L"
    elif not (_env_on("ACCORD_GPU_PRIVATE_CONTEXT") and _vmm_allocator()):
        letter = "U" if choice == "auto" else "R"
    else:
        letter = "E"
    return f"{letter}|{_gpu_identity(index)}|{os.getpid()}:{probe_fd}|{_host_identity()}"


def _descriptor_problem(entries: Sequence[str], rank: int) -> str | None:
    """Whether ``rank`` may take the file descriptors of every peer whose memory is shared so
    (letter ``E`` of :func:`_gpu_entry`): it takes each peer's probe descriptor and closes it
    again. None where it may, else why not, naming the peer. ``pidfd_getfd`` needs ptrace
    permission over the peer, which Yama's ptrace scope 1 (Ubuntu's default) refuses between
    sibling processes, as does a peer in another pid namespace."""
    for r, entry in enumerate(entries):
        letter, _, owner, _ = entry.split("|", 3)
        if r == rank or letter != "E":
            continue
        try:
            pid, fd = (int(x) for x in owner.split(":"))
            accord._accord._take_fd_of(pid, fd)
        except ValueError:
            return f"rank {r}: its entry names no process and descriptor ({owner!r})"
        except OSError as e:
            return f"rank {r}: {e}"
    return None


def _descriptor_verdict(problems: Sequence[str]) -> tuple[bool, str | None]:
    """The group's choice from every rank's :func:`_descriptor_problem` (``""`` for none), the
    same on every rank, as :func:`_gpu_verdict` gives it."""
    failed = [r for r, p in enumerate(problems) if p]
    if not failed:
        return True, None
    return False, (
        f"rank(s) {failed} may not take their peers' GPU memory descriptors (rank {failed[0]} taking "
        f"{problems[failed[0]]}); CUDA tensors are staged through host memory. Allow it with "
        "kernel.yama.ptrace_scope=0 or CAP_SYS_PTRACE."
    )


# Why a rank's letter (see _gpu_entry) keeps its group off the GPU path, with ``{}`` its ranks.
_REFUSED_BY_LETTER = {
    "L": (
        "rank(s) {} load CUDA modules lazily (CUDA_MODULE_LOADING unset or not EAGER when CUDA started before "
        "accord.torch was imported); holding a stream for the GPU collectives can hang there, so CUDA tensors "
        "are staged through host memory. Import accord.torch before CUDA starts, or set CUDA_MODULE_LOADING=EAGER."
    ),
    "U": (
        "rank(s) {} started CUDA before accord.torch was imported, so their collectives would copy in PyTorch's "
        "CUDA context from cudaMalloc memory, where a blocking CUDA call (tensor.cpu(), .item()) while one is in "
        "flight can stall it; CUDA tensors are staged through host memory. Import accord.torch before CUDA "
        "starts, or set ACCORD_GPU_PRIVATE_CONTEXT=1 and PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
        "(ACCORD_TORCH_GPU=1 takes the risk)."
    ),
}


def _gpu_verdict(entries: Sequence[str]) -> tuple[bool, str | None]:
    """The group's choice from every rank's :func:`_gpu_entry`, the same on every rank: whether
    its CUDA tensors use the GPU collectives, and what rank 0 warns (None: nothing). The GPU
    collectives need every rank on one host, each on a GPU of its own, loading modules eagerly,
    and (unless forced) copying in a context of their own from memory no context owns."""
    parsed = [entry.split("|", 3) for entry in entries]
    letters = [p[0] for p in parsed]
    if "0" in letters:
        return False, None
    if len({p[3] for p in parsed}) > 1:
        return False, "the group spans several hosts; CUDA tensors are staged through host memory"
    for letter, why in _REFUSED_BY_LETTER.items():
        ranks = [r for r, mine in enumerate(letters) if mine == letter]
        if ranks:
            return False, why.format(ranks)
    gpus = [p[1] for p in parsed]
    shared = sorted({g for g in gpus if gpus.count(g) > 1})
    if shared:
        ranks = [r for r, g in enumerate(gpus) if g in shared]
        return False, (
            f"ranks {ranks} share a GPU; the GPU collectives need one GPU per rank, so CUDA tensors are "
            "staged through host memory"
        )
    risky = [r for r, letter in enumerate(letters) if letter == "R"]
    if risky:
        return True, (
            f"ACCORD_TORCH_GPU=1: rank(s) {risky} copy in PyTorch's CUDA context or from cudaMalloc memory "
            "(CUDA started before accord.torch was imported, without ACCORD_GPU_PRIVATE_CONTEXT=1 and "
            "PyTorch's expandable_segments:True): a blocking CUDA call (tensor.cpu(), .item()) while a "
            "collective is in flight can stall it and give wrong results"
        )
    return True, None


def _cycle_position(rank: int, d: int, n: int) -> int:
    """Where ``rank`` sits in its cycle of the permutation r -> r + d (mod n), counted from the
    cycle's smallest rank."""
    g = math.gcd(n, d)
    start, k = rank % g, 0
    while (start + k * d) % n != rank:
        k += 1
    return k


class AccordProcessGroup(_ProcessGroupBase):  # type: ignore[misc]
    """A ``ProcessGroup`` whose ops run on an ``accord.Communicator``."""

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)
        self._rank_ = rank
        self._size = size
        self.timeout_s = max(timeout.total_seconds(), 1.0)
        self._store = StoreAdapter(store)
        self._comm = accord.Communicator(
            rank, size, timeout=self.timeout_s, store=self._store, store_prefix="accord/addresses/"
        )
        # Ops run in place on the calling thread, also on Python's main thread, as Gloo's do:
        # the interruptible wait hands every call to a helper thread, two wake-ups a call.
        self._comm.interruptible = False
        # The GPU collectives: None until the first CUDA op decides, then a _GpuPath, or False
        # where CUDA tensors are staged through host memory.
        self._gpu: _GpuPath | bool | None = None
        self._gpu_lock = threading.Lock()
        # Ops not started yet, in call order (None: the worker stops), and whether one is running
        # (on the worker or on a thread waiting for it, see Work.wait); both under _jobs_cv.
        self._jobs: collections.deque[tuple[Callable[[], None], Work] | None] = collections.deque()
        self._running = False
        # The hot paths (a synchronous op run here) hold the condition's lock itself: ``with`` on
        # a Condition runs two Python-level methods, on the bare lock none.
        self._jobs_lock = threading.Lock()
        self._jobs_cv = threading.Condition(self._jobs_lock)
        self._stand_ins: dict[tuple[torch.dtype, int], torch.Tensor] = {}
        self._pending_p2p: list[tuple[str, torch.Tensor, int, Work]] = []
        self._p2p_lock = threading.Lock()
        # The compiled backend (see _NativeProcessGroup), None where this group runs every op here,
        # and the words it reads: [_JOBS] ops queued or running here (written under _jobs_lock
        # by whichever thread queues, starts or ends an op), [_P2P_PENDING] point to point ops
        # deferred (under _p2p_lock).
        self._native: Any = None
        self._words = array.array("q", [0, 0])
        self._worker = threading.Thread(target=self._serve, name=f"accord-pg-{rank}", daemon=True)
        self._worker.start()

    # --- plumbing -------------------------------------------------------------------------

    def _serve(self) -> None:
        cv = self._jobs_cv
        while True:
            with cv:
                while self._running or not self._jobs:
                    cv.wait()
                job = self._jobs.popleft()
                if job is None:
                    return
                self._running = True
            self._run_job(*job)

    def _run_job(self, fn: Callable[[], None], work: Work) -> None:
        """Runs one op (``_running`` is set: nothing else runs meanwhile), then lets the next go.
        An op whose future was asked for settles it first, so its callbacks (DDP's hook, say,
        which may write the tensors) finish before the next op starts, as on one worker."""
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the waiter
            error: BaseException | None = e
        else:
            error = None
        with _FUTURE_LOCK:
            callbacks = work._future is not None
        if callbacks:
            work._finish(error)
        self._let_next_go()
        if not callbacks:
            work._finish(error)

    def _run_now(self, op: str, result: list[torch.Tensor], fn: Callable[[], None]) -> Work:
        """Runs a synchronous op on the calling thread (``_running`` is set: nothing else runs
        meanwhile), then lets the next go, and returns its handle, done already. Nobody can
        have asked for its future before it ran, so unlike ``_run_job`` there is no future to
        settle first, and the handle needs no lock to wait on."""
        error: BaseException | None = None
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the waiter
            error = e
        finally:
            self._let_next_go()
        return Work(self, op, result, done=True, error=error)

    def _let_next_go(self) -> None:
        """Ends the running op's turn: the worker may start the next queued one."""
        with self._jobs_lock:
            self._running = False
            self._words[_JOBS] -= 1
            if self._jobs:
                self._jobs_cv.notify()

    def _put(self, job: tuple[Callable[[], None], Work] | None) -> None:
        with self._jobs_cv:
            if job is not None:
                self._words[_JOBS] += 1  # counted until its _let_next_go: see _NativeProcessGroup
            self._jobs.append(job)
            self._jobs_cv.notify()

    def _run_here(self, work: Work) -> None:
        """Runs ``work``'s op on the calling thread when it is the next op and none is running
        (see :class:`Work`); otherwise leaves it to the worker. Not an op whose future was asked
        for before this: that future's callbacks (DDP's, say) then run on the worker as before,
        not on a waiting thread that may hold a lock they take. (A future asked for by another
        thread while this one already runs the op settles here; so does one asked for in the
        moment between the op's end and its completion being marked, and its callbacks may then
        overlap the next op. DDP is not exposed: its next ops are async and run on the worker.)"""
        if work._future is not None:
            return
        with self._jobs_cv:
            if self._running or not self._jobs:
                return
            job = self._jobs[0]
            if job is None or job[1] is not work:
                return
            self._jobs.popleft()
            self._running = True
        self._run_job(*job)

    def _submit(
        self, op: str, result: list[torch.Tensor], fn: Callable[[], None], cuda: bool = False, opts: Any = None
    ) -> Work:
        """Queues ``fn`` after everything before it; CUDA ops run here, on the caller's stream.

        A synchronous call (``async_op=False``: torch sets ``opts.asyncOp`` to False and waits
        right after) with nothing queued or running runs here and now, on the calling thread:
        no hand-off to the worker and back, which was most of a small op's fixed cost
        (``scripts/device/torch_overhead_probe.py``). Async ops (DDP's buckets among them: C++
        callers leave ``asyncOp`` at its default, True) run on the worker, overlapping the
        caller's work."""
        self._flush_p2p()
        if not cuda and opts is not None and getattr(opts, "asyncOp", True) is False:
            with self._jobs_lock:
                now = not self._running and not self._jobs
                if now:
                    self._running = True
                    self._words[_JOBS] += 1  # until _run_now's _let_next_go
            if now:
                return self._run_now(op, result, fn)
        work = Work(self, op, result)
        if cuda:
            self._sync_cuda()
            self._put((fn, work))
            work.wait()
            return work
        self._put((fn, work))
        return work

    def _sync_cuda(self) -> None:
        """Before an op staged through host memory reads or writes a CUDA tensor: waits for the
        caller's current stream and for the group's GPU ops queued before it, so ops of one group
        stay in call order whichever path each takes (as one NCCL stream keeps them)."""
        torch.cuda.current_stream().synchronize()
        gpu = self._gpu
        if isinstance(gpu, _GpuPath) and gpu.stream is not None:
            gpu.stream.synchronize()

    def _gpu_for(self, t: torch.Tensor, op: str, recv_bytes: int | None = None) -> _GpuPath | None:
        """The GPU collectives for CUDA tensor ``t``, set up at the group's first CUDA op (every
        rank's first CUDA op is the same call, so they meet there), or None where CUDA tensors
        are staged through host memory. ``recv_bytes`` (default ``t``'s) is what the op receives
        into, the same on every rank for these ops; above ``_GPU_RECV_BYTES_MAX`` the op is
        staged, on every rank alike."""
        if not t.is_cuda:
            return None
        if (recv_bytes if recv_bytes is not None else t.numel() * t.element_size()) > _GPU_RECV_BYTES_MAX:
            return None
        with self._gpu_lock:
            if self._gpu is None:
                self._gpu = self._start_gpu(t.device)
                if isinstance(self._gpu, _GpuPath) and self._gpu.stream is not None and self._native is not None:
                    side = self._gpu.stream
                    self._native.set_gpu(
                        self._gpu.comm, side.stream_id, side.device_index, side.device_type, self._gpu.side_raw,
                        _GPU_RECV_BYTES_MAX,
                    )
            gpu = self._gpu
        if not isinstance(gpu, _GpuPath):
            return None
        if t.device != gpu.device:
            raise BackendError(
                f"accord backend: {op}: the tensor is on {t.device} but this rank's group runs on {gpu.device}: "
                "keep one GPU per rank"
            )
        return gpu

    def _store_text(self, key: str) -> str:
        """The text under ``key`` in the group's store, waiting for it at most the group's timeout."""
        return bytes(self._store.get(key, self.timeout_s)).decode()

    def _start_gpu(self, device: torch.device) -> _GpuPath | bool:
        choice = _gpu_choice()
        index = device.index if device.index is not None else torch.cuda.current_device()
        # Every rank publishes what it can do (see _gpu_entry); all take the same decision from
        # what all published. Then, where memory is shared as file descriptors, every rank tries
        # to take its peers' and all decide again on what all found; a probe descriptor stays
        # open until every rank has said so.
        probe_read, probe_write = os.pipe()
        try:
            self._store.set(f"accord/gpu/host/{self._rank_}", _gpu_entry(choice, index, probe_read).encode())
            seen = [self._store_text(f"accord/gpu/host/{r}") for r in range(self._size)]
            use, warning = _gpu_verdict(seen)
            if use and any(entry.startswith("E|") for entry in seen):
                problem = _descriptor_problem(seen, self._rank_) or ""
                self._store.set(f"accord/gpu/fds/{self._rank_}", problem.encode())
                use, refused = _descriptor_verdict([self._store_text(f"accord/gpu/fds/{r}") for r in range(self._size)])
                warning = refused or warning  # a forced path's warning stands where nothing is refused
        finally:
            os.close(probe_read)
            os.close(probe_write)
        if warning is not None and self._rank_ == 0:
            warnings.warn(f"accord backend: {warning}", stacklevel=3)
        if not use:
            return False
        comm = accord.GpuCommunicator(
            self._rank_, self._size, index, self._store, "accord/gpu/join/", timeout=self.timeout_s
        )
        # A stream of the group's own only where the communicator reduces on the caller's stream
        # or queues direct all_reduces there (asked for and built: both fall back to the progress
        # thread where NVRTC is missing): then no kernel of the progress thread's private context
        # runs beside the compute queued after the op.
        own = bool(comm.reduces_on_caller()) or comm.direct_bytes_max() > 0
        return _GpuPath(comm, torch.device("cuda", index), own_stream=own)

    def _on_stream(
        self,
        op: str,
        result: list[torch.Tensor],
        gpu: _GpuPath,
        fn: Callable[..., int | None],
        touched: Sequence[torch.Tensor],
        plain: bool = False,
    ) -> Work:
        """Runs ``fn(stream)`` now, after the point to point ops deferred before it, queuing the
        collective on the caller's current stream, or, where the group has a stream of its own
        (see :class:`_GpuPath`), on that one behind everything queued so far on the current
        stream. There ``touched`` are the caller's tensors the op reads or writes: the caching
        allocator is told they are in use on the group's stream (``record_stream``), so their
        memory is not handed out again before the op is done, whether or not the caller waits;
        temporaries ``fn`` allocates are allocated on the group's stream.

        ``plain`` ops (``fn(stream, after)`` queues only the communicator's call, and returns its
        mark) on contiguous tensors take a shorter way: the communicator joins the group's stream
        behind ``after`` (the current stream) and marks the op's end itself, with no PyTorch
        stream switch, event or stream object (about 30 µs of this thread per op, which a DDP
        step pays at every bucket: see :class:`_MarkedWork`)."""
        self._flush_p2p()
        side = gpu.stream
        if side is not None and plain and all(t.is_contiguous() for t in touched):
            # The current stream's handle may be 0 (PyTorch's default stream): ``after`` is
            # always passed, so the communicator joins and marks (a mark is at least 1); an op
            # with nothing to move queues nothing, and its mark is the group stream's next.
            mark = int(fn(gpu.side_raw, _current_raw_stream(gpu.index)) or 0)
            if mark < 1:
                mark = int(gpu.comm.mark(gpu.side_raw))
            for t in touched:
                t.record_stream(side)
            return _MarkedWork(self, op, result, gpu, mark)
        with torch.cuda.device(gpu.device):
            current = torch.cuda.current_stream(gpu.device)
            if _log.isEnabledFor(logging.DEBUG):
                queued_on = (side or current).cuda_stream
                _log.debug("rank %d: %s on stream 0x%x, progress %s", self._rank_, op, queued_on, gpu.comm.progress())
            if side is None:
                fn(current.cuda_stream)
                return _StreamWork(self, op, result, gpu.device, current)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                fn(side.cuda_stream)
            for t in touched:
                t.record_stream(side)
            return _StreamWork(self, op, result, gpu.device, side)

    def _flush_p2p(self) -> None:
        if not self._pending_p2p:  # read without the lock: the common case, nothing deferred
            return
        with self._p2p_lock:
            batch, self._pending_p2p = self._pending_p2p, []
            self._words[_P2P_PENDING] = 0
        if not batch:
            return
        works = [w for (_, _, _, w) in batch]

        def run() -> None:
            try:
                self._run_p2p(batch)
            except BaseException as e:  # noqa: BLE001
                for w in works[1:]:
                    w._finish(e)
                raise
            for w in works[1:]:
                w._finish(None)

        self._put((run, works[0]))

    def _run_p2p(self, batch: list[tuple[str, torch.Tensor, int, Work]]) -> None:
        """Runs a batch of sends and receives without deadlock. In step d = 1..size-1 this rank
        sends to rank+d and receives from rank-d, so every send meets its receive in the same
        step on both sides. A send and a receive of one size run at once (``send_recv``);
        otherwise ranks at even positions of the step's cycle send first and the others
        receive first, so every cycle of blocking calls unwinds."""
        me, n = self._rank_, self._size
        for d in range(1, n):
            to, frm = (me + d) % n, (me - d) % n
            sends = [t for (kind, t, peer, _) in batch if kind == "send" and peer == to]
            recvs = [t for (kind, t, peer, _) in batch if kind == "recv" and peer == frm]
            send_first = _cycle_position(me, d, n) % 2 == 0
            for i in range(max(len(sends), len(recvs))):
                s = sends[i] if i < len(sends) else None
                r = recvs[i] if i < len(recvs) else None
                if s is not None and r is not None and s.numel() == r.numel() and s.dtype == r.dtype:
                    rh, back = _host(r)
                    self._comm.send_recv(_flat(s), to, rh, frm)
                    back()
                    continue
                for step in ("send", "recv") if send_first else ("recv", "send"):
                    if step == "send" and s is not None:
                        self._comm.send(_flat(s), to)
                    elif step == "recv" and r is not None:
                        rh, back = _host(r)
                        self._comm.recv(rh, frm)
                        back()

    # --- identity -------------------------------------------------------------------------

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    def size(self) -> int:
        return self._size

    def getSize(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank_

    def getRank(self) -> int:
        return self._rank_

    # torch asks a group for its per-device backend (batch_isend_irecv, DDP): this group is its
    # own backend for every device it serves. It does not coalesce: batches of point to point
    # ops are grouped by deferral instead (see the module doc).
    supports_coalescing = False

    def _get_backend(self, device: Any) -> AccordProcessGroup:
        return self

    # The group's name and description live here: the C++ base keeps them on per-device
    # backends, which a Python group replacing the whole ProcessGroup does not have.
    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return getattr(self, "_group_name", "")

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return getattr(self, "_group_desc", "")

    _set_group_name = setGroupName
    _set_group_desc = setGroupDesc

    @property
    def group_name(self) -> str:
        return self.getGroupName()

    @property
    def group_desc(self) -> str:
        return self.getGroupDesc()

    def shutdown(self) -> None:
        """``destroy_process_group`` calls this on every member, groups in the same order:
        after the ops already queued, a closing barrier (so no rank releases its engine while
        a peer still needs it), then the worker stops. A failure is warned about, not raised."""
        self._flush_p2p()
        if isinstance(self._gpu, _GpuPath):
            try:
                self._gpu.comm.close(self.timeout_s)
            except Exception as e:  # noqa: BLE001 - shutting down: report, do not raise
                warnings.warn(f"accord backend: closing the GPU collectives on rank {self._rank_} failed: {e}", stacklevel=2)
        closing = Work(self, "shutdown", [])
        self._put((self._comm.close, closing))
        self._put(None)
        try:
            closing.wait()
        except Exception as e:  # noqa: BLE001 - shutting down: report, do not raise
            warnings.warn(f"accord backend: closing the group on rank {self._rank_} failed: {e}", stacklevel=2)
        self._worker.join(timeout=_WAIT_SLACK_S)

    def abort(self) -> None:
        self._put(None)

    # --- collectives ----------------------------------------------------------------------

    def _allreduce_python(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        """all_reduce, here in Python: every case where the compiled backend is absent, and the
        cases it hands back (see _NativeProcessGroup)."""
        t = _one(tensors, "all_reduce")
        op = _reduce_op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "all_reduce")
        gpu = self._gpu_for(t, "all_reduce") if t.is_cuda and t.dtype in _GPU_REDUCE_DTYPES else None
        if gpu is not None:

            def on_stream(stream: int, after: int | None = None) -> int:
                if not t.numel():
                    return 0  # nothing to queue
                flat = _dense(t)
                ptr = flat.data_ptr()
                mark = gpu.comm.all_reduce(ptr, ptr, flat.numel(), _dtype_name(t), op, stream, after)
                _copy_back(flat, t)
                return int(mark)

            return self._on_stream("all_reduce", [t], gpu, on_stream, [t], plain=True)

        def run() -> None:
            if t.numel():
                h, back = _host(t)
                self._comm.all_reduce(h, op)
                back()

        return self._submit("all_reduce", [t], run, t.is_cuda, opts)

    allreduce = _allreduce_python

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        op = _reduce_op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "all_reduce_coalesced")
        ts = [_check_tensor(t, "all_reduce_coalesced") for t in tensors]
        _same_dtype("all_reduce_coalesced", *ts)
        total = sum(t.numel() * t.element_size() for t in ts)
        gpu = (
            self._gpu_for(ts[0], "all_reduce_coalesced", total) if ts and ts[0].dtype in _GPU_REDUCE_DTYPES else None
        )
        if gpu is not None:

            def coalesced_on_stream(stream: int) -> None:
                if sum(t.numel() for t in ts) == 0:
                    return
                flat = torch.cat([t.detach().reshape(-1) for t in ts])
                gpu.comm.all_reduce(flat.data_ptr(), flat.data_ptr(), flat.numel(), _dtype_name(flat), op, stream)
                at = 0
                for t in ts:
                    t.copy_(flat[at : at + t.numel()].view(t.shape))
                    at += t.numel()

            return self._on_stream("all_reduce_coalesced", ts, gpu, coalesced_on_stream, ts)

        def run() -> None:
            if not ts or sum(t.numel() for t in ts) == 0:
                return
            flat = torch.cat([_flat(t) for t in ts])
            self._comm.all_reduce(flat, op)
            at = 0
            for t in ts:
                t.copy_(flat[at : at + t.numel()].view(t.shape))
                at += t.numel()

        return self._submit("all_reduce_coalesced", ts, run, any(t.is_cuda for t in ts), opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Work:
        t = _one(tensors, "broadcast")
        root = opts.rootRank
        gpu = self._gpu_for(t, "broadcast")
        if gpu is not None:

            def broadcast_on_stream(stream: int, after: int | None = None) -> int:
                if not t.numel():
                    return 0  # nothing to queue
                flat = _dense(t)
                nbytes = flat.numel() * flat.element_size()
                mark = gpu.comm.broadcast(flat.data_ptr(), flat.data_ptr(), nbytes, root, stream, after)
                _copy_back(flat, t)
                return int(mark)

            return self._on_stream("broadcast", [t], gpu, broadcast_on_stream, [t], plain=True)

        def run() -> None:
            if t.numel():
                h, back = _host(t)
                self._comm.broadcast(h, root)
                if root != self._rank_:
                    back()

        return self._submit("broadcast", [t], run, t.is_cuda, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Work:
        t = _one(tensors, "reduce")
        op, root = _reduce_op_name(opts.reduceOp, "reduce"), opts.rootRank
        gpu = self._gpu_for(t, "reduce") if t.dtype in _GPU_REDUCE_DTYPES else None
        if gpu is not None:

            def reduce_on_stream(stream: int) -> None:
                if t.numel():
                    # An all_reduce into a copy: the other ranks' tensors stay as they were.
                    flat = t.detach().reshape(-1).clone()
                    gpu.comm.all_reduce(flat.data_ptr(), flat.data_ptr(), flat.numel(), _dtype_name(t), op, stream)
                    if root == self._rank_:
                        t.copy_(flat.view(t.shape))

            return self._on_stream("reduce", [t], gpu, reduce_on_stream, [t])

        def run() -> None:
            if t.numel():
                h, back = _host(t)
                self._comm.reduce(h, root, op)
                if root == self._rank_:
                    back()

        return self._submit("reduce", [t], run, t.is_cuda, opts)

    def _all_gather_flat(self, output: torch.Tensor, input: torch.Tensor, op: str) -> Callable[[], None]:
        _same_dtype(op, output, input)
        if output.numel() != input.numel() * self._size:
            raise BackendError(
                f"accord backend: {op}: the output has {output.numel()} elements, not world_size ({self._size}) "
                f"times the input's {input.numel()}"
            )

        def run() -> None:
            if input.numel():
                out, back = _host(output)
                self._comm.all_gather(_flat(input), out)
                back()

        return run

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None) -> Work:
        t = _one(input_tensors, "all_gather")
        if len(output_tensors) != 1 or len(output_tensors[0]) != self._size:
            raise BackendError(f"accord backend: all_gather: pass one list of world_size ({self._size}) output tensors")
        outs = [_check_tensor(o, "all_gather", "output tensor") for o in output_tensors[0]]
        if any(o.numel() != t.numel() for o in outs):
            raise BackendError("accord backend: all_gather: every output tensor must have the input's number of elements")
        _same_dtype("all_gather", t, *outs)
        gpu = self._gpu_for(t, "all_gather", t.numel() * t.element_size() * self._size)
        if gpu is not None:

            def gather_list_on_stream(stream: int) -> None:
                if not t.numel():
                    return
                src = _dense(t)
                flat = torch.empty(t.numel() * self._size, dtype=t.dtype, device=t.device)
                gpu.comm.all_gather(src.data_ptr(), flat.data_ptr(), src.numel() * src.element_size(), stream)
                for i, o in enumerate(outs):
                    o.copy_(flat[i * t.numel() : (i + 1) * t.numel()].view(o.shape))

            return self._on_stream("all_gather", outs, gpu, gather_list_on_stream, [t, *outs])

        def run() -> None:
            if not t.numel():
                return
            packed = _packed(outs)
            if packed is not None:
                # Views of one tensor in rank order (``list(out.chunk(n))``): gathered in place.
                self._comm.all_gather(_flat(t), packed)
                return
            flat = torch.empty(t.numel() * self._size, dtype=t.dtype)
            self._comm.all_gather(_flat(t), flat)
            for i, o in enumerate(outs):
                o.copy_(flat[i * t.numel() : (i + 1) * t.numel()].view(o.shape))

        return self._submit("all_gather", outs, run, t.is_cuda, opts)

    def _all_gather_single_python(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        _check_tensor(output, "all_gather_into_tensor", "output")
        _check_tensor(input, "all_gather_into_tensor", "input")
        run = self._all_gather_flat(output, input, "all_gather_into_tensor")
        gpu = self._gpu_for(output, "all_gather_into_tensor")
        if gpu is not None:

            def gather_on_stream(stream: int, after: int | None = None) -> int:
                if not input.numel():
                    return 0  # nothing to queue
                src, out = _dense(input), _dense(output)
                nbytes = src.numel() * src.element_size()
                mark = gpu.comm.all_gather(src.data_ptr(), out.data_ptr(), nbytes, stream, after)
                _copy_back(out, output)
                return int(mark)

            return self._on_stream(
                "all_gather_into_tensor", [output], gpu, gather_on_stream, [input, output], plain=True
            )
        return self._submit("all_gather_into_tensor", [output], run, output.is_cuda, opts)

    # torch before 2.15 calls the op _allgather_base; 2.15 all_gather_single.
    all_gather_single = _allgather_base = _all_gather_single_python

    def allgather_coalesced(
        self, output_lists: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None
    ) -> Work:
        works = [self.allgather([outs], [inp], opts) for outs, inp in zip(output_lists, input_tensors)]
        return works[-1] if works else self.barrier(None)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> Work:
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1] if works else self.barrier(None)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(
        self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: Any = None
    ) -> Work:
        out = _one(output_tensors, "reduce_scatter")
        op = _reduce_op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "reduce_scatter")
        if len(input_tensors) != 1 or len(input_tensors[0]) != self._size:
            raise BackendError(f"accord backend: reduce_scatter: pass one list of world_size ({self._size}) input tensors")
        ins = [_check_tensor(i, "reduce_scatter", "input tensor") for i in input_tensors[0]]
        if any(i.numel() != out.numel() for i in ins):
            raise BackendError("accord backend: reduce_scatter: every input tensor must have the output's number of elements")
        _same_dtype("reduce_scatter", out, *ins)
        gpu = self._gpu_for(out, "reduce_scatter") if out.dtype in _GPU_REDUCE_DTYPES else None
        if gpu is not None:

            def scatter_list_on_stream(stream: int) -> None:
                if out.numel():
                    src = torch.cat([i.detach().reshape(-1) for i in ins])
                    dst = _dense(out)
                    gpu.comm.reduce_scatter(src.data_ptr(), dst.data_ptr(), dst.numel(), _dtype_name(out), op, stream)
                    _copy_back(dst, out)

            return self._on_stream("reduce_scatter", [out], gpu, scatter_list_on_stream, [out, *ins])

        def run() -> None:
            if out.numel():
                h, back = _host(out)
                packed = _packed(ins)  # views of one tensor in rank order: no concatenation
                self._comm.reduce_scatter(packed if packed is not None else torch.cat([_flat(i) for i in ins]), h, op)
                back()

        return self._submit("reduce_scatter", [out], run, out.is_cuda, opts)

    def _reduce_scatter_single_python(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        _check_tensor(output, "reduce_scatter_tensor", "output")
        _check_tensor(input, "reduce_scatter_tensor", "input")
        op = _reduce_op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "reduce_scatter_tensor")
        _same_dtype("reduce_scatter_tensor", output, input)
        if input.numel() != output.numel() * self._size:
            raise BackendError(
                f"accord backend: reduce_scatter_tensor: the input has {input.numel()} elements, not world_size "
                f"({self._size}) times the output's {output.numel()}"
            )
        gpu = self._gpu_for(output, "reduce_scatter_tensor") if output.dtype in _GPU_REDUCE_DTYPES else None
        if gpu is not None:

            def scatter_on_stream(stream: int, after: int | None = None) -> int:
                if not output.numel():
                    return 0  # nothing to queue
                src, dst = _dense(input), _dense(output)
                name = _dtype_name(output)
                mark = gpu.comm.reduce_scatter(src.data_ptr(), dst.data_ptr(), dst.numel(), name, op, stream, after)
                _copy_back(dst, output)
                return int(mark)

            return self._on_stream(
                "reduce_scatter_tensor", [output], gpu, scatter_on_stream, [input, output], plain=True
            )

        def run() -> None:
            if output.numel():
                h, back = _host(output)
                self._comm.reduce_scatter(_flat(input), h, op)
                back()

        return self._submit("reduce_scatter_tensor", [output], run, output.is_cuda, opts)

    reduce_scatter_single = _reduce_scatter_base = _reduce_scatter_single_python

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1] if works else self.barrier(None)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _all_to_all_v(self, out: torch.Tensor, inp: torch.Tensor, send: list[int], recv: list[int]) -> None:
        """all_to_allv of flat element counts, on the tensors themselves where they are
        contiguous CPU tensors. An empty side is a one-element dummy (the communicator
        registers no empty buffer). A rank with nothing to send or receive still takes part:
        the collectives are sequenced, and its peers wait for its handshake."""
        send_buf = _flat(inp) if inp.numel() else self._empty_side(inp.dtype, 0)
        recv_buf, back = _host(out) if out.numel() else (self._empty_side(out.dtype, 1), _nothing)
        self._comm.all_to_allv(send_buf, recv_buf, send, recv)
        back()

    def _empty_side(self, dtype: torch.dtype, side: int) -> torch.Tensor:
        """A one-element stand-in for an empty send (side 0) or receive (side 1) buffer, kept
        so that its registration is reused."""
        key = (dtype, side)
        t = self._stand_ins.get(key)
        if t is None:
            t = self._stand_ins[key] = torch.zeros(1, dtype=dtype)
        return t

    def _all_to_all_single_python(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> Work:
        name = "all_to_all_single"
        _check_tensor(output, name, "output")
        _check_tensor(input, name, "input")
        _same_dtype(name, output, input)

        def counts(t: torch.Tensor, splits: list[int], what: str) -> list[int]:
            rows = t.shape[0] if t.dim() else 1
            row = t.numel() // rows if rows else 0
            if not splits:
                if rows % self._size:
                    raise BackendError(
                        f"accord backend: {name}: the {what}'s first dimension {rows} does not split evenly over "
                        f"{self._size} ranks: pass split sizes"
                    )
                splits = [rows // self._size] * self._size
            if len(splits) != self._size or sum(splits) != rows or min(splits) < 0:
                raise BackendError(
                    f"accord backend: {name}: {what} split sizes {list(splits)} must be {self._size} non-negative "
                    f"numbers adding up to the first dimension {rows}"
                )
            return [s * row for s in splits]

        send, recv = counts(input, list(input_split_sizes), "input"), counts(output, list(output_split_sizes), "output")
        # Split sizes are per rank: only their absence is known to be the same on every rank.
        even = not input_split_sizes and not output_split_sizes
        gpu = self._gpu_for(output, name) if even else None
        if gpu is not None:

            def all_to_all_on_stream(stream: int) -> None:
                if output.numel():
                    src, dst = _dense(input), _dense(output)
                    gpu.comm.all_to_all(src.data_ptr(), dst.data_ptr(), send[0] * src.element_size(), stream)
                    _copy_back(dst, output)

            return self._on_stream(name, [output], gpu, all_to_all_on_stream, [input, output])

        def run() -> None:
            self._all_to_all_v(output, input, send, recv)

        return self._submit(name, [output], run, output.is_cuda, opts)

    all_to_all_single = alltoall_base = _all_to_all_single_python

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor], opts: Any = None) -> Work:
        """The list form: where each side's tensors are contiguous CPU tensors of one storage
        (``split``/``chunk`` views of one tensor, in any order) the op runs on that storage in
        place, blocks at their own offsets (``all_to_allv`` displacements). A side whose
        tensors are separate allocations is gathered into one flat tensor first (input: one
        copy in; output: one copy out), as one registration covers one block of memory."""
        name = "all_to_all"
        if len(output_tensors) != self._size or len(input_tensors) != self._size:
            raise BackendError(f"accord backend: {name}: pass world_size ({self._size}) input and output tensors")
        outs = [_check_tensor(t, name, "output tensor") for t in output_tensors]
        ins = [_check_tensor(t, name, "input tensor") for t in input_tensors]
        _same_dtype(name, *outs, *ins)
        dtype = ins[0].dtype
        send, recv = [t.numel() for t in ins], [t.numel() for t in outs]

        def run() -> None:
            # A rank with nothing to move still takes part (see _all_to_all_v).
            spanned_in = _span(ins)
            if spanned_in is not None:
                flat_in, send_displs = spanned_in
            else:
                flat_in = torch.cat([_flat(t) for t in ins]) if sum(send) else self._empty_side(dtype, 0)
                send_displs = _running_sums(send)
            spanned_out = _span(outs)
            if spanned_out is not None and not _disjoint(spanned_out[1], recv):
                spanned_out = None  # an output named twice: one copy out, the last block wins
            copy_out = spanned_out is None and sum(recv) > 0
            if spanned_out is not None:
                flat_out, recv_displs = spanned_out
            elif copy_out:
                flat_out = torch.empty(sum(recv), dtype=dtype)
                recv_displs = _running_sums(recv)
            else:
                flat_out, recv_displs = self._empty_side(dtype, 1), [0] * len(recv)
            self._comm.all_to_allv(flat_in, flat_out, send, recv, send_displs, recv_displs)
            if copy_out:
                for t, at, count in zip(outs, recv_displs, recv):
                    t.copy_(flat_out[at : at + count].view(t.shape))

        return self._submit(name, outs, run, outs[0].is_cuda, opts)

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any) -> Work:
        name, root = "gather", opts.rootRank
        t = _one(input_tensors, name)
        if self._rank_ == root:
            if len(output_tensors) != 1 or len(output_tensors[0]) != self._size:
                raise BackendError(f"accord backend: {name}: the root passes world_size ({self._size}) output tensors")
            outs = [_check_tensor(o, name, "output tensor") for o in output_tensors[0]]
        else:
            outs = []

        def run() -> None:
            if self._rank_ != root:
                self._comm.send(_flat(t), root)
                return
            for r, o in enumerate(outs):
                if r == root:
                    o.copy_(t.view(o.shape))
                else:
                    h, back = _host(o)
                    self._comm.recv(h, r)
                    back()

        return self._submit(name, outs, run, t.is_cuda, opts)

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: Any) -> Work:
        name, root = "scatter", opts.rootRank
        out = _one(output_tensors, name)
        if self._rank_ == root:
            if len(input_tensors) != 1 or len(input_tensors[0]) != self._size:
                raise BackendError(f"accord backend: {name}: the root passes world_size ({self._size}) input tensors")
            ins = [_check_tensor(i, name, "input tensor") for i in input_tensors[0]]
        else:
            ins = []

        def run() -> None:
            if self._rank_ != root:
                h, back = _host(out)
                self._comm.recv(h, root)
                back()
                return
            for r, i in enumerate(ins):
                if r == root:
                    out.copy_(i.view(out.shape))
                else:
                    self._comm.send(_flat(i), r)

        return self._submit(name, [out], run, out.is_cuda, opts)

    def barrier(self, opts: Any = None) -> Work:
        return self._submit("barrier", [], self._comm.barrier, False, opts)

    # --- point to point (deferred, see the module doc) ---------------------------------------

    def _p2p(self, kind: str, tensors: list[torch.Tensor], peer: int) -> Work:
        t = _one(tensors, kind)
        if not 0 <= peer < self._size or peer == self._rank_:
            raise BackendError(f"accord backend: {kind}: peer {peer} is not another rank of this group (0..{self._size - 1})")
        work = Work(self, kind, [t])
        if t.is_cuda:
            self._sync_cuda()
        with self._p2p_lock:
            self._pending_p2p.append((kind, t, peer, work))
            self._words[_P2P_PENDING] = 1
        return work

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Work:
        return self._p2p("send", tensors, dst)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Work:
        return self._p2p("recv", tensors, src)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Work:
        raise BackendError("accord backend: recv from any source is not supported: name the source rank")

    recvAnysource = recv_anysource


class _NativeProcessGroup(AccordProcessGroup):
    """The group with the compiled backend (``accord._torch_native``): ``allreduce``,
    ``_allgather_base`` (all_gather_into_tensor), ``_reduce_scatter_base`` (reduce_scatter_tensor)
    and ``alltoall_base`` (all_to_all_single) are torch's own C++ ones, which dispatch to the
    backend registered for the tensor's device, the compiled one, without Python. That backend
    queues CUDA all_reduce, all_gather and reduce_scatter on the group's GPU collectives, and runs
    the four ops synchronously on registered CPU memory when no op of the group is queued or
    running (the group counts its ops in ``_words`` for it, and the communicator makes a Python op
    that finds the compiled backend's running wait its turn); it hands every other case back to
    this class's Python method for the op (``_allreduce_python``, ``_all_gather_single_python``,
    ``_reduce_scatter_single_python``, ``_all_to_all_single_python``), and holds only a weak
    reference to the group."""

    # The compiled ops are the base class's own methods here (set below, _COMPILED_OPS).

    def __init__(
        self, native: Any, store: Any, rank: int, size: int, timeout: datetime.timedelta
    ) -> None:
        super().__init__(store, rank, size, timeout)
        # A call of this group's communicator that finds one of the compiled backend's running
        # waits for it to end, instead of failing.
        self._comm._set_wait_turn(True)
        api = accord._accord._torch_native_api()
        backend = native.AccordNative(rank, size, weakref.ref(self), api, self._comm, self._words)
        custom = dist.ProcessGroup.BackendType.CUSTOM
        for device in ("cpu", "cuda"):
            self._register_backend(torch.device(device), custom, backend)
        # torch asks the group's default backend for its name and hooks (the flight recorder).
        self._set_default_backend(custom)
        self._native = backend

    def _native_ops(self) -> tuple[int, int]:
        """(CUDA, CPU) ops the compiled backend ran without Python: for tests and probes."""
        gpu, host = self._native.native_ops()
        return int(gpu), int(host)


# The ops the compiled backend runs, each under both of its names where this torch has them
# (2.15 renamed _allgather_base all_gather_single, and so on): on _NativeProcessGroup, the base
# class's own methods (their descriptors, which bind self), not overrides, so torch calls its
# C++ methods, which dispatch to the registered backend.
_COMPILED_OPS = (
    "allreduce",
    "_allgather_base",
    "all_gather_single",
    "_reduce_scatter_base",
    "reduce_scatter_single",
    "alltoall_base",
    "all_to_all_single",
)
for _name in _COMPILED_OPS:
    if _name in _ProcessGroupBase.__dict__:
        setattr(_NativeProcessGroup, _name, _ProcessGroupBase.__dict__[_name])
del _name


def _create(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> AccordProcessGroup:
    native = _torch_native.load()
    if native is not None:
        return _NativeProcessGroup(native, store, rank, size, timeout)
    return AccordProcessGroup(store, rank, size, timeout)


def register() -> None:
    """Registers the backend ``"accord"`` for cpu and cuda tensors (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])


register()

__all__ = ["AccordProcessGroup", "BACKEND_NAME", "BackendError", "Work", "register"]
