"""Builds and loads ``accord.torch``'s compiled backend (``native/torch_backend.cpp``).

Why a compiled part: torch reaches a Python process group through Python at every op, and a
CUDA-aware future made in Python finds its tensors by pickling them. A DDP step pays both at
every bucket on its autograd thread; the compiled backend runs that all_reduce (and a
synchronous CPU all_reduce of registered memory) without Python. See the C++ file's head.

Why built here, not shipped in the wheel: torch's C++ classes have no stable ABI, so the
backend must be compiled against the torch that imports it. It is built once per torch build,
Python version and source, with the C++ compiler (``CXX``, else ``c++``), and kept under
``ACCORD_TORCH_NATIVE_CACHE`` (default ``$XDG_CACHE_HOME/accord/torch-native``, else
``~/.cache/accord/torch-native``). Ranks starting together build it once: the first takes a
file lock, the others wait for it (bounded by ``_BUILD_WAIT_S``).

``ACCORD_TORCH_NATIVE``: ``auto`` (default) uses it where it builds and warns once where it
does not (the Python backend then runs every op, as before); ``0`` never builds it; ``1``
raises where it does not build. Building needs Python's headers and a C++20 compiler; about
13 s on the 2-core development machine."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import warnings
from pathlib import Path
from types import ModuleType

import torch

_SOURCE_DIR = Path(__file__).with_name("native")
_SOURCES = ("torch_backend.cpp", "accord_torch_api.h")
_MODULE = "accord_torch_native"
# How long a rank waits for another to finish the build, and how long one build may take.
_BUILD_WAIT_S = 600.0

# The module once loaded, or the reason it is not (per process: decided once).
_loaded: ModuleType | None = None
_failure: str | None = None


class NativeBuildError(RuntimeError):
    """The compiled backend did not build or load (with ``ACCORD_TORCH_NATIVE=1``)."""

    __module__ = "accord.torch"


def mode() -> str:
    """``ACCORD_TORCH_NATIVE``: ``auto``, ``0`` or ``1``."""
    value = os.environ.get("ACCORD_TORCH_NATIVE", "auto").strip().lower() or "auto"
    if value not in ("auto", "0", "1"):
        raise ValueError(f"ACCORD_TORCH_NATIVE={value!r} is not valid: use auto, 0 or 1")
    return value


def cache_dir() -> Path:
    """Where builds are kept (see the module doc)."""
    given = os.environ.get("ACCORD_TORCH_NATIVE_CACHE")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "accord" / "torch-native"


def _torch_dir() -> Path:
    return Path(torch.__file__).resolve().parent


def _build_key() -> str:
    """What the build depends on: the sources, this torch build, this Python, the ABI flag."""
    digest = hashlib.sha256()
    for name in _SOURCES:
        digest.update((_SOURCE_DIR / name).read_bytes())
    digest.update(torch.__version__.encode())
    digest.update(str(getattr(torch.version, "git_version", "")).encode())
    digest.update(str(_torch_dir()).encode())
    digest.update(sys.version.encode())
    digest.update(str(int(torch._C._GLIBCXX_USE_CXX11_ABI)).encode())
    return digest.hexdigest()[:20]


def _compile_command(target: Path) -> list[str]:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or "c++"
    include = _torch_dir() / "include"
    lib = _torch_dir() / "lib"
    return [
        cxx,
        "-O2",
        "-std=c++20",
        "-shared",
        "-fPIC",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        f"-isystem{include}",
        f"-isystem{include / 'torch' / 'csrc' / 'api' / 'include'}",
        f"-isystem{sysconfig.get_paths()['include']}",
        f"-I{_SOURCE_DIR}",
        str(_SOURCE_DIR / "torch_backend.cpp"),
        "-o",
        str(target),
        f"-L{lib}",
        "-lc10",
        "-ltorch",
        "-ltorch_cpu",
        "-ltorch_python",
        f"-Wl,-rpath,{lib}",
    ]


def _build(target: Path) -> None:
    """Compiles into a temporary file beside ``target``, then renames it into place."""
    partial = target.with_name(f"{target.stem}.{os.getpid()}.partial.so")
    command = _compile_command(partial)
    try:
        # A session of its own: the driver starts the compiler proper, the assembler and the
        # linker, and a build that runs past its time is stopped with all of them.
        compiler = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
    except OSError as e:
        raise NativeBuildError(f"running {command[0]}: {e}") from None
    try:
        out, err = compiler.communicate(timeout=_BUILD_WAIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(compiler.pid, signal.SIGKILL)
        compiler.communicate()
        partial.unlink(missing_ok=True)
        raise NativeBuildError(f"{command[0]} ran past {_BUILD_WAIT_S:.0f} s and was stopped") from None
    if compiler.returncode != 0:
        partial.unlink(missing_ok=True)
        tail = (err or out).strip()[-2000:]
        raise NativeBuildError(f"{command[0]} exited with {compiler.returncode}:\n{tail}")
    os.replace(partial, target)


def _import(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(_MODULE, path)
    if spec is None or spec.loader is None:
        raise NativeBuildError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _built() -> ModuleType:
    """The module, built first where no build of this key is cached (one builder at a time)."""
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{_MODULE}-{_build_key()}.so"
    if target.exists():
        return _import(target)
    with open(directory / f"{target.stem}.lock", "w") as lock:
        deadline = time.monotonic() + _BUILD_WAIT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise NativeBuildError(
                        f"waited {_BUILD_WAIT_S:.0f} s for another process building {target}"
                    ) from None
                time.sleep(0.1)
        try:
            if not target.exists():
                _build(target)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return _import(target)


def load() -> ModuleType | None:
    """The compiled backend's module, or None where it is off or (``auto``) does not build;
    decided once per process."""
    global _loaded, _failure
    if _loaded is not None:
        return _loaded
    chosen = mode()
    if chosen == "0":
        return None
    if _failure is None:
        try:
            _loaded = _built()
            return _loaded
        except Exception as e:  # noqa: BLE001 - reported below, by mode
            _failure = f"{type(e).__name__}: {e}"
            if chosen == "auto":
                warnings.warn(
                    "accord backend: the compiled backend did not build, so every op goes through "
                    f"Python (slower per call); ACCORD_TORCH_NATIVE=0 skips it. {_failure}",
                    stacklevel=3,
                )
    if chosen == "1":
        raise NativeBuildError(f"accord backend: ACCORD_TORCH_NATIVE=1 but the compiled backend failed: {_failure}")
    return None


def _main() -> None:
    """``python -m accord._torch_native``: builds the compiled backend now (for a container
    image, or before a job whose ranks should not wait for the build) and says where it is."""
    start = time.monotonic()
    module = _built()
    print(f"accord.torch compiled backend: {module.__file__} ({time.monotonic() - start:.1f} s)")


if __name__ == "__main__":
    _main()
