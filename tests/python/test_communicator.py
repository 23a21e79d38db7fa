"""accord.Communicator over accord.run: every collective against numpy, misuse refused before
anything is sent, failures reported by rank, the explicit-argument constructor."""

from __future__ import annotations

import os
import time
import socket

import pytest

import accord
import coll_roles

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_collective_matches_numpy(world_size: int) -> None:
    checked = accord.run(coll_roles.every_collective, world_size, timeout=90)
    assert len(checked) == world_size and len(set(checked)) == 1 and checked[0] > 100


def test_misuse_raises_before_anything_is_sent() -> None:
    raised = accord.run(coll_roles.misuse, 2, timeout=60)
    assert raised[0] == raised[1]
    assert len(raised[0]) == 17, raised[0]


def test_explicit_arguments_without_environment() -> None:
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    results = accord.run(coll_roles.explicit_arguments, 2, port, timeout=60)
    assert results == [(0, 3), (1, 3)]


def test_a_rank_that_raises_is_named() -> None:
    with pytest.raises(accord.AccordError, match=r"rank\(s\) \[1\] failed") as info:
        accord.run(coll_roles.one_rank_raises, 3, 1, timeout=60)
    assert "ValueError: rank 1 gives up" in str(info.value)


def test_a_rank_that_exits_non_zero_is_named() -> None:
    with pytest.raises(accord.AccordError, match=r"(?s)rank\(s\) \[1\] failed.*code 3"):
        accord.run(coll_roles.exits_with, 2, 3, timeout=60)


def test_run_sets_the_torchrun_variables_in_children_only() -> None:
    before = dict(os.environ)
    envs = accord.run(coll_roles.environment, 2, timeout=60)
    assert dict(os.environ) == before
    assert [e["RANK"] for e in envs] == ["0", "1"] and {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    assert 20000 <= int(envs[0]["MASTER_PORT"]) < 30000
    assert envs[0]["MASTER_ADDR"] == "127.0.0.1" and envs[1]["LOCAL_WORLD_SIZE"] == "2"
    # One fresh job secret, shared by the ranks (unless the caller set one).
    assert envs[0]["ACCORD_JOB_SECRET"] == envs[1]["ACCORD_JOB_SECRET"]
    assert len(envs[0]["ACCORD_JOB_SECRET"]) == 64


def test_a_missing_peer_times_out_naming_it() -> None:
    outcome = accord.run(coll_roles.peer_timeout, 2, timeout=60)
    assert outcome[0].startswith(("TimeoutError", "PeerError")) and "1" in outcome[0], outcome[0]


def test_calls_run_in_place_when_not_interruptible() -> None:
    outcomes = accord.run(coll_roles.in_place_on_the_main_thread, 2, timeout=60)
    for default, now, data, _ in outcomes:
        assert (default, now) == (True, False)
        assert data == [3.0, 3.0, 3.0, 3.0], data
    timed_out = outcomes[0][3]
    assert timed_out.startswith(("TimeoutError", "PeerError")) and "1" in timed_out, timed_out


def test_a_call_waits_its_turn_behind_another_threads_call() -> None:
    assert accord.run(coll_roles.turns_from_two_threads, 2, timeout=90) == [80, 80]


def test_communicator_without_environment_says_what_to_set() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    if env != dict(os.environ):
        pytest.skip("torchrun variables are set in this shell")
    with pytest.raises(accord.ConfigError, match="RANK"):
        accord.Communicator()
    with pytest.raises(accord.ConfigError, match="timeout"):
        accord.Communicator(0, 1, "127.0.0.1", 1, timeout=-1)


@pytest.mark.parametrize("world_size", [2, 3])
def test_all_to_allv_and_send_recv(world_size: int) -> None:
    checked = accord.run(coll_roles.variable_blocks, world_size, timeout=60)
    assert checked == [3] * world_size


def test_all_to_allv_misuse_raises_before_anything_is_sent() -> None:
    raised = accord.run(coll_roles.all_to_allv_misuse, 3, timeout=60)
    assert raised[0] == raised[1] == raised[2]
    assert len(raised[0]) == 8, raised[0]


def test_bfloat16_arrays() -> None:
    pytest.importorskip("ml_dtypes")
    checked = accord.run(coll_roles.bfloat16_collectives, 2, timeout=60)
    assert checked == [7, 7]


def test_torch_cpu_tensors_float32_and_bfloat16() -> None:
    torch = pytest.importorskip("torch")
    done = accord.run(coll_roles.torch_tensors, 2, timeout=60)
    want = ["torch.float32", "torch.bfloat16"] + (["cuda refused"] if torch.cuda.is_available() else [])
    assert done == [want, want]


def test_torch_tensor_forms_are_read_or_refused_clearly() -> None:
    pytest.importorskip("torch")
    done = accord.run(coll_roles.torch_tensor_forms, 2, timeout=60)
    want = [
        "plain, cached",
        "int64 2-D",
        "requires grad",
        "parameter",
        "overlapping, staged",
        "strided refused",
        "negative view refused",
        "sparse refused",
        "sparse csr refused",
    ]
    assert done == [want, want]


def test_every_element_type_is_read_both_ways() -> None:
    done = accord.run(coll_roles.element_types_read_both_ways, 2, timeout=60)
    want = ["float32", "float64", "float16", "int8", "uint8", "int32", "int64"]
    assert done == [want, want]


def test_arrays_are_registered_in_place_and_cached() -> None:
    done = accord.run(coll_roles.registrations_in_place, 2, timeout=90)
    want = [
        "cached",
        "slice in place",
        "input inside output",
        "read-only input",
        "non-root reduce untouched",
        "from another thread",
        "broadcast in place",
        "once-used arrays let go",
        "bounded",
        "released by close",
    ]
    assert done == [want, want]


def _one_rank_all_reduce(port: int) -> float:
    import numpy as np

    with accord.Communicator(0, 1, "127.0.0.1", port, timeout=20) as comm:
        a = np.full(8, 3.0, np.float32)
        for _ in range(3):
            comm.all_reduce(a)  # from the main thread: on a pooled helper thread
        return float(a[0])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_use_its_parents_helper_threads() -> None:
    # Calls from the main thread run on helper threads kept between calls; a forked child has
    # none of its parent's threads, so it must start its own rather than hand its call to one
    # that does not exist (which would wait forever).
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    assert _one_rank_all_reduce(ports[0]) == 3.0  # the parent's helper is now parked
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        code = 1
        try:
            code = 0 if _one_rank_all_reduce(ports[1]) == 3.0 else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's collective did not finish within 60 s")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0
