"""accord.nvrtc's launch path from plain ints (ParameterBuffer, parameter_formats): the packed
parameters must sit where the kernel reads them, which a CPU can check against ctypes' C layout."""

from __future__ import annotations

import ctypes
import re
import struct

import pytest

import accord.ep
from accord import nvrtc


def test_every_ep_kernel_signature_parses_to_one_format_per_parameter() -> None:
    source = (nvrtc.KERNEL_DIR / "ep.cu").read_text()
    for name in accord.ep.KERNELS:
        formats = nvrtc.parameter_formats(source, name, accord.ep.KERNEL_STRUCTS)
        signature = re.search(r"\b" + name + r"\(([^)]*)\)", source)
        assert signature is not None
        assert len(formats) == signature.group(1).count(",") + 1, name
    # A by-value structure becomes its fields, padded to its size.
    pack = nvrtc.parameter_formats(source, "ep_pack_tokens", accord.ep.KERNEL_STRUCTS)
    assert struct.calcsize("@" + pack[-1]) == ctypes.sizeof(accord.ep._ChunkPuts)


class _Inner(ctypes.Structure):
    _fields_ = [("a", ctypes.c_uint64), ("b", ctypes.c_uint32), ("c", ctypes.c_uint32), ("d", ctypes.c_uint32)]


class _AsC(ctypes.Structure):
    """The parameters below as a C compiler lays out a structure of the same members."""

    _fields_ = [
        ("p0", ctypes.c_uint32), ("p1", ctypes.c_uint64), ("p2", ctypes.c_int32), ("p3", _Inner),
        ("p4", ctypes.c_uint32), ("p5", ctypes.c_float), ("p6", ctypes.c_uint64),
    ]


def test_parameter_buffer_places_each_parameter_as_c_does() -> None:
    params = ["I", "Q", "i", nvrtc.struct_format(_Inner), "I", "f", "Q"]
    buffer = nvrtc.ParameterBuffer(params)
    assert [offset for offset, _ in buffer.layout] == [getattr(_AsC, f"p{i}").offset for i in range(7)]
    assert [size for _, size in buffer.layout] == [getattr(_AsC, f"p{i}").size for i in range(7)]
    base = ctypes.addressof(buffer.buffer)
    assert [p - base for p in buffer.pointers] == [offset for offset, _ in buffer.layout]
    buffer.pack(7, 2**64 - 1, -3, 11, 12, 13, 14, 15, 0.5, 2**40)
    got = _AsC.from_buffer_copy(buffer.buffer.raw[: ctypes.sizeof(_AsC)])
    assert (got.p0, got.p1, got.p2, got.p4, got.p5, got.p6) == (7, 2**64 - 1, -3, 15, 0.5, 2**40)
    assert (got.p3.a, got.p3.b, got.p3.c, got.p3.d) == (11, 12, 13, 14)


def test_values_that_do_not_fit_are_refused() -> None:
    buffer = nvrtc.ParameterBuffer(["Q", "I"])
    with pytest.raises(struct.error):
        buffer.pack(-1, 0)
    with pytest.raises(struct.error):
        buffer.pack(0, 2**32)
    with pytest.raises(struct.error):
        buffer.pack(0)


def test_unknown_parameter_types_fail_loudly() -> None:
    source = 'extern "C" __global__ void k(const float* x, Mystery m, u32 n) {}'
    with pytest.raises(nvrtc.KernelError, match="Mystery"):
        nvrtc.parameter_formats(source, "k", {})
    assert nvrtc.parameter_formats(source.replace("Mystery m", "u64 m"), "k", {}) == ["Q", "Q", "I"]
    with pytest.raises(nvrtc.KernelError, match="no extern"):
        nvrtc.parameter_formats(source, "other", {})
