"""The ``accord`` torch backend's op handles (``Work``): the host ops' (done on the group's
worker or on the calling thread) and the GPU ops' (done in the order of a CUDA stream, by event
or by mark), and ``_GpuPath``, a group's GPU collectives that the GPU handles ask for failures.
Split from ``accord.torch``, which re-exports ``Work``."""

from __future__ import annotations

import datetime
import threading
import weakref
from typing import Any, Protocol

import torch


class _Group(Protocol):
    """What a handle asks of its group (``accord.torch.AccordProcessGroup``): named here, not
    imported, so that this module does not depend on the one that uses it."""

    timeout_s: float
    _gpu: _GpuPath | bool | None

    def _flush_p2p(self) -> None: ...

    def _run_here(self, work: Work) -> None: ...

    def rank(self) -> int: ...


# How much longer than the group's timeout a ``wait`` waits for the worker before it gives up
# (the collective itself is bounded by the group's timeout; this only bounds a stuck worker).
_WAIT_SLACK_S = 30.0

# The bases as Any: torch types their pybind methods as overloads, which a Python override of
# one form cannot match for a type checker.
_WorkBase: Any = torch._C._distributed_c10d.Work
_CudaEvent: Any = torch.cuda.Event
_CudaStream: Any = torch.cuda.Stream


class _Done:
    """A one-shot completion flag whose ``wait`` blocks with the GIL released: a bare lock, held
    until ``set``. Cheaper to make than ``threading.Event`` (a condition and a lock), which every
    op paid for."""

    __slots__ = ("_lock", "_set")

    def __init__(self, done: bool = False) -> None:
        # Done already (an op run on the calling thread): no lock, nobody can wait on it unset.
        self._lock: threading.Lock | None = None if done else threading.Lock()
        if self._lock is not None:
            self._lock.acquire()
        self._set = done

    def set(self) -> None:
        if not self._set:
            self._set = True
            if self._lock is not None:
                self._lock.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        if self._set or self._lock is None:
            return True
        if self._lock.acquire(timeout=timeout):
            self._lock.release()
        return self._set


# Settles a Work's future exactly once whether ``get_future`` or the op's end comes first.
_FUTURE_LOCK = threading.Lock()


class Work(_WorkBase):  # type: ignore[misc]
    """The handle of one op: ``wait``, ``is_completed``, ``exception``, ``get_future``.

    A ``wait`` on an op that has not started yet, with nothing before it in flight and no
    future asked for, runs the op on the waiting thread instead of sleeping until the group's
    worker has done it. Ops still run one at a time, in call order; an op nobody waits for yet
    runs on the worker as before."""

    __module__ = "accord.torch"  # where users import it from, as reprs name it

    def __init__(
        self,
        group: _Group,
        op: str,
        result: list[torch.Tensor],
        done: bool = False,
        error: BaseException | None = None,
    ) -> None:
        super().__init__()
        self._group = weakref.ref(group)
        self._op = op
        self._result = result
        self._done = _Done(done)
        self._error: BaseException | None = error
        # Made when asked for (most ops never are): see get_future.
        self._future: torch.futures.Future[list[torch.Tensor]] | None = None
        self._timeout_s = group.timeout_s + _WAIT_SLACK_S

    def _settle(self, future: torch.futures.Future[list[torch.Tensor]]) -> None:
        if self._error is None:
            future.set_result(self._result)
        else:
            future.set_exception(self._error)  # type: ignore[arg-type]

    def _finish(self, error: BaseException | None) -> None:
        self._error = error
        with _FUTURE_LOCK:
            self._done.set()
            future = self._future
        if future is not None:
            self._settle(future)

    def _kick(self) -> _Group | None:
        group = self._group()
        if group is not None:
            group._flush_p2p()
        return group

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if self._done._set and self._error is None:
            return True  # run on the calling thread already (a synchronous op), or finished
        group = self._kick()
        limit = self._timeout_s
        if timeout is not None and timeout.total_seconds() > 0:
            limit = min(limit, timeout.total_seconds())
        # Run here only when the caller's limit is the op's own: a shorter one must hold.
        if not self._done.is_set() and group is not None and limit >= self._timeout_s:
            group._run_here(self)
        if not self._done.wait(limit):
            raise TimeoutError(
                f"accord backend: {self._op} did not complete within {limit:.1f} s on rank "
                f"{self._rank()}: a peer is slow or gone"
            )
        if self._error is not None:
            raise self._error
        return True

    def _rank(self) -> int | str:
        group = self._group()
        return group.rank() if group is not None else "?"

    def is_completed(self) -> bool:
        self._kick()
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        self._kick()
        with _FUTURE_LOCK:
            future = self._future
            if future is not None:
                return future
            future = self._future = torch.futures.Future()
            settled = self._done.is_set()
        if settled:
            self._settle(future)
        return future

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._result


class _StreamWork(Work):
    """The handle of an op queued on a CUDA stream (the GPU collectives): complete as far as the
    host is concerned once queued. ``wait`` makes the caller's current stream wait for it (as
    NCCL's work does) and raises a failure the GPU collectives reported; ``get_future`` is a
    CUDA-aware future whose value is ready in the order of the stream the op was queued on.

    The future is made when asked for: completing a CUDA-aware future finds its tensors by
    pickling the value, and making and completing one at every op was about half of a small
    op's host time on 2xH200 (scripts/device/torch_gpu_probe.py latency, with PROFILE=1)."""

    def __init__(
        self, group: _Group, op: str, result: list[torch.Tensor], device: torch.device, stream: Any
    ) -> None:
        super().__init__(group, op, result)
        self._device = device
        self._stream = stream
        self._event: Any = _CudaEvent()
        self._event.record(stream)
        self._done.set()

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        future = self._future
        if future is not None:
            return future
        # Made and completed outside the module's lock (completing pickles the value), so other
        # groups' ops do not wait for it; the first one stored wins.
        made: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future(devices=[self._device])
        with torch.cuda.stream(self._stream):  # completion is recorded on the op's own stream
            made.set_result(self._result)
        with _FUTURE_LOCK:
            if self._future is None:
                self._future = made
            return self._future

    def _gpu_error(self) -> BaseException | None:
        group = self._group()
        gpu = group._gpu if group is not None else None
        if not isinstance(gpu, _GpuPath):
            return None
        try:
            gpu.comm.check()
        except Exception as e:  # noqa: BLE001 - handed to the waiter
            return e
        return None

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        error = self._gpu_error()
        if error is not None:
            raise error
        torch.cuda.current_stream(self._device).wait_event(self._event)
        return True

    def is_completed(self) -> bool:
        return bool(self._event.query())

    def is_success(self) -> bool:
        return self._gpu_error() is None

    def exception(self) -> BaseException | None:
        return self._gpu_error()


class _MarkedWork(_StreamWork):
    """The handle of a GPU op queued on the group's stream by the shorter way of ``_on_stream``:
    its end is a mark, a counter the group's stream stores into pinned memory after the op
    (``accord_coll::gpu::marks``), instead of a CUDA event. ``wait`` makes the caller's current
    stream wait until the counter reaches the op's mark (a stream memory wait);
    ``is_completed`` reads it. Making, recording and waiting on a PyTorch event and stream
    object per op was about a third of an op's host time (``torch_op_cost_probe.py``)."""

    def __init__(self, group: _Group, op: str, result: list[torch.Tensor], gpu: _GpuPath, mark: int) -> None:
        Work.__init__(self, group, op, result)
        self._device = gpu.device
        self._stream = gpu.stream
        self._comm = gpu.comm
        self._index = gpu.index
        self._mark = mark
        self._done.set()

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        error = self._gpu_error()
        if error is not None:
            raise error
        self._comm.wait_mark(_current_raw_stream(self._index), self._mark)
        return True

    def is_completed(self) -> bool:
        return bool(self._comm.mark_reached(self._mark))


class _GpuPath:
    """A group's GPU collectives: the communicator, the one device it serves, and, where the
    reductions run on the caller's stream (``ACCORD_GPU_REDUCE_ON_CALLER=1``) or all_reduces go
    direct (``ACCORD_GPU_DIRECT_BYTES``, on by default), the group's communication stream.

    With that stream, every GPU op is queued on it behind the caller's current stream (an
    event), as ProcessGroupNCCL queues its kernels on a stream of its own, and ``Work.wait`` puts
    the caller's stream back behind the op: a collective holds the stream it is queued on until
    its bytes have moved, and on a stream of the group's own the compute queued after it (DDP's
    backward pass) runs beside it. Without it, ops are queued on the caller's current stream:
    with the reductions launched by the progress thread, in a CUDA context of its own, a DDP step
    on a separate stream took 6.3-7.0 ms against 2.6-3.3 ms on the caller's (2xH200,
    docs/results/2026-11-26-torch-gpu-path.md, stop 38). The suspected cause, the GPU
    time-slicing the two contexts' kernels, is not confirmed yet."""

    def __init__(self, comm: Any, device: torch.device, own_stream: bool) -> None:
        self.comm = comm
        self.device = device
        self.index: int = device.index if device.index is not None else torch.cuda.current_device()
        self.stream: Any = _CudaStream(device) if own_stream else None
        self.side_raw: int = self.stream.cuda_stream if self.stream is not None else 0


def _current_raw_stream(index: int) -> int:
    """The raw handle of the current stream of GPU ``index``: PyTorch's own lookup where it has
    one (a C call, as its compiled kernels use), else through ``torch.cuda.current_stream``."""
    if _RAW_STREAM is not None:
        return int(_RAW_STREAM(index))
    return int(torch.cuda.current_stream(index).cuda_stream)


_RAW_STREAM: Any = getattr(torch._C, "_cuda_getCurrentRawStream", None)
