"""Probe for the torch GPU path's next design (issue 20, docs/ARCHITECTURE.md section 8):
can the GPU collectives' progress thread copy PyTorch's own tensors from a CUDA context of its
own, so that it never waits behind a synchronous call (`tensor.cpu()`, `.item()`) of the
application's thread in the primary context?

The 2026-11-22 probe (scripts/device/copy_during_sync_probe.cu) showed the block is per context
and that copies of VMM memory (cuMemCreate) from an own context do not wait, while copies of
cuMemAlloc memory do. PyTorch allocates through cuMemCreate under
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. This probe asks, on PyTorch's memory:
  1. export: do the tensor's physical allocations carry a POSIX fd handle type, and does
     cuMemExportToShareableHandle give an fd for each mapping the tensor spans?
  2. import: can a second process (GPU 1) take those fds with pidfd_getfd, map them, and read
     the tensor's bytes exactly?
  3. no wait: while the main thread sits in a synchronous copy behind a long kernel, does a
     copy of the tensor submitted from (a) the primary context and (b) an own context return?

    python3 scripts/device/vmm_ipc_probe.py          # parent; it starts the child itself

Prints one line per finding and a JSON summary last. Every wait is bounded (a watchdog ends the
long kernel's hold by timing out the child and reporting).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import threading
import time

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
SYS_PIDFD_GETFD = 438
u64 = ctypes.c_uint64


def driver() -> ctypes.CDLL:
    cu = ctypes.CDLL("libcuda.so.1")
    return cu


def check(cu: ctypes.CDLL, what: str, r: int) -> None:
    if r != 0:
        name = ctypes.c_char_p()
        cu.cuGetErrorName(r, ctypes.byref(name))
        raise RuntimeError(f"{what} failed: {r} {name.value.decode() if name.value else ''}")


def mappings(cu: ctypes.CDLL, ptr: int, nbytes: int) -> list[tuple[int, int]]:
    """(base, size) of every mapping the range [ptr, ptr + nbytes) touches."""
    out, at = [], ptr
    while at < ptr + nbytes:
        base, size = u64(), ctypes.c_size_t()
        check(cu, "cuMemGetAddressRange", cu.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), u64(at)))
        out.append((base.value, size.value))
        at = base.value + size.value
    return out


def parent() -> int:
    import torch

    summary: dict[str, object] = {"alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
    torch.cuda.set_device(0)
    n = (64 << 20) // 4
    x = torch.arange(n, dtype=torch.float32, device="cuda:0")
    torch.cuda.synchronize()
    cu = driver()
    ranges = mappings(cu, x.data_ptr(), x.numel() * 4)
    summary["mappings"] = len(ranges)
    summary["mapping_sizes_mib"] = sorted({s >> 20 for _, s in ranges})
    print(f"tensor of 64 MiB at {x.data_ptr():#x} spans {len(ranges)} mappings: {summary['mapping_sizes_mib']} MiB")

    # 1. export
    exported = []
    try:
        for base, size in ranges:
            h = u64()
            check(cu, "cuMemRetainAllocationHandle", cu.cuMemRetainAllocationHandle(ctypes.byref(h), ctypes.c_void_p(base)))
            prop = (ctypes.c_uint8 * 64)()
            check(cu, "cuMemGetAllocationPropertiesFromHandle", cu.cuMemGetAllocationPropertiesFromHandle(prop, h))
            handle_types = int.from_bytes(bytes(prop[4:8]), "little")
            fd = ctypes.c_int(-1)
            r = cu.cuMemExportToShareableHandle(ctypes.byref(fd), h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, u64(0))
            cu.cuMemRelease(h)
            check(cu, f"cuMemExportToShareableHandle (handle types {handle_types:#x})", r)
            exported.append({"fd": fd.value, "offset": base - ranges[0][0], "size": size, "types": handle_types})
        summary["export"] = "ok"
        print(f"1. export: ok, {len(exported)} fds, handle types {sorted({e['types'] for e in exported})}")
    except RuntimeError as e:
        summary["export"] = str(e)
        print(f"1. export: FAILED: {e}")

    # 2. import in a second process on GPU 1
    if summary["export"] == "ok":
        ask = {"pid": os.getpid(), "ranges": exported, "tensor_offset": x.data_ptr() - ranges[0][0], "n": n}
        try:
            child = subprocess.run([sys.executable, __file__, "--child"], input=json.dumps(ask), capture_output=True,
                                   text=True, timeout=60)
            lines = child.stdout.strip().splitlines()
            got = json.loads(lines[-1]) if lines else {"import": f"no output; stderr: {child.stderr[-500:]}"}
        except subprocess.TimeoutExpired:
            got = {"import": "child timed out after 60 s"}
        summary.update(got)
        print(f"2. import in another process: {got}")

    # 3. a copy from another thread while the main thread waits in a synchronous copy
    z = torch.empty_like(x)
    for ctx_kind in ("primary", "own"):
        result: dict[str, float | str] = {}
        primary = ctypes.c_void_p()
        check(cu, "cuCtxGetCurrent", cu.cuCtxGetCurrent(ctypes.byref(primary)))

        def worker() -> None:
            try:
                if ctx_kind == "own":
                    dev = ctypes.c_int()  # a new thread has no current context: ask by ordinal
                    check(cu, "cuDeviceGet", cu.cuDeviceGet(ctypes.byref(dev), 0))
                    own = ctypes.c_void_p()
                    check(cu, "cuCtxCreate_v2", cu.cuCtxCreate_v2(ctypes.byref(own), 0, dev))
                else:
                    check(cu, "cuCtxSetCurrent", cu.cuCtxSetCurrent(primary))
                time.sleep(0.3)  # the main thread is in its synchronous copy by now
                t0 = time.perf_counter()
                check(cu, "cuMemcpyDtoD", cu.cuMemcpyDtoD_v2(u64(z.data_ptr()), u64(x.data_ptr()), ctypes.c_size_t(n * 4)))
                check(cu, "cuCtxSynchronize", cu.cuCtxSynchronize())
                result["copy_ms"] = (time.perf_counter() - t0) * 1e3
                result["main_still_blocked"] = str(not main_done.is_set())
            except RuntimeError as e:
                result["error"] = str(e)

        main_done = threading.Event()
        torch.cuda._sleep(4_000_000_000)  # about 2 s of a spinning kernel on the current stream
        t = threading.Thread(target=worker)
        t.start()
        m0 = time.perf_counter()
        host = x.cpu()  # pageable: waits for the kernel, in the primary context
        main_done.set()
        result["main_ms"] = (time.perf_counter() - m0) * 1e3
        t.join(timeout=30)
        torch.cuda.synchronize()
        result["z_equal"] = str(bool(torch.equal(z, x)) and bool(torch.equal(host, x.cpu())))
        summary[f"copy_from_{ctx_kind}_context"] = result
        print(f"3. copy from the {ctx_kind} context during x.cpu(): {result}")
    print(json.dumps(summary))
    return 0


def child() -> int:
    import torch

    ask = json.loads(sys.stdin.read())
    out: dict[str, object] = {}
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pidfd = os.pidfd_open(ask["pid"])
        fds = []
        for r in ask["ranges"]:
            fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, r["fd"], 0)
            if fd < 0:
                raise RuntimeError(f"pidfd_getfd: errno {ctypes.get_errno()} ({os.strerror(ctypes.get_errno())})")
            fds.append(fd)
        torch.cuda.set_device(1)
        torch.cuda.synchronize()
        cu = driver()
        total = max(r["offset"] + r["size"] for r in ask["ranges"])
        va = u64()
        check(cu, "cuMemAddressReserve", cu.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(total), ctypes.c_size_t(0), u64(0), u64(0)))
        for r, fd in zip(ask["ranges"], fds):
            h = u64()
            check(cu, "cuMemImportFromShareableHandle",
                  cu.cuMemImportFromShareableHandle(ctypes.byref(h), ctypes.c_void_p(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
            check(cu, "cuMemMap", cu.cuMemMap(u64(va.value + r["offset"]), ctypes.c_size_t(r["size"]), ctypes.c_size_t(0), h, u64(0)))
            cu.cuMemRelease(h)
            os.close(fd)

        class Desc(ctypes.Structure):
            _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int), ("flags", ctypes.c_int)]

        desc = Desc(CU_MEM_LOCATION_TYPE_DEVICE, 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        check(cu, "cuMemSetAccess", cu.cuMemSetAccess(va, ctypes.c_size_t(total), ctypes.byref(desc), ctypes.c_size_t(1)))
        got = torch.empty(ask["n"], dtype=torch.float32, device="cuda:1")
        t0 = time.perf_counter()
        check(cu, "cuMemcpyDtoD", cu.cuMemcpyDtoD_v2(u64(got.data_ptr()), u64(va.value + ask["tensor_offset"]), ctypes.c_size_t(ask["n"] * 4)))
        check(cu, "cuCtxSynchronize", cu.cuCtxSynchronize())
        out["import_copy_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        want = torch.arange(ask["n"], dtype=torch.float32, device="cuda:1")
        out["import"] = "ok, bytes equal" if torch.equal(got, want) else "MISMATCH"
    except (RuntimeError, OSError) as e:
        out["import"] = f"FAILED: {e}"
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(child() if "--child" in sys.argv else parent())
