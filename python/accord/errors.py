"""The exceptions of accord: one base, and a class per thing the caller can act on.

Every message says what went wrong and what to do about it. Classes that match a builtin
category also derive from it, so generic handlers keep working::

    AccordError
     +-- ConfigError            (also ValueError)      the engine could not be built
     +-- InvalidRequestError    (also ValueError)      refused before anything was sent
     |    +-- InvalidBufferError                       read-only / non-contiguous / wrong dtype /
     |                                                 empty / GPU buffer, closed region, bounds
     +-- RemoteAccessError                             the receiver refused a write or send
     +-- PeerError              (also ConnectionError) unknown peer, or it stopped answering
     +-- TimeoutError           (also builtins.TimeoutError)
     +-- CancelledError                                a request was cancelled by its caller
     +-- ShutdownError                                 the engine was closed
"""

from __future__ import annotations

import builtins

__all__ = [
    "AccordError",
    "ConfigError",
    "InvalidRequestError",
    "InvalidBufferError",
    "RemoteAccessError",
    "PeerError",
    "TimeoutError",
    "CancelledError",
    "ShutdownError",
]


class AccordError(Exception):
    """Base of every error accord raises."""


class ConfigError(AccordError, ValueError):
    """The engine could not be built: a setting or an ``ACCORD_*`` override is out of range."""


class InvalidRequestError(AccordError, ValueError):
    """Arguments were refused before anything was sent (bad page lists, unknown peer form...)."""


class InvalidBufferError(InvalidRequestError):
    """A buffer cannot be registered (read-only, not C-contiguous, object dtype, empty, GPU
    memory), a region is closed, or a range falls outside a region."""


class RemoteAccessError(AccordError):
    """The receiver refused the transfer: unknown or deregistered region, wrong key, bounds,
    or no free receive buffer. Nothing was placed."""


class PeerError(AccordError, ConnectionError):
    """The peer is unknown (call ``add_peer``) or stopped answering on every NIC."""


class TimeoutError(AccordError, builtins.TimeoutError):  # noqa: A001 - deliberate shadowing
    """A wait gave up before its condition held. Also a builtin ``TimeoutError``."""


class CancelledError(AccordError):
    """A request was cancelled by its caller before it was over (``accord.kv``'s
    ``KvTransfer.cancel``): nothing more of it is submitted; what it wrote is undefined."""


class ShutdownError(AccordError):
    """The engine was closed before or during the call."""
