"""accord.weights on CUDA tensors: registration of many bf16 tensors, the static plan, and the
version in every write's immediate, between two engines of one process (copy engine; and over
the network stack, staged and landed) and between two processes (through CUDA IPC; and with IPC
off). Every byte of every version is checked. Skips without torch or a CUDA device."""

from __future__ import annotations

from typing import Any

import pytest

import accord
import cuda_roles
from accord.weights import WeightPusher, WeightReceiver
from conftest import Pair, cuda_torch, role_process

pytestmark = pytest.mark.timeout(180)

#: A few layers' worth of shapes: a norm (a small tensor sharing an allocation with others),
#: attention and MLP matrices, an embedding.
SHAPES = {"embed": (512, 256), "norm": (256,), "q": (256, 256), "kv": (64, 256), "up": (1024, 256), "down": (256, 1024)}
VERSIONS = 3


def fill(torch: Any, tensors: dict[str, Any], version: int) -> None:
    for i, t in enumerate(tensors.values()):
        t.copy_(cuda_roles.weight_pattern(i, version, tuple(t.shape), str(t.device)))
    torch.cuda.synchronize()


def test_versions_of_cuda_tensors_land_whole_in_one_process(cuda_pair: Pair) -> None:
    torch = cuda_torch()
    last = torch.cuda.device_count() - 1
    t, r = cuda_pair
    weights = {n: torch.empty(s, dtype=torch.bfloat16, device="cuda:0") for n, s in SHAPES.items()}
    copies = {n: torch.zeros(s, dtype=torch.bfloat16, device=f"cuda:{last}") for n, s in SHAPES.items()}
    receiver = WeightReceiver(r, copies)
    pusher = WeightPusher(t, weights, [receiver.manifest()])
    receiver.attach(pusher.info())
    for version in range(1, VERSIONS + 1):
        fill(torch, weights, version)
        pusher.push(version).wait(timeout=60)
        receiver.wait(version, timeout=60)
        torch.cuda.synchronize()
        for i, (n, c) in enumerate(copies.items()):
            want = cuda_roles.weight_pattern(i, version, SHAPES[n], f"cuda:{last}")
            assert torch.equal(c, want), f"{n} of version {version}"
        receiver.ack(version)
    pusher.close()
    receiver.close()


@pytest.mark.parametrize("device_ipc", [True, False], ids=["ipc", "network"])
def test_versions_of_cuda_tensors_land_whole_in_another_process(device_ipc: bool,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    torch = cuda_torch()
    last = torch.cuda.device_count() - 1
    monkeypatch.setenv("ACCORD_DEVICE_IPC", "1" if device_ipc else "0")
    with role_process(cuda_roles.weight_receiver, last, SHAPES, VERSIONS) as (parent, hello):
        with accord.Engine() as engine:
            weights = {n: torch.empty(s, dtype=torch.bfloat16, device="cuda:0") for n, s in SHAPES.items()}
            pusher = WeightPusher(engine, weights, [hello["manifest"]])
            parent.send(pusher.info())
            assert parent.recv() == {"attached": True}
            for version in range(1, VERSIONS + 1):
                fill(torch, weights, version)
                pusher.push(version).wait(timeout=60)
                report = parent.recv()
                assert report == {"version": version, "wrong": []}, report
            parent.send("done")
            pusher.close()
