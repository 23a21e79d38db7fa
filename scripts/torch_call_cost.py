"""The fixed cost of one torch.distributed call through the "accord" backend on one rank, with
no peer to wait for: us a call (mean of 20,000 after 500) for each common op on a 4 KiB float32
tensor, then accord.Communicator's own all_reduce on that tensor and on a numpy array. What is
left is the Python layer's work and the binding's (what issue 20's "under 10% at 1 MiB" is
about), so two builds can be compared on any machine, no GPU and no peer needed.

The first two lines are floors: the same calls through backends whose ops do nothing. "floor"
is a Python backend returning a finished Work, i.e. what torch.distributed itself costs for any
backend written in Python (its Python wrapper, the c10d dispatcher, the call into Python);
Accord's share of a call is its line minus this floor. "fake" is torch's own C++ FakeProcessGroup
(torch.testing), what the same calls cost with a backend written in C++: the floor minus fake
is what moving the backend out of Python could save at most.

    python scripts/torch_call_cost.py            # floor, then the importable accord package
    PYTHONPATH=/path/to/other/build python scripts/torch_call_cost.py
    python scripts/torch_call_cost.py gloo       # floor, then the same ops through gloo

docs/results/2026-11-27-proxy-host-steps-and-torch-layer.md has stop 45's before and after;
docs/results/2026-11-27-torch-floors-and-binding-cost.md the floors and stop 46's binding;
docs/results/2026-11-27-torch-native-backend.md stop 47's compiled all_reduce. With torch 2.15
and later, torch's flight recorder adds about 2.6 us to each call of a backend that is not
Gloo's or NCCL's own; TORCH_FR_BUFFER_SIZE=0 turns it off (torch 2.11 has none).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable


def mean_us(call: Callable[[], object], calls: int = 20_000, warmup: int = 500) -> float:
    for _ in range(warmup):
        call()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def register_floor_backend() -> None:
    """Registers "floor": a Python backend whose every op used below returns a finished Work
    at once, without touching the tensors."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import Backend, Work

    class Done(Work):  # type: ignore[misc]
        def wait(self, timeout: Any = None) -> bool:
            return True

        def is_completed(self) -> bool:
            return True

    class Floor(Backend):  # type: ignore[misc]
        def getBackendName(self) -> str:
            return "floor"

        def name(self) -> str:
            return "floor"

        def _done(self, *args: Any) -> Work:
            return Done()

        # Both names of each tensor form, as accord.torch defines them: torch releases call one
        # or the other.
        allreduce = broadcast = barrier = alltoall_base = all_to_all_single = _done
        _allgather_base = all_gather_single = _reduce_scatter_base = reduce_scatter_single = _done

    def create(store: Any, rank: int, size: int, timeout: Any) -> Floor:
        return Floor(rank, size)

    dist.Backend.register_backend("floor", create, devices=["cpu"])


def time_ops(backend: str) -> None:
    import torch
    import torch.distributed as dist

    if backend == "fake":
        # torch's C++ do-nothing backend; it needs its own store and more than one rank.
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    else:
        dist.init_process_group(backend, rank=0, world_size=1)
    # 4 KiB a rank: `t` and `out` alike, `whole` the world's (all_gather's output, reduce_scatter's input).
    t, out, whole = torch.ones(1024), torch.ones(1024), torch.ones(1024 * dist.get_world_size())
    ops: dict[str, Callable[[], object]] = {
        "all_reduce": lambda: dist.all_reduce(t),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(whole, t),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(out, whole),
        "all_to_all_single": lambda: dist.all_to_all_single(out, t),
        "broadcast": lambda: dist.broadcast(t, 0),
        "barrier": lambda: dist.barrier(),
    }
    line = f"dist ({backend}): " + "  ".join(f"{n} {mean_us(c):.2f}" for n, c in ops.items())
    native = getattr(dist.group.WORLD, "_native_ops", None)
    if native is not None:
        # accord.torch's compiled backend (ACCORD_TORCH_NATIVE): how many all_reduces it ran.
        line += f"  [compiled all_reduces: {native()[1]}]"
    print(line, flush=True)
    dist.destroy_process_group()


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    import torch

    import accord.torch  # noqa: F401 - registers "accord"

    backend = sys.argv[1] if len(sys.argv) > 1 else "accord"
    register_floor_backend()
    for name in ("fake", "floor", backend):
        time_ops(name)
    if backend != "accord":
        return
    # The binding alone: accord.Communicator's calls on the tensors (and all_reduce on a numpy
    # array), as the backend makes them.
    import numpy as np

    import accord

    t, out = torch.ones(1024), torch.ones(1024)
    comm = accord.Communicator(0, 1, "127.0.0.1", int(os.environ["MASTER_PORT"]) + 1, timeout=30)
    comm.interruptible = False  # in place, as the backend calls it
    array = np.ones(1024, np.float32)
    calls: dict[str, Callable[[], object]] = {
        "all_reduce": lambda: comm.all_reduce(t),
        "all_reduce(numpy)": lambda: comm.all_reduce(array),
        "all_gather": lambda: comm.all_gather(t, out),
        "reduce_scatter": lambda: comm.reduce_scatter(t, out),
        "all_to_allv": lambda: comm.all_to_allv(t, out, [1024], [1024]),
        "broadcast": lambda: comm.broadcast(t, 0),
    }
    print("Communicator: " + "  ".join(f"{n} {mean_us(c):.2f}" for n, c in calls.items()), flush=True)
    comm.close()


if __name__ == "__main__":
    main()
