"""Registering caller memory: what is accepted, what is refused (before anything is sent),
and how long the registered object is kept alive."""

from __future__ import annotations

import array
import gc
import weakref
from typing import Any

import numpy as np
import pytest

import accord


class DlpackOnly:
    """Exposes an array through DLPack alone (no buffer protocol), like a torch tensor."""

    def __init__(self, arr: np.ndarray, device: tuple[int, int] = (1, 0)) -> None:
        self.arr, self.device = arr, device

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.arr.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.zeros(1000, dtype=np.float32),
        lambda: np.zeros((4, 8, 16), dtype=np.int16),
        lambda: bytearray(100),
        lambda: array.array("d", [0.0] * 10),
        lambda: memoryview(bytearray(64)),
        lambda: DlpackOnly(np.zeros(33, dtype=np.uint8)),
        lambda: DlpackOnly(np.zeros((3, 5), dtype=np.float64)),
    ],
)
def test_writable_contiguous_buffers_register(engine: accord.Engine, make: Any) -> None:
    obj = make()
    with engine.register(obj) as region:
        assert region.obj is obj
        assert region.nbytes > 0 and region.data_ptr != 0
        assert region.descriptor.nbytes == region.nbytes
    assert region.closed and region.obj is None


def test_dlpack_memory_is_the_arrays_memory(engine: accord.Engine) -> None:
    dst = np.zeros((2, 8), dtype=np.uint16)
    src = np.arange(16, dtype=np.uint16).reshape(2, 8)
    with engine.register(DlpackOnly(dst)) as d, engine.register(src) as s:
        assert d.nbytes == dst.nbytes and d.data_ptr == dst.ctypes.data
        engine.write(s, d.descriptor).wait(timeout=5)
    assert (dst == src).all()


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: b"immutable bytes", "read-only"),
        (lambda: _readonly(), "read-only"),
        (lambda: np.zeros((8, 8))[:, ::2], "C-contiguous"),
        (lambda: np.zeros((8, 8)).T, "C-contiguous"),
        (lambda: np.array([1, "x", None], dtype=object), "Python objects"),
        (lambda: np.zeros(0), "empty"),
        (lambda: bytearray(), "empty"),
        (lambda: 12345, "neither the buffer protocol nor DLPack"),
        (lambda: "a string", "neither the buffer protocol nor DLPack"),
        (lambda: DlpackOnly(np.zeros((8, 8))[:, ::2]), "not C-contiguous"),
        (lambda: DlpackOnly(np.zeros(8), device=(2, 0)), "capsule says"),
        (lambda: DlpackOnly(np.zeros(8), device=(13, 0)), "CUDA managed memory"),
        (lambda: DlpackOnly(np.zeros(8), device=(10, 0)), "ROCm memory"),
        (lambda: DlpackOnly(np.zeros(8), device=(4, 0)), "only host memory"),
    ],
)
def test_unusable_buffers_raise_clear_errors(engine: accord.Engine, make: Any, match: str) -> None:
    with pytest.raises(accord.InvalidBufferError, match=match):
        engine.register(make())


def _readonly() -> np.ndarray:
    a = np.zeros(8)
    a.flags.writeable = False
    return a


def test_alloc_gives_a_zeroed_registered_bytearray(engine: accord.Engine) -> None:
    region = engine.alloc(100)
    assert isinstance(region.obj, bytearray) and region.obj == bytearray(100)
    with pytest.raises(accord.InvalidBufferError):
        engine.alloc(0)


def test_region_keeps_its_object_alive_until_closed(engine: accord.Engine) -> None:
    arr = np.zeros(4096, dtype=np.uint8)
    alive = weakref.ref(arr)
    region = engine.register(arr)
    del arr
    gc.collect()
    assert alive() is not None  # held by the region
    region.close()
    gc.collect()
    assert alive() is None


def test_garbage_collected_region_is_deregistered(engine: accord.Engine) -> None:
    src = engine.alloc(64)
    arr = np.zeros(64, dtype=np.uint8)
    alive = weakref.ref(arr)
    descriptor = engine.register(arr).descriptor  # region dropped at once
    del arr
    gc.collect()
    assert alive() is None
    with pytest.raises(accord.RemoteAccessError, match="refused"):
        engine.write(src, descriptor).wait(timeout=5)


def test_registered_bytearray_cannot_be_resized(engine: accord.Engine) -> None:
    data = bytearray(64)
    with engine.register(data):
        with pytest.raises(BufferError):
            data.extend(b"more")
    data.extend(b"more")  # released after close


def test_closed_region_and_foreign_region_are_refused(engine: accord.Engine) -> None:
    region = engine.alloc(64)
    dst = engine.alloc(64).descriptor
    region.close()
    region.close()  # idempotent
    with pytest.raises(accord.InvalidBufferError, match="closed"):
        engine.write(region, dst)
    with accord.Engine(ignore_env=True) as other:
        foreign = other.alloc(64)
        with pytest.raises(accord.InvalidBufferError, match="another engine"):
            engine.write(foreign, dst)


def test_closed_engine_raises_shutdown() -> None:
    engine = accord.Engine(ignore_env=True)
    region = engine.alloc(64)
    engine.close()
    assert engine.closed
    with pytest.raises(accord.ShutdownError, match="closed"):
        engine.write(region, region.descriptor)
    with pytest.raises(accord.ShutdownError):
        engine.alloc(8)
    region.close()  # still fine after the engine




def _torch() -> Any:
    return pytest.importorskip("torch")


def test_torch_cpu_tensor_registers_and_receives(engine: accord.Engine) -> None:
    torch = _torch()
    dst = torch.zeros(256, dtype=torch.float32)
    src = np.arange(256, dtype=np.float32)
    with engine.register(dst) as d, engine.register(src) as s:
        assert d.nbytes == 1024
        engine.write(s, d.descriptor, imm=3).wait(timeout=5)
    assert torch.equal(dst, torch.arange(256, dtype=torch.float32))
