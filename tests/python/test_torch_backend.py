"""The torch.distributed backend "accord" (accord.torch): every op against Gloo in the same
job, DDP training against Gloo, a default "accord" group, clear errors, and
accord.Communicator plus init_process_group("accord") under torchrun (whose agent holds
MASTER_PORT). Skipped where torch is not installed."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

import accord  # noqa: E402
import torch_roles  # noqa: E402

pytestmark = pytest.mark.timeout(180)

HERE = Path(__file__).resolve().parent


def test_every_op_matches_gloo() -> None:
    counts = accord.run(torch_roles.every_op, 3, timeout=150)
    # Roots compare more tensors than the others (reduce, gather), subgroup members more too.
    assert len(counts) == 3 and min(counts) > 150, counts


def test_ddp_training_matches_gloo() -> None:
    compared = accord.run(torch_roles.ddp_matches_gloo, 2, timeout=120)
    assert compared == [8, 8]


def test_tensors_the_program_holds_stay_registered() -> None:
    want = ["held by Python", "held by C++", "let go once dropped"]
    assert accord.run(torch_roles.held_tensors_stay_registered, 2, timeout=120) == [want, want]


def test_default_group_is_accord() -> None:
    results = accord.run(torch_roles.default_group, 2, timeout=60)
    for r in results:
        assert r == [3.0] * 5 + [0.0, 0.0, 1.0, 1.0]


def test_misuse_and_timeouts_raise() -> None:
    seen = accord.run(torch_roles.errors, 2, timeout=120)
    common = ["wrong device", "bool dtype", "band", "wrong output size", "bad splits", "mismatched count"]
    assert seen[0] == common + ["timeout"]
    assert seen[1] == common


def test_registered_backend() -> None:
    import torch.distributed as dist

    import accord.torch as backend

    assert dist.Backend("accord") == "accord"
    assert dist.Backend.backend_capability["accord"] == ["cpu", "cuda"]
    backend.register()  # idempotent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_communicator_under_torchrun() -> None:
    """torchrun's agent serves its TCPStore on MASTER_PORT; accord.Communicator() and the
    backend must rendezvous through it instead of binding the port."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(HERE) + os.pathsep + env.get("PYTHONPATH", "")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
        str(HERE / "torch_roles.py"),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr
    # Found anywhere in the output: torchrun relays both ranks' stdout, and a line may share
    # its start with the other rank's.
    lines = sorted(re.findall(r"RANK \d comm \[[^\]]*\] second \[[^\]]*\] pg \[[^\]]*\]", done.stdout))
    assert lines == [
        "RANK 0 comm [3.0, 3.0, 3.0, 3.0] second [2.0, 2.0] pg [1.0, 1.0, 1.0]",
        "RANK 1 comm [3.0, 3.0, 3.0, 3.0] second [2.0, 2.0] pg [1.0, 1.0, 1.0]",
    ], done.stdout + done.stderr


def _two_gpus() -> None:
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")


def test_cuda_tensors_use_the_gpu_collectives_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    _two_gpus()
    monkeypatch.delenv("ACCORD_TORCH_GPU", raising=False)
    results = accord.run(torch_roles.every_op_cuda, 2, timeout=170)
    for r in results:
        assert r["path"] == "_GpuPath", r
        assert r["count"] > 100, r
        # Scratch plus the caching allocator's segments: bounded, not one per call.
        assert 1 < r["registrations"] < 200, r


def test_cuda_tensors_are_staged_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    _two_gpus()
    monkeypatch.setenv("ACCORD_TORCH_GPU", "0")
    results = accord.run(torch_roles.every_op_cuda, 2, timeout=170)
    assert [r["path"] for r in results] == ["bool", "bool"], results


def test_cuda_ddp_matches_gloo() -> None:
    _two_gpus()
    assert accord.run(torch_roles.ddp_cuda_matches_gloo, 2, timeout=120) == [4, 4]


def test_the_gpu_path_is_chosen_together_and_only_where_safe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The choice every rank makes at its first CUDA op, without a GPU: what each rank publishes
    (``_gpu_entry``) and the verdict all take from every rank's entry (``_gpu_verdict``)."""
    import accord.torch as backend

    host = backend._host_identity()
    ok = [f"E|gpu-a|1:3|{host}", f"E|gpu-b|2:3|{host}"]
    assert backend._gpu_verdict(ok) == (True, None)
    # One rank staging (ACCORD_TORCH_GPU=0) stages the group, silently.
    assert backend._gpu_verdict([ok[0], f"0|-|-|{host}"]) == (False, None)
    cases = {
        "several hosts": ([ok[0], "E|gpu-b|2:3|elsewhere/boot"], False, "spans several hosts"),
        "lazy loading": ([ok[0], f"L|gpu-b|2:3|{host}"], False, r"rank\(s\) \[1\] load CUDA modules lazily"),
        "context memory under auto": ([f"U|gpu-a|1:3|{host}", ok[1]], False, r"rank\(s\) \[0\] started CUDA before"),
        "one GPU for two ranks": ([ok[0], ok[0], ok[1]], False, r"ranks \[0, 1\] share a GPU"),
        "context memory, forced": ([f"R|gpu-a|1:3|{host}", ok[1]], True, "can stall it"),
    }
    for name, (entries, use, warning) in cases.items():
        got_use, got_warning = backend._gpu_verdict(entries)
        assert got_use is use, name
        assert got_warning is not None and re.search(warning, got_warning), (name, got_warning)

    # What a rank publishes, from its environment.
    for name in ("CUDA_MODULE_LOADING", "ACCORD_GPU_PRIVATE_CONTEXT", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    assert backend._gpu_entry("0", 0, 7).startswith("0|")
    assert backend._gpu_entry("auto", 0, 7).startswith("L|")
    monkeypatch.setenv("CUDA_MODULE_LOADING", "EAGER")
    assert backend._gpu_entry("auto", 0, 7).startswith("U|")
    assert backend._gpu_entry("1", 0, 7).startswith("R|")
    monkeypatch.setenv("ACCORD_GPU_PRIVATE_CONTEXT", "1")
    assert backend._gpu_entry("auto", 0, 7).startswith("U|"), "a private context alone still copies cudaMalloc memory"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64, expandable_segments:True")
    entry = backend._gpu_entry("auto", 0, 7)
    assert entry.startswith("E|") and entry.endswith(f"|{os.getpid()}:7|{host}"), entry

    # The setting's words; a word it does not know fails at the group's first CUDA op.
    for word, choice in {"": "auto", "auto": "auto", "1": "1", "experimental": "1", "On": "1", "0": "0", "off": "0"}.items():
        monkeypatch.setenv("ACCORD_TORCH_GPU", word)
        assert backend._gpu_choice() == choice, word
    monkeypatch.delenv("ACCORD_TORCH_GPU")
    assert backend._gpu_choice() == "auto"


def test_ranks_that_may_not_take_their_peers_descriptors_stage() -> None:
    """VMM memory is shared as file descriptors that peers take with pidfd_getfd (ptrace
    permission over the owner). Before choosing the GPU path every rank tries its peers' probe
    descriptors; one that fails stages the whole group and the warning names it and why."""
    import accord.torch as backend

    host = backend._host_identity()
    read_end, write_end = os.pipe()
    try:
        mine = f"E|gpu-a|{os.getpid()}:{read_end}|{host}"
        # A descriptor this process may take (its own), from a peer at rank 1.
        assert backend._descriptor_problem([f"E|gpu-b|1:1|{host}", mine], 0) is None
        # Peers staging or sharing no descriptors are not tried (their fields may be anything).
        assert backend._descriptor_problem([mine, f"R|gpu-b|1:99999|{host}", f"0|-|-|{host}"], 0) is None
        # A descriptor that cannot be open in its process (at its descriptor limit): an error
        # naming the rank and the pid.
        import resource

        never_open = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        problem = backend._descriptor_problem([mine, f"E|gpu-b|{os.getpid()}:{never_open}|{host}"], 0)
        assert problem is not None and problem.startswith("rank 1:") and str(os.getpid()) in problem, problem
        # An entry that names no process and descriptor.
        problem = backend._descriptor_problem([mine, f"E|gpu-b|twelve|{host}"], 0)
        assert problem is not None and problem.startswith("rank 1:") and "twelve" in problem, problem
        # A process that does not exist.
        problem = backend._descriptor_problem([mine, f"E|gpu-b|{2**22 + 7}:3|{host}"], 0)
        assert problem is not None and problem.startswith("rank 1:"), problem
    finally:
        os.close(read_end)
        os.close(write_end)
    assert backend._descriptor_verdict(["", ""]) == (True, None)
    use, warning = backend._descriptor_verdict(["", "rank 0: refused"])
    assert use is False and warning is not None
    assert "rank(s) [1]" in warning and "rank 0: refused" in warning and "ptrace_scope" in warning, warning


def test_one_rank_refused_its_peers_descriptors_stages_every_rank() -> None:
    first, second = accord.run(torch_roles.gpu_choice_refused_by_one_rank, 2, timeout=90)
    assert first[0] is False and second[0] is False, (first, second)
    assert second[1] == [], "only rank 0 warns"
    assert len(first[1]) == 1 and "rank(s) [1]" in first[1][0] and "refused (a test)" in first[1][0], first[1]


def test_sibling_ranks_take_each_others_descriptors_here() -> None:
    """Two ranks started by one launcher (siblings) on this machine: each takes the other's probe
    descriptor, as the GPU path's VMM sharing will (root, or Yama's scope 0, allows it; a host
    that refuses would stage, see the test above)."""
    assert accord.run(torch_roles.take_peer_descriptor, 2, timeout=60) == [None, None]


def test_the_first_cuda_op_decides_through_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_start_gpu`` on one rank with a c10d HashStore as the group's store: it stages when asked,
    fails on a word it does not know, and warns when lazy loading keeps the group staged."""
    import datetime

    import torch.distributed as dist

    import accord.torch as backend

    def group() -> backend.AccordProcessGroup:
        return backend.AccordProcessGroup(dist.HashStore(), 0, 1, datetime.timedelta(seconds=10))

    cuda0 = torch.device("cuda", 0)
    monkeypatch.setenv("ACCORD_TORCH_GPU", "0")
    pg = group()
    try:
        assert pg._start_gpu(cuda0) is False, "staged when asked"
    finally:
        pg.shutdown()
    monkeypatch.setenv("ACCORD_TORCH_GPU", "yes please")
    pg = group()
    try:
        with pytest.raises(backend.BackendError, match="ACCORD_TORCH_GPU"):
            pg._start_gpu(cuda0)
    finally:
        pg.shutdown()
    monkeypatch.delenv("ACCORD_TORCH_GPU")
    monkeypatch.setenv("CUDA_MODULE_LOADING", "LAZY")
    pg = group()
    try:
        with pytest.warns(UserWarning, match="lazily"):
            assert pg._start_gpu(cuda0) is False, "lazy module loading keeps the group staged"
    finally:
        pg.shutdown()
