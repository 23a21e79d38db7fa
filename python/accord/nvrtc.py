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

Where launches are on a hot path (accord.ep launches about ten kernels a call), ``Kernel.bind``
gives a ``Launcher`` instead: the kernel's parameters read once from its C signature in the
source (``parameter_formats``) and checked against the driver's own layout
(``cuFuncGetParamInfo``), then every launch packs plain ints into one reused parameter buffer
and calls libcuda's ``cuLaunchKernel`` directly. Building a ctypes value per argument and going
through ``cuda.bindings`` cost several microseconds a launch, which at ten launches a call was a
large share of a dispatch's host time (docs/results/2026-11-26-ep.md).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import re
import struct
import threading
from collections.abc import Mapping, Sequence
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

    def bind(self, params: Sequence[str]) -> Launcher:
        """This kernel with its parameters given as ``struct`` formats, one per parameter (see
        ``parameter_formats``), for launches from plain ints (``Launcher``)."""
        return Launcher(self, params)


# ctypes' codes for the C types a kernel signature may use (pointers are 64-bit addresses).
_C_TYPES = {
    "u64": "Q", "unsigned long long": "Q", "uint64_t": "Q", "size_t": "Q",
    "i64": "q", "long long": "q", "int64_t": "q",
    "u32": "I", "unsigned int": "I", "unsigned": "I", "uint32_t": "I",
    "int": "i", "i32": "i", "int32_t": "i",
    "float": "f", "double": "d",
}
_CTYPES_CODES = {
    ctypes.c_uint64: "Q", ctypes.c_int64: "q", ctypes.c_uint32: "I", ctypes.c_int32: "i",
    ctypes.c_float: "f", ctypes.c_double: "d",
}


def struct_format(structure: type[ctypes.Structure]) -> str:
    """The ``struct`` format of a ctypes structure passed by value: its fields in order, padded
    at the end to its alignment, so that ``struct.calcsize`` equals ``ctypes.sizeof``."""
    codes = []
    for field in structure._fields_:
        code = _CTYPES_CODES.get(field[1])
        if code is None:
            raise KernelError(f"{structure.__name__}.{field[0]}: field type {field[1]} has no struct code")
        codes.append(code)
    widest = max(codes, key=struct.calcsize)
    if struct.calcsize("@" + codes[0]) != struct.calcsize("@" + widest):
        raise KernelError(f"{structure.__name__}: its first field must have the structure's alignment")
    fmt = "".join(codes) + "0" + widest
    if struct.calcsize("@" + fmt) != ctypes.sizeof(structure):
        raise KernelError(f"{structure.__name__}: struct format {fmt} does not match its ctypes size")
    return fmt


def parameter_formats(source: str, name: str, structs: Mapping[str, type[ctypes.Structure]] | None = None) -> list[str]:
    """The parameters of ``extern "C" __global__`` function `name` in `source`, as ``struct``
    formats: a pointer is an address (``Q``), scalars by their C type, a structure passed by
    value by its ctypes twin in `structs` (``struct_format``). Raises KernelError for a type it
    does not know, so a signature change fails loudly rather than packing wrong bytes."""
    match = re.search(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?' + re.escape(name) + r"\s*\(([^)]*)\)", source)
    if match is None:
        raise KernelError(f"no extern \"C\" __global__ function {name} in the source")
    formats = []
    for param in (" ".join(p.split()) for p in match.group(1).split(",")):
        if not param or param == "void":
            continue
        if "*" in param:
            formats.append("Q")
            continue
        words = param.replace("const ", "").split()
        c_type = " ".join(words[:-1])
        if c_type in _C_TYPES:
            formats.append(_C_TYPES[c_type])
        elif structs is not None and c_type in structs:
            formats.append(struct_format(structs[c_type]))
        else:
            raise KernelError(f"{name}: parameter {param!r}: unknown type {c_type!r}")
    return formats


_launch_kernel: Any = None


def _cu_launch_kernel() -> Any:
    """libcuda's ``cuLaunchKernel`` as a ctypes function (the driver PyTorch already loaded)."""
    global _launch_kernel
    with _lock:
        if _launch_kernel is None:
            try:
                function = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
            except (OSError, AttributeError) as e:
                raise KernelError(f"libcuda.so.1's cuLaunchKernel is not loadable: {e}") from None
            c_uint, c_void_p = ctypes.c_uint, ctypes.c_void_p
            function.argtypes = [c_void_p] + [c_uint] * 7 + [c_void_p, c_void_p, c_void_p]
            function.restype = ctypes.c_int
            _launch_kernel = function
    return _launch_kernel


class ParameterBuffer:
    """A kernel's parameters packed in one buffer made once: ``struct`` formats, one per
    parameter, laid out with each parameter at its natural alignment (as a C structure of the
    same members), and a pointer to each, the ``kernelParams`` array ``cuLaunchKernel`` reads."""

    def __init__(self, params: Sequence[str]) -> None:
        self.params = list(params)
        offsets = []
        for i, fmt in enumerate(self.params):
            first = fmt[1] if fmt.startswith("0") else fmt[0]  # the parameter's alignment code
            offsets.append(struct.calcsize("@" + "".join(self.params[:i]) + "0" + first))
        self.layout = [(offset, struct.calcsize("@" + fmt)) for offset, fmt in zip(offsets, self.params)]
        self._struct = struct.Struct("@" + "".join(self.params))
        self.buffer = ctypes.create_string_buffer(max(self._struct.size, 8))
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * max(len(offsets), 1))(*[base + o for o in offsets])

    def pack(self, *values: Any) -> None:
        """Stores `values` (a by-value structure's fields flattened in order); raises
        ``struct.error`` when they do not fit the formats."""
        self._struct.pack_into(self.buffer, 0, *values)


class Launcher:
    """A kernel bound to its parameter layout: ``launcher(grid, block, stream, *values)`` packs the
    values (plain ints and floats) into its ``ParameterBuffer`` and launches through libcuda
    directly. The buffer is reused, so a lock covers packing and launching (the driver has
    copied the parameters when ``cuLaunchKernel`` returns)."""

    def __init__(self, kernel: Kernel, params: Sequence[str]) -> None:
        self.name = kernel.name
        self._kernel = kernel  # keeps the module loaded
        self._buffer = ParameterBuffer(params)
        self._check_layout(kernel)
        self._function = int(kernel._function)
        self._launch = _cu_launch_kernel()
        self._lock = threading.Lock()

    def _check_layout(self, kernel: Kernel) -> None:
        """Compares each parameter's size (and their count) with what the driver says the
        compiled kernel takes (``cuFuncGetParamInfo``, CUDA 12.4+; skipped where absent)."""
        info = getattr(kernel._driver, "cuFuncGetParamInfo", None)
        layout = self._buffer.layout
        if info is None:
            return
        for index, (_, size) in enumerate(layout):
            result = info(kernel._function, index)
            if int(result[0]) != 0:
                if index == 0:
                    return  # the driver cannot tell (too old): nothing to compare
                raise KernelError(f"{self.name}: the compiled kernel has {index} parameters, its signature here {len(layout)}")
            if int(result[2]) != size:
                raise KernelError(f"{self.name}: parameter {index} is {int(result[2])} bytes in the kernel, {size} here")
        if layout and int(info(kernel._function, len(layout))[0]) == 0:
            raise KernelError(f"{self.name}: the compiled kernel has more than the {len(layout)} parameters given here")

    def __call__(self, grid: int, block: int, stream: int, *values: Any) -> None:
        buffer = self._buffer
        with self._lock:
            try:
                buffer.pack(*values)
            except struct.error as e:
                raise KernelError(f"launching {self.name}: arguments {values} do not fit its parameters {buffer.params}: {e}") from None
            status = self._launch(self._function, grid, 1, 1, block, 1, 1, 0, stream, buffer.pointers, None)
        if status != 0:
            raise KernelError(f"launching {self.name} failed: CUresult {status}")


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
        self.source = source
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
