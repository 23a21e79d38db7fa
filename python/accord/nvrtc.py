"""accord.nvrtc: CUDA kernels compiled at run time, for accord.ep and for user kernels that
include ``accord/device.cuh``: NVRTC through ``cuda.bindings`` (which PyTorch's CUDA wheels
install), so no CUDA toolkit is needed where the kernels run and the code is built for exactly the
GPU it runs on.

A ``KernelModule`` compiles one source (with ``accord/device.cuh`` on the include path and
``ACCORD_NVRTC`` defined) once per process and GPU architecture, loads it into the GPU's primary
context (the one PyTorch uses), and hands out ``Kernel`` objects that launch on a given stream::

    module = accord.nvrtc.KernelModule.from_source(source, "ring_shift.cu", gpu, torch.cuda.get_device_capability(gpu))
    module.kernel("ring_shift").launch(1, 256, torch.cuda.current_stream().cuda_stream, u64(table), ...)

Arguments are passed as ctypes values (``u64``, ``u32``, ``i32``, ``f32`` below), so the kernel's
parameter types are explicit at the call site.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import threading
from pathlib import Path
from typing import Any

import accord.device

u64 = ctypes.c_uint64
u32 = ctypes.c_uint32
i32 = ctypes.c_int32
f32 = ctypes.c_float

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"

_lock = threading.Lock()
_cubins: dict[tuple[str, str], bytes] = {}


class KernelError(RuntimeError):
    """A kernel could not be compiled, loaded or launched (the message says which and why)."""


def _bindings() -> tuple[Any, Any]:
    try:
        # By name: cuda.bindings ships no type information, and may be absent (no CUDA torch).
        driver = importlib.import_module("cuda.bindings.driver")
        nvrtc = importlib.import_module("cuda.bindings.nvrtc")
    except ImportError as e:
        raise KernelError(
            f"accord's GPU kernels are compiled with NVRTC through cuda.bindings, which is not importable ({e}); "
            "install PyTorch's CUDA build (it brings cuda-bindings) or `pip install cuda-bindings`"
        ) from None
    return driver, nvrtc


def _ok(result: Any, what: str) -> Any:
    """The values of a cuda.bindings call (a tuple whose first item is the status)."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if int(status) != 0:
        raise KernelError(f"{what} failed: {status!r}")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def compile_cubin(source: str, name: str, arch: str) -> bytes:
    """`source` compiled for `arch` (e.g. ``sm_90``) with the device header on the include path;
    cached per process. Raises KernelError with NVRTC's log on a compile error."""
    key = (hashlib.sha256(source.encode()).hexdigest(), arch)
    with _lock:
        if key in _cubins:
            return _cubins[key]
    _, nvrtc = _bindings()
    program = _ok(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
    options = [
        b"--std=c++17",
        b"-DACCORD_NVRTC",
        f"--include-path={accord.device.include_dir()}".encode(),
        f"--gpu-architecture={arch}".encode(),
    ]
    try:
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        if int(status) != 0:
            size = _ok(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(program, log)
            raise KernelError(f"NVRTC could not compile {name} for {arch}:\n{log.decode(errors='replace')}")
        cubin = b" " * _ok(nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
        _ok(nvrtc.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    with _lock:
        _cubins[key] = bytes(cubin)
    return bytes(cubin)


class Kernel:
    """One function of a loaded module."""

    def __init__(self, module: KernelModule, name: str, function: Any) -> None:
        self._module = module  # keeps the module loaded
        self.name = name
        self._function = function
        self._driver, _ = _bindings()
        self._streams: dict[int, Any] = {}  # the driver's stream objects, made once per handle

    def launch(self, grid: int, block: int, stream: int, *args: Any) -> None:
        """Launches on the CUDA stream whose handle is `stream` (``torch.cuda.current_stream().cuda_stream``);
        each argument a ctypes value or structure laid out as the kernel's parameter."""
        params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        handle = self._streams.get(stream)
        if handle is None:
            handle = self._streams[stream] = self._driver.CUstream(stream)
        result = self._driver.cuLaunchKernel(self._function, grid, 1, 1, block, 1, 1, 0, handle, ctypes.addressof(params), 0)
        _ok(result, f"launching {self.name}")


def mapped_device_pointer(host_pointer: int) -> int:
    """The device address of pinned host memory (``torch.empty(..., pin_memory=True)``), for a
    kernel to store into directly: with unified addressing it is usually the host address
    itself, and the driver says so (``cuMemHostGetDevicePointer``)."""
    driver, _ = _bindings()
    return int(_ok(driver.cuMemHostGetDevicePointer(host_pointer, 0), "cuMemHostGetDevicePointer"))


class KernelModule:
    """A CUDA source (by default the file `file_name` under ``accord/kernels/``) compiled for, and
    loaded on, GPU `ordinal` of compute capability `capability`."""

    @classmethod
    def from_source(cls, source: str, name: str, ordinal: int, capability: tuple[int, int]) -> KernelModule:
        """`source` (named `name` in compiler messages) compiled for and loaded on GPU `ordinal`."""
        return cls(name, ordinal, capability, source=source)

    def __init__(self, file_name: str, ordinal: int, capability: tuple[int, int], source: str | None = None) -> None:
        driver, _ = _bindings()
        if source is None:
            path = KERNEL_DIR / file_name
            if not path.is_file():
                raise KernelError(f"{path} is missing: reinstall the accord wheel")
            source = path.read_text()
        major, minor = capability
        cubin = compile_cubin(source, file_name, f"sm_{major}{minor}")
        _ok(driver.cuInit(0), "cuInit")
        device = _ok(driver.cuDeviceGet(ordinal), "cuDeviceGet")
        self._context = _ok(driver.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
        _ok(driver.cuCtxSetCurrent(self._context), "cuCtxSetCurrent")
        self._module = _ok(driver.cuModuleLoadData(cubin), f"loading {file_name}")
        self.ordinal = ordinal

    def kernel(self, name: str) -> Kernel:
        driver, _ = _bindings()
        return Kernel(self, name, _ok(driver.cuModuleGetFunction(self._module, name.encode()), f"finding {name}"))
