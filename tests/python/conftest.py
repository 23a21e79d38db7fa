"""Shared fixtures of the accord Python tests.

Engines are built with ``ignore_env=True`` so ``ACCORD_*`` variables of the caller's shell
cannot change what a test exercises. ``route`` parametrises a test over the two ways a write
travels between engines of one process: a checked memcpy, or the whole network stack over
loopback (``force_network``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import accord

ROUTES = ["memcpy", "network"]


def make_pair(route: str, **kwargs: object) -> tuple[accord.Engine, accord.Engine]:
    network = route == "network"
    a = accord.Engine(force_network=network, ignore_env=True, **kwargs)  # type: ignore[arg-type]
    b = accord.Engine(force_network=network, ignore_env=True, **kwargs)  # type: ignore[arg-type]
    a.add_peer(b.address)
    b.add_peer(a.address)
    return a, b


@pytest.fixture(params=ROUTES)
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[accord.Engine, accord.Engine]]:
    a, b = make_pair(request.param)
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def engine() -> Iterator[accord.Engine]:
    with accord.Engine(ignore_env=True) as e:
        yield e
