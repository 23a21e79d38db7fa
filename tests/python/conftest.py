"""Shared fixtures of the accord Python tests.

Engines are built with ``ignore_env=True`` so ``ACCORD_*`` variables of the caller's shell
cannot change what a test exercises. ``route`` parametrises a test over the two ways a write
travels between engines of one process: a checked memcpy, or the whole network stack over
loopback (``force_network``).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

import pytest

import accord

ROUTES = ["memcpy", "network"]

#: Two connected engines of one process.
Pair = tuple[accord.Engine, accord.Engine]


def make_pair(route: str, **kwargs: object) -> tuple[accord.Engine, accord.Engine]:
    network = route == "network"
    a = accord.Engine(force_network=network, ignore_env=True, **kwargs)  # type: ignore[arg-type]
    b = accord.Engine(force_network=network, ignore_env=True, **kwargs)  # type: ignore[arg-type]
    a.add_peer(b.address)
    b.add_peer(a.address)
    return a, b


@pytest.fixture(scope="session", autouse=True)
def torch_native_built() -> None:
    """Builds accord.torch's compiled backend once, before any test (about 15 s on a 2-core
    machine), so that no rank spends its rendezvous time compiling it; where torch is absent or
    the build fails, the tests run as they would without it (the torch tests then use the
    Python backend, and test_torch_native says why it skips)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    from accord import _torch_native

    if _torch_native.mode() != "0":
        with contextlib.suppress(Exception):
            _torch_native._built()


def cuda_torch() -> Any:
    """torch with a CUDA device; the calling test skips without either."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


@pytest.fixture(params=ROUTES)
def cuda_pair(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Pair]:
    """Two connected engines of one process for CUDA tensors (the test skips without torch or a
    CUDA device), closed after the test. On the network route the bytes are staged and landed
    over loopback, as between hosts: CUDA IPC cannot map memory of the process that exported it,
    so the forced network needs ``ACCORD_DEVICE_IPC=0`` in one process (and these engines read
    the environment, unlike :func:`make_pair`'s)."""
    cuda_torch()
    if request.param == "network":
        monkeypatch.setenv("ACCORD_DEVICE_IPC", "0")
        a, b = accord.Engine(force_network=True), accord.Engine(force_network=True)
        a.add_peer(b.address)
        b.add_peer(a.address)
    else:
        a, b = make_pair(request.param)
    yield a, b
    a.close()
    b.close()


@contextlib.contextmanager
def role_process(
    target: Callable[..., object], *args: object, join_s: float = 60
) -> Iterator[tuple[Connection, dict[str, Any]]]:
    """``target(pipe_end, *args)`` in a spawned process: yields this end of the pipe and the hello
    the role sent first (which must carry no ``"error"``). On the way out the process is joined
    (killed after ``join_s`` seconds, so none is left behind) and must have exited with 0."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child, *args))
    proc.start()
    try:
        assert parent.poll(120), f"{target.__name__} said no hello within 120 s"
        hello = parent.recv()
        assert "error" not in hello, hello.get("error")
        yield parent, hello
    finally:
        proc.join(timeout=join_s)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)
    assert proc.exitcode == 0


@pytest.fixture(params=ROUTES)
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    a, b = make_pair(request.param)
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def engine() -> Iterator[accord.Engine]:
    with accord.Engine(ignore_env=True) as e:
        yield e
