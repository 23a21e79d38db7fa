"""The examples run to completion and verify their own data; the overhead bench prints its
table (no timing is asserted: tests never assert on timing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import accord._bench

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("script", "args", "says"),
    [
        ("kv_cache_transfer.py", ["--requests", "3", "--layers", "4"], "all pages verified"),
        ("weight_push.py", ["--rounds", "2"], "every round verified"),
        ("kv_read.py", ["--requests", "2", "--layers", "3", "--compare"], "all blocks verified"),
    ],
)
def test_example_runs_and_verifies(script: str, args: list[str], says: str) -> None:
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, f"{script} failed:\n{run.stdout}\n{run.stderr}"
    assert says in run.stdout


def test_overhead_bench_prints_its_table(capsys: pytest.CaptureFixture[str]) -> None:
    rows = accord._bench.main(["--iterations", "200", "--network-iterations", "50", "--repeats", "1"])
    out = capsys.readouterr().out
    assert [r.route for r in rows] == ["memcpy", "network"]
    assert "added" in out and "memcpy" in out and "network" in out
    assert all(r.rust_us > 0 and r.python_us > 0 for r in rows)


def test_kv_gpu_bench_says_what_it_needs_and_prints_tables(tmp_path: Path) -> None:
    bench = EXAMPLES / "kv_gpu_bench.py"
    row = {
        "case": "inproc", "op": "read", "blocks": 128, "bytes": 671088640, "first_ms": 90.0, "ms": [80.0],
        "median_ms": 80.0, "gbps": 8.39, "ceiling_gbps": 300.0, "ratio": 0.028, "checked": True, "error": "",
    }
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(row) + "\n" + json.dumps({**row, "op": "write", "checked": False}) + "\n")
    table = subprocess.run([sys.executable, str(bench), "--table", str(rows)], capture_output=True, text=True,
                           timeout=60)
    assert table.returncode == 1, "a row whose bytes were wrong fails the table"
    assert "bytes ok" in table.stdout and "BYTES WRONG" in table.stdout and "0.028" in table.stdout
    try:
        import torch

        has_cuda = bool(torch.cuda.is_available())
    except ImportError:
        has_cuda = False
    if not has_cuda:
        run = subprocess.run([sys.executable, str(bench), "--case", "inproc"], capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 2 and "kv_gpu_bench: needs" in run.stderr


def _example(name: str) -> Any:
    """examples/<name>.py as a module (a script, not a package member), its folder on the path
    first, as when it runs as a script (the benches import gpu_bench from there)."""
    import importlib.util

    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_kv_gpu_bench_rows_name_their_copy_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _example("kv_gpu_bench")
    monkeypatch.setenv("ACCORD_DEVICE_COPY_STREAMS", "4")
    monkeypatch.setenv("ACCORD_DEVICE_COPY_BATCH_2D", "1")
    row = bench.row("ipc", "write", 2, 0.01, [0.002], 300.0, True, "", {})
    assert row["shape"] == "4/1" and row["parts"] == 2 * 160 and row["checked"]
    monkeypatch.delenv("ACCORD_DEVICE_COPY_STREAMS")
    assert bench.row("ipc", "read", 2, None, [], 300.0, None, "x", {})["shape"] == "-/1"
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(row) + "\n")
    table = subprocess.run([sys.executable, str(EXAMPLES / "kv_gpu_bench.py"), "--table", str(rows)],
                           capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and " 4/1 " in table.stdout, table.stdout


def test_kv_nixl_bench_moves_kv_gpu_bench_requests_piece_by_piece_and_says_what_it_needs() -> None:
    """The NIXL anchor asks for the same blocks as accord's bench, its piece indices address the
    pieces accord.kv's layout puts there, its host cache checks bytes both ways, and without NIXL
    it exits 2 saying so."""
    from accord.kv import KvLayout

    nixl = _example("kv_nixl_bench")
    kv = _example("kv_gpu_bench")
    for n in (128, 2048):
        assert nixl.block_ids(2560, n, seed=n) == kv.block_ids(2560, n, seed=n)
    layout = KvLayout(80, 16, 8, 128, dtype="bfloat16")
    assert nixl.PAGE == layout.block_nbytes and nixl.PLANES == 160
    pool, blocks = 10, [3, 7]
    idx = nixl.indices(pool, blocks)
    assert len(idx) == 2 * 160
    for i, (layer, kv_half, block) in enumerate((lay, h, b) for b in blocks for lay in range(80) for h in range(2)):
        assert int(idx[i]) * nixl.PAGE == layout.offset(pool, layer, kv_half, block), (layer, kv_half, block)
    prefill, decode = nixl.Cache("cpu", 3, filled=True), nixl.Cache("cpu", 3, filled=False)
    assert not decode.holds([0, 2], [1, 0]), "a zeroed cache holds nothing"
    for plane in range(nixl.PLANES):  # what a transfer of blocks 0, 2 into 1, 0 would do
        for s, d in ((0, 1), (2, 0)):
            at, to = (plane * 3 + s) * nixl.PAGE, (plane * 3 + d) * nixl.PAGE
            decode.host[to:to + nixl.PAGE] = prefill.host[at:at + nixl.PAGE]
    assert decode.holds([0, 2], [1, 0]) and not decode.holds([2, 0], [1, 0])
    pieces = prefill.pieces()
    assert pieces.shape == (160 * 3, 3) and int(pieces[5, 0]) == prefill.addr + 5 * nixl.PAGE
    try:
        import nixl as _  # noqa: F401
        return
    except ImportError:
        pass
    run = subprocess.run([sys.executable, str(EXAMPLES / "kv_nixl_bench.py"), "--device", "cpu", "--pool", "2",
                          "--blocks", "1"], capture_output=True, text=True, timeout=60)
    if "NIXL is not importable" in run.stderr:
        assert run.returncode == 2
    else:
        assert run.returncode == 0 and "bytes ok" in run.stdout, run.stdout + run.stderr


def test_kv_mooncake_bench_addresses_the_nixl_pieces_and_names_the_transport_its_engine_installed() -> None:
    """The Mooncake anchor's piece addresses are the NIXL bench's pieces (the same block ids
    and layout), block by block; the transport names come from the engine's own log lines, and
    each attempt asks for its transport through the environment."""
    mc = _example("kv_mooncake_bench")
    nixl = _example("kv_nixl_bench")
    pool, blocks = 10, [3, 7]
    addrs = mc.piece_addresses(1 << 20, pool, blocks)
    assert addrs.dtype.itemsize == 8 and len(addrs) == 2 * 160
    assert [int(a) for a in addrs] == [(1 << 20) + int(i) * nixl.PAGE for i in nixl.indices(pool, blocks)]
    log = ("I1126 transfer_engine_impl.cpp:488] Using TCP transport (no HCA detected)\n"
           "I1126 x.cpp:1] Using Intra-Node NVLink transport (MC_INTRANODE_NVLINK set)\n"
           "W1126 y.cpp:2] MC_FORCE_TCP is set, using TCP transport only\n")
    assert mc.installed_transports(log) == ["tcp", "nvlink_intra"]
    assert mc.installed_transports("Topology discovery complete. Found 0 HCAs.") == []
    assert mc.protocol_env("nvlink_intra")["MC_INTRANODE_NVLINK"] == "1"
    assert mc.protocol_env("tcp") == {"MC_FORCE_TCP": "1"} and mc.protocol_env("other") == {}
    row = mc.row("tcp", "read", 2, 0.01, [0.02, 0.04], 300.0, True, "")
    assert (row["case"], row["shape"], row["parts"], row["median_ms"]) == ("mooncake", "tcp", 320, 30.0)


def test_kv_mooncake_bench_moves_and_checks_bytes_over_tcp_on_host_memory(tmp_path: Path) -> None:
    """Two processes, two Mooncake engines (P2PHANDSHAKE, TCP on loopback) move the requests'
    blocks WRITE and READ between host caches and the bytes check passes; an attempt whose
    transport does not come up (the NVLink one on host memory) is reported, not fatal. Skipped
    where Mooncake's engine cannot be imported (the wheel needs libcudart.so.13, libibverbs)."""
    try:
        import mooncake.engine as _  # noqa: F401
    except ImportError as e:
        pytest.skip(f"mooncake.engine is not importable: {e}")
    rows = tmp_path / "rows.jsonl"
    run = subprocess.run([sys.executable, str(EXAMPLES / "kv_mooncake_bench.py"), "--device", "cpu", "--pool", "4",
                          "--blocks", "1,3", "--iters", "1", "--protocols", "nvlink_intra,tcp", "--json", str(rows)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    got = [json.loads(line) for line in rows.read_text().splitlines()]
    assert [(r["op"], r["blocks"]) for r in got] == [("write", 1), ("write", 3), ("read", 1), ("read", 3)]
    shapes = {r["shape"] for r in got}
    assert all(r["case"] == "mooncake" and r["checked"] is True for r in got) and len(shapes) == 1, got
    if shapes == {"tcp"}:  # the NVLink transport refused host memory (it does here): reported, then TCP
        assert "nvlink_intra did not work" in run.stderr


def _weight_bench() -> Any:
    """examples/weight_push_gpu_bench.py as a module (it is a script, not a package member). Its
    folder goes on the path first, as when it runs as a script: it imports gpu_bench from there."""
    import importlib.util

    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location("weight_push_gpu_bench", EXAMPLES / "weight_push_gpu_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def test_weight_push_gpu_bench_shard_list_is_a_70b_like_shard_scaled_to_the_asked_size() -> None:
    bench = _weight_bench()
    full = bench.full_shard()
    assert len(full) == 723 and len({t.name for t in full}) == 723
    assert 17e9 < sum(t.nbytes for t in full) < 18e9, "a TP-8 shard of a 70B model is about 17.6 GB"
    for gb in (16.0, 1.0, 0.05):
        tensors = bench.shard_list(gb)
        total = sum(t.nbytes for t in tensors)
        assert len(tensors) == 723, "scaling keeps every tensor"
        assert abs(total - gb * 1e9) < 0.01 * gb * 1e9 + 723 * 8192 * 2, (gb, total)
        assert all(t.numel > 0 for t in tensors)
        assert [t.name for t in tensors] == [t.name for t in full]
    sizes = sorted(t.nbytes for t in bench.shard_list(16.0))
    assert sizes[0] == 8192 * 2 and sizes[-1] > 200e6, "norms of 16 KiB up to the embedding's hundreds of MB"
    # The smallest scale still gives every matrix a row; nothing positive is refused.
    assert all(t.shape[0] == 1 for t in bench.shard_list(1e-9) if len(t.shape) == 2)
    with pytest.raises(ValueError, match="positive"):
        bench.shard_list(0)


def test_weight_push_gpu_bench_checks_its_arguments_and_skips_without_cuda(tmp_path: Path) -> None:
    bench = _weight_bench()
    args = bench.parse(["--gb", "0.5", "--iters", "2", "--no-nccl"])
    assert (args.gb, args.iters, args.no_nccl, args.case) == (0.5, 2, True, "ipc")
    for bad in (["--gb", "0"], ["--gb", "-1"], ["--iters", "0"], ["--case", "rdma"]):
        with pytest.raises(SystemExit) as e:
            bench.parse(bad)
        assert e.value.code == 2, bad
    row = bench.result_row("ipc", 723, 16_000_000_000, 0.040, [0.044, 0.046], [0.080, 0.082], {}, "")
    assert row["accord_median_ms"] == 45.0 and row["nccl_median_ms"] == 81.0 and row["checked"]
    assert row["over_ceiling"] == 1.125 and row["nccl_over_accord"] == 1.8
    bad_row = bench.result_row("ipc", 723, 1000, 0.001, [0.002], [], {"accord v2": [5]}, "")
    assert not bad_row["checked"] and bad_row["nccl_over_accord"] is None
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(row) + "\n" + json.dumps(bad_row) + "\n")
    table = subprocess.run([sys.executable, str(EXAMPLES / "weight_push_gpu_bench.py"), "--table", str(rows)],
                           capture_output=True, text=True, timeout=60)
    assert table.returncode == 1, "a row whose bytes were wrong fails the table"
    assert "bytes ok" in table.stdout and "BYTES WRONG" in table.stdout and "1.125" in table.stdout
    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        gpus = 0
    if gpus < 2:
        run = subprocess.run([sys.executable, str(EXAMPLES / "weight_push_gpu_bench.py"), "--gb", "0.01"],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and "skipped: weight_push_gpu_bench needs" in run.stderr, run.stderr


def test_the_examples_finish_kills_a_stuck_process_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    """examples/_processes.py's `finish`: a process still running after the wait is killed (the
    interpreter would otherwise wait for it at exit) and the run fails; clean runs pass."""
    import multiprocessing as mp
    import time

    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    from _processes import finish

    ctx = mp.get_context("spawn")
    stuck = ctx.Process(target=time.sleep, args=(60,))
    stuck.start()
    assert finish([stuck], 0, 0.5, "summary", "mismatched pages", "all verified") == 1
    assert not stuck.is_alive()
    out = capsys.readouterr()
    assert "summary" in out.out and "all verified" not in out.out
    assert "FAILED: 0 mismatched pages, exit codes [-9]" in out.err
    done = ctx.Process(target=time.sleep, args=(0,))
    done.start()
    assert finish([done], 0, 30.0, "summary", "mismatched pages", "all verified") == 0
    assert "all verified" in capsys.readouterr().out
    assert finish([], 3, 1.0, "summary", "mismatched pages", "all verified") == 1, "reported mismatches fail"
