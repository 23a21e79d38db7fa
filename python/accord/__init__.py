"""accord: Python bindings of Accord's TransferEngine.

One-sided writes with immediate counters, paged writes, scatters, two-sided sends and
barriers between engines in any processes, over Accord's user-space transport; registered
memory is any writable buffer (numpy arrays, bytearrays, torch CPU tensors through DLPack).

    import accord, numpy as np
    with accord.Engine() as a, accord.Engine() as b:
        src, dst = np.arange(1024, dtype=np.uint8), np.zeros(1024, np.uint8)
        with a.register(src) as s, b.register(dst) as d:
            a.write(s, d.descriptor, imm=7).wait(timeout=5)
            assert b.imm_counter(7).value == 1 and (dst == src).all()

Collectives: ``accord.Communicator`` (all_reduce, reduce, broadcast, all_gather,
reduce_scatter, all_to_all, send/recv, barrier on numpy arrays) joins a torchrun-style job;
``accord.run(fn, nprocs)`` starts such a job of local processes. ``accord.GpuCommunicator``
runs the copy-engine GPU collectives of one host on device addresses and a caller's stream. ``import accord.torch``
registers the ``torch.distributed`` backend ``"accord"`` (needs torch; not imported here).

Addresses and descriptors are exchanged out of band (they pickle, and ``str()`` gives JSON).
Blocking calls release the GIL and Ctrl-C interrupts them; ``await transfer`` works in asyncio.
Errors are subclasses of ``accord.AccordError`` (see ``accord.errors``).

The engine's own events (warnings such as a full table of immediate counters, debug detail)
go to ``logging.getLogger("accord")``. Only records at or above the level set when accord was
imported (the logger's effective level, WARNING by default, or ``ACCORD_LOG=debug``) cross
from the engine; ``accord.set_log_level(logging.DEBUG)`` changes it later.
"""

from __future__ import annotations

import atexit
import logging
import os

from accord._accord import (
    RECV_QUEUED_MAX,
    VERSION,
    WAIT_SLICE_S,
    Address,
    Communicator,
    Descriptor,
    Engine,
    GpuCommunicator,
    ImmCounter,
    MemoryRegion,
    ScatterDst,
    Transfer,
    _close_all,
    _install_log_bridge,
    _set_log_threshold,
)
from accord.errors import (
    AccordError,
    CancelledError,
    ConfigError,
    InvalidBufferError,
    InvalidRequestError,
    PeerError,
    RemoteAccessError,
    ShutdownError,
    TimeoutError,
)
from accord._run import run


__version__ = VERSION

__all__ = [
    "Address",
    "AccordError",
    "CancelledError",
    "Communicator",
    "ConfigError",
    "Descriptor",
    "Engine",
    "GpuCommunicator",
    "ImmCounter",
    "InvalidBufferError",
    "InvalidRequestError",
    "MemoryRegion",
    "PeerError",
    "RECV_QUEUED_MAX",
    "RemoteAccessError",
    "ScatterDst",
    "ShutdownError",
    "TimeoutError",
    "Transfer",
    "WAIT_SLICE_S",
    "__version__",
    "run",
    "set_log_level",
]

_logger = logging.getLogger("accord")
_env_level = os.environ.get("ACCORD_LOG", "").strip().upper()
if _env_level in ("TRACE", "DEBUG", "INFO", "WARNING", "WARN", "ERROR"):
    _logger.setLevel({"TRACE": 5, "WARN": logging.WARNING}.get(_env_level) or getattr(logging, _env_level))


def set_log_level(level: int | str) -> None:
    """Sets the ``accord`` logger's level, and which engine events cross into ``logging``."""
    _logger.setLevel(level)
    _set_log_threshold(_logger.getEffectiveLevel())


_install_log_bridge(_logger.getEffectiveLevel())

# Engines still open at exit are closed while the interpreter can still run their callbacks.
atexit.register(_close_all)
