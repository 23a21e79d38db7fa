"""Binding overhead: a 4 KiB write through Python vs. the same write through Rust.

Both loops run ``write(src, dst, nbytes)`` followed by ``wait()`` on the same engine, regions
and descriptor; the Rust loop (``accord._accord._bench_write_loop``) is the plain Rust API
with the GIL released, the Python loop goes through the bindings (argument conversion, GIL
release and re-acquire, source-region tracking, the Transfer object). The difference per
call is what the bindings add.

Two routes are measured:

* ``memcpy`` (the headline): the peer engine lives in the same process, so a write is a
  checked memcpy on the calling thread. Nothing else is in the loop, which isolates the
  binding overhead best.
* ``network``: both engines are built with ``force_network=True``, so every write crosses
  the whole stack over loopback UDP (worker threads, protocol, acknowledgement). The
  overhead is the same few microseconds, but it drowns in the round trip's variance.

Each figure is the best of ``--repeats`` runs (interleaved Rust and Python), in microseconds
per call. Run: ``python -m accord._bench [--iterations N] [--repeats R] [--nbytes B]``.
"""

from __future__ import annotations

import argparse
import time
from typing import NamedTuple

from accord._accord import Engine, MemoryRegion, _bench_write_loop
from accord._accord import Descriptor


class Row(NamedTuple):
    route: str
    rust_us: float
    python_us: float

    @property
    def added_us(self) -> float:
        return self.python_us - self.rust_us


def _python_loop(engine: Engine, src: MemoryRegion, dst: Descriptor, nbytes: int, iterations: int) -> float:
    write = engine.write
    start = time.perf_counter()
    for _ in range(iterations):
        write(src, dst, nbytes).wait()
    return time.perf_counter() - start


def measure(route: str, nbytes: int, iterations: int, repeats: int) -> Row:
    """Best-of-`repeats` µs per call of both loops on one route (`memcpy` or `network`)."""
    network = route == "network"
    with Engine(force_network=network, ignore_env=True) as a, Engine(force_network=network, ignore_env=True) as b:
        if network:
            a.add_peer(b.address)
        with a.alloc(nbytes) as src, b.alloc(nbytes) as dst:
            d = dst.descriptor
            warm = max(iterations // 10, 10)
            _bench_write_loop(a, src, d, nbytes, warm)
            _python_loop(a, src, d, nbytes, warm)
            rust, python = [], []
            for _ in range(repeats):
                rust.append(_bench_write_loop(a, src, d, nbytes, iterations))
                python.append(_python_loop(a, src, d, nbytes, iterations))
    return Row(route, min(rust) / iterations * 1e6, min(python) / iterations * 1e6)


def table(rows: list[Row], nbytes: int) -> str:
    lines = [
        f"{nbytes} B write + wait, µs per call (best of repeats)",
        f"{'route':<8} {'rust':>9} {'python':>9} {'added':>9} {'ratio':>7}",
    ]
    for r in rows:
        lines.append(
            f"{r.route:<8} {r.rust_us:>9.2f} {r.python_us:>9.2f} {r.added_us:>9.2f} {r.python_us / r.rust_us:>7.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description="accord binding overhead: Python vs Rust write loop")
    parser.add_argument("--nbytes", type=int, default=4096)
    parser.add_argument("--iterations", type=int, default=20000, help="memcpy-route calls per run")
    parser.add_argument("--network-iterations", type=int, default=2000, help="network-route calls per run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--route", choices=["memcpy", "network", "both"], default="both")
    args = parser.parse_args(argv)
    rows = []
    if args.route in ("memcpy", "both"):
        rows.append(measure("memcpy", args.nbytes, args.iterations, args.repeats))
    if args.route in ("network", "both"):
        rows.append(measure("network", args.nbytes, args.network_iterations, args.repeats))
    print(table(rows, args.nbytes))
    return rows


if __name__ == "__main__":
    main()
