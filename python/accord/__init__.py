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
``accord.run(fn, nprocs)`` starts such a job of local processes. ``import accord.torch``
registers the ``torch.distributed`` backend ``"accord"`` (needs torch; not imported here).

Addresses and descriptors are exchanged out of band (they pickle, and ``str()`` gives JSON).
Blocking calls release the GIL and Ctrl-C interrupts them; ``await transfer`` works in asyncio.
Errors are subclasses of ``accord.AccordError`` (see ``accord.errors``).
"""

from __future__ import annotations

import atexit

from accord._accord import (
    RECV_QUEUED_MAX,
    VERSION,
    WAIT_SLICE_S,
    Address,
    Communicator,
    Descriptor,
    Engine,
    ImmCounter,
    MemoryRegion,
    ScatterDst,
    Transfer,
    _close_all,
)
from accord.errors import (
    AccordError,
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
    "Communicator",
    "ConfigError",
    "Descriptor",
    "Engine",
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
]

# Engines still open at exit are closed while the interpreter can still run their callbacks.
atexit.register(_close_all)
