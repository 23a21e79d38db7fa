"""accord.device: device-initiated communication from Python.

A CUDA kernel puts bytes into another rank's window, signals it and waits for signals without
returning to the host, through Accord's device API (the header ``accord/device.cuh``, found in
``include_dir()``). This module builds what such a kernel needs:

    comm = accord.Communicator()                      # torchrun variables
    dc = accord.device.DeviceComm(comm, gpu=local_rank)  # collective; takes `comm` over
    recv = dc.register_window(torch.zeros(n, device="cuda"))   # window 0, on every rank
    send = dc.register_window(torch.ones(n, device="cuda"))    # window 1
    kernel(..., dc.table_ptr)                         # the kernel's `const DeviceTable*`
    dc.close()                                        # barrier, proxies stopped, tensors released

``DeviceComm(comm, ...)`` takes the ``accord.Communicator`` over: every later call on ``comm``
raises ``accord.ShutdownError`` (use ``DeviceComm.barrier()`` for host barriers). Registered
tensors and arrays stay referenced until ``close()``. With ``gpu=None`` everything lives in host
memory: no GPU is involved and ``DeviceComm.host_producer(ring)`` writes descriptors exactly as a
GPU thread does (the CPU tests use it). ``examples/device_api/torch_ring_shift.py`` is a complete
program with a torch C++/CUDA extension.
"""

from __future__ import annotations

from pathlib import Path

from accord._accord import (
    DEVICE_LAYOUT_VERSION,
    DEVICE_RING_SLOTS_DEFAULT,
    DeviceComm,
    HostProducer,
)

__all__ = [
    "DEVICE_LAYOUT_VERSION",
    "DEVICE_RING_SLOTS_DEFAULT",
    "DeviceComm",
    "FLAG_COUNTER",
    "HostProducer",
    "OP_PUT",
    "OP_PUT_VALUE",
    "OP_SIGNAL",
    "SIGNAL_ADD",
    "SIGNAL_NONE",
    "SIGNAL_SET",
    "include_dir",
]

# Descriptor field values (crates/accord-device/src/layout.rs, mirrored by accord/device.cuh),
# for HostProducer.push.
OP_PUT = 1
OP_PUT_VALUE = 2
OP_SIGNAL = 3
SIGNAL_NONE = 0
SIGNAL_ADD = 1
SIGNAL_SET = 2
FLAG_COUNTER = 1


def include_dir() -> str:
    """The folder to put on a compiler's include path (``nvcc -I``, NVRTC ``--include-path``,
    ``load_inline(extra_include_paths=...)``) for ``#include <accord/device.cuh>``. The header
    ships inside the package, so it always matches this build's table layout
    (``DEVICE_LAYOUT_VERSION``)."""
    folder = Path(__file__).resolve().parent / "include"
    header = folder / "accord" / "device.cuh"
    if not header.is_file():
        raise FileNotFoundError(
            f"{header} is missing: this accord package was installed without its device header; "
            "reinstall the wheel (or use crates/accord-device/include from a checkout)"
        )
    return str(folder)
