#!/usr/bin/env python3
"""Facts about this host's GPUs that decide whether NCCL would use GPUDirect with a net plugin:
per GPU, the CUDA driver's GPUDirect RDMA and DMA-BUF support, the number of async copy engines
and the PCI bus id with its /sys path (how far the GPU sits from a device placed on a bus).

Usage: python3 scripts/device/gpu_facts.py   (needs the CUDA driver, libcuda.so.1; no torch)
"""

import ctypes
import os
import sys

# CUdevice_attribute values from the CUDA driver API.
ATTRIBUTES = [
    ("gpu_direct_rdma_supported", 116),
    ("gpu_direct_rdma_flush_writes_options", 117),
    ("dma_buf_supported", 124),
    ("async_engine_count", 40),
]


def main() -> int:
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        print(f"no CUDA driver here: {e}", file=sys.stderr)
        return 1
    rc = cu.cuInit(0)
    if rc != 0:
        print(f"cuInit failed: CUresult {rc}", file=sys.stderr)
        return 1
    count = ctypes.c_int()
    cu.cuDeviceGetCount(ctypes.byref(count))
    for ordinal in range(count.value):
        dev = ctypes.c_int()
        cu.cuDeviceGet(ctypes.byref(dev), ordinal)
        facts = []
        for name, attr in ATTRIBUTES:
            value = ctypes.c_int(-1)
            rc = cu.cuDeviceGetAttribute(ctypes.byref(value), attr, dev)
            facts.append(f"{name}={value.value if rc == 0 else f'error {rc}'}")
        bus = ctypes.create_string_buffer(64)
        cu.cuDeviceGetPCIBusId(bus, 64, dev)
        bus_id = bus.value.decode().lower()
        sys_path = os.path.realpath(f"/sys/bus/pci/devices/{bus_id}")
        print(f"GPU {ordinal}: bus {bus_id} at {sys_path}; " + " ".join(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
