"""accord.weights: a trainer pushes versions of named tensors into two receivers; every byte of a
version is in place when wait returns, a push waits for every receiver's ack of the previous one,
mismatched manifests are refused naming the tensor, and waits are bounded."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import accord
from accord.weights import WeightPusher, WeightReceiver

SHAPES = {"embed": (64, 32), "w1": (128, 64), "b1": (128,), "head": (16, 64)}


def tensors(version: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(version)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


@pytest.fixture(params=["memcpy", "network"])
def engines(request: pytest.FixtureRequest):
    network = request.param == "network"
    made = [accord.Engine(force_network=network, ignore_env=True) for _ in range(3)]
    yield made
    for e in made:
        e.close()


def test_versions_land_whole_and_pushes_wait_for_acks(engines: list[accord.Engine]) -> None:
    trainer_engine, *inference_engines = engines
    weights = tensors(0)
    copies = [{n: np.zeros(s, np.float32) for n, s in SHAPES.items()} for _ in inference_engines]
    receivers = [WeightReceiver(e, c) for e, c in zip(inference_engines, copies)]
    manifests = [pickle.loads(pickle.dumps(r.manifest())) for r in receivers]  # as a control plane would
    pusher = WeightPusher(trainer_engine, weights, manifests)
    for r in receivers:
        r.attach(pickle.loads(pickle.dumps(pusher.info())))
    for version in (1, 2, 3):
        fresh = tensors(version)
        for n in SHAPES:
            weights[n][...] = fresh[n]
        pusher.push(version).wait(timeout=20)
        for r, copy in zip(receivers, copies):
            r.wait(version, timeout=20)
            for n in SHAPES:
                assert np.array_equal(copy[n], fresh[n]), f"{n} of version {version}"
            r.ack(version)
    # A push before every receiver acked the last one waits, then names the shortfall.
    pusher.push(4).wait(timeout=20)
    receivers[0].wait(4, timeout=20)
    receivers[0].ack(4)
    with pytest.raises(accord.TimeoutError, match="1 of 2 receivers acked version 4"):
        pusher.push(5, ack_timeout=0.3)
    pusher.close()
    for r in receivers:
        r.close()


def test_mismatched_manifests_are_refused_naming_the_tensor(engines: list[accord.Engine]) -> None:
    trainer_engine, inference_engine, _ = engines
    weights = tensors(0)
    short = {n: np.zeros(s, np.float32) for n, s in SHAPES.items()}
    short["b1"] = np.zeros(64, np.float32)
    receiver = WeightReceiver(inference_engine, short)
    with pytest.raises(accord.InvalidRequestError, match="tensor 'b1': 512 bytes here, 256 at receiver 0"):
        WeightPusher(trainer_engine, weights, [receiver.manifest()])
    missing = WeightReceiver(inference_engine, {n: np.zeros(s, np.float32) for n, s in SHAPES.items() if n != "head"})
    with pytest.raises(accord.InvalidRequestError, match=r"tensors missing \['head'\]"):
        WeightPusher(trainer_engine, weights, [missing.manifest()])
    with pytest.raises(accord.InvalidRequestError, match="at least one receiver"):
        WeightPusher(trainer_engine, weights, [])
    receiver.close()
    missing.close()


def test_a_version_never_pushed_times_out_and_ack_needs_attach(engines: list[accord.Engine]) -> None:
    _, inference_engine, _ = engines
    receiver = WeightReceiver(inference_engine, {"w": np.zeros(8, np.float32)})
    with pytest.raises(accord.TimeoutError, match="weight version 7: 0 of 1 tensors landed"):
        receiver.wait(7, timeout=0.2)
    with pytest.raises(accord.InvalidRequestError, match="attach"):
        receiver.ack(7)
    receiver.close()
