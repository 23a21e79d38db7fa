"""Rendezvous through a store that someone else runs: c10d stores, torchrun's agent store.

Under torchrun (``TORCHELASTIC_USE_AGENT_STORE=True``) the elastic agent already serves a
TCPStore on ``MASTER_PORT``, so ``accord.Communicator()`` cannot host its own store there. The
native ``Communicator`` then calls :func:`agent_store`, which connects to the agent's store as a
client and gives it back wrapped in :class:`StoreAdapter`; the engine addresses are exchanged
through it and no port is opened. Without torch the communicator falls back to
``MASTER_PORT + 1`` for its own store.
"""

from __future__ import annotations

import datetime
from typing import Any


class StoreAdapter:
    """A c10d ``Store`` with the two methods the native ``Communicator(store=...)`` calls.

    ``set(key, value)`` stores bytes; ``get(key, timeout)`` waits up to ``timeout`` seconds for
    the key (c10d's ``wait``) and returns its bytes, raising on timeout.
    """

    def __init__(self, store: Any) -> None:
        self.store = store

    def set(self, key: str, value: bytes) -> None:
        self.store.set(key, value)

    def get(self, key: str, timeout: float) -> bytes:
        self.store.wait([key], datetime.timedelta(seconds=timeout))
        return bytes(self.store.get(key))


def agent_store(master_addr: str, master_port: int, rank: int, timeout: float) -> tuple[StoreAdapter, str] | None:
    """A client of torchrun's agent store and this communicator's key prefix, or ``None``
    without torch.

    Every rank counts the communicators it created (a counter per rank in the store), so the
    n-th communicator of each rank uses the prefix ``accord/communicator/n/``: ranks that create
    communicators in the same order meet under the same keys.
    """
    try:
        from torch._C._distributed_c10d import TCPStore
    except ImportError:
        return None
    store = TCPStore(
        master_addr,
        master_port,
        is_master=False,
        timeout=datetime.timedelta(seconds=timeout),
        wait_for_workers=False,
    )
    generation = store.add(f"accord/communicators/{rank}", 1)
    return StoreAdapter(store), f"accord/communicator/{generation}/"
