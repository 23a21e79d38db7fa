"""scripts/device/nccl_env_variants.sh (issue 21) on a machine without GPUs, against stand-ins: an
`all_reduce_perf` that prints nccl-tests' row shape and the environment it got, an MPICH "wheel"
whose mpiexec runs the command once per rank, and an NCCL folder in Python's path. Checked: each
variant's environment reaches the ranks over its transport's, rows come out per round with busbw
and #wrong, malformed variants and unknown transports are skipped with a word, and the caller's
LD_LIBRARY_PATH is kept."""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device" / "nccl_env_variants.sh"

FAKE_PERF = """#!/bin/sh
# Rank 0 reports, as nccl-tests does; every rank runs.
[ "${PMI_RANK:-0}" = 0 ] || exit 0
echo "# env NCCL_NET=${NCCL_NET:-} WORKERS=${ACCORD_WORKERS_PER_NIC:-} LD=${LD_LIBRARY_PATH:-}"
echo "     1048576        262144     float     sum      -1    100.0   10.49   10.49      0    100.0   10.49   10.49      0"
echo "   268435456      67108864     float     sum      -1  15000.0   17.90   17.90      0  15000.0   17.90   17.90      0"
"""

FAKE_MPIEXEC = """#!/bin/sh
# mpiexec -launcher fork -n N CMD ARGS...: CMD once per rank, PMI_RANK set.
shift 2
n=$2
shift 2
i=0
while [ "$i" -lt "$n" ]; do PMI_RANK=$i "$@" || exit $?; i=$((i + 1)); done
"""


def stand_ins(root: Path) -> dict[str, str]:
    build = root / "build" / "mpi"
    build.mkdir(parents=True)
    perf = build / "all_reduce_perf"
    perf.write_text(FAKE_PERF)
    perf.chmod(0o755)
    wheel = root / "mpich-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        info = zipfile.ZipInfo("mpich-0.data/data/bin/mpiexec")
        info.external_attr = 0o755 << 16
        z.writestr(info, FAKE_MPIEXEC)
        z.writestr("mpich-0.data/data/lib/.keep", "")
    site = root / "site"
    for name in ("nvidia/nccl/lib/libnccl.so.2", "nvidia/nccl/include/nccl.h"):
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text("")
    plugin = root / "libnccl-net-accord.so"
    plugin.write_text("")
    return {
        "NCCL_TESTS_BUILD": str(root / "build"),
        "MPICH_WHEEL": str(wheel),
        "ACCORD_NCCL_PLUGIN": str(plugin),
        "PYTHONPATH": str(site),
        "LD_LIBRARY_PATH": "/callers/own/lib",
    }


def run(out: Path, env: dict[str, str], **extra: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **env, **extra}
    return subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, timeout=120, env=environment)


def test_variants_run_round_by_round_with_their_environment(tmp_path: Path) -> None:
    env = stand_ins(tmp_path)
    variants = "socket socket;bad;odd nosuch;w8 accord ACCORD_WORKERS_PER_NIC=8"
    r = run(tmp_path / "out", env, VARIANTS=variants, ROUNDS="2")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    rows = [line for line in lines if " round " in line]
    assert [row.split()[0:3] for row in rows] == [
        ["socket", "round", "1"],
        ["w8", "round", "1"],
        ["socket", "round", "2"],
        ["w8", "round", "2"],
    ], r.stdout
    for row in rows:
        assert "rc=0" in row and "1M:10.49(wrong 0)" in row and "256M:17.90(wrong 0)" in row, row
    assert lines.count('variant "bad": give NAME TRANSPORT [VAR=value ...]') == 2, r.stdout
    assert lines.count("odd: unknown transport nosuch") == 2, r.stdout
    w8 = (tmp_path / "out" / "w8_r1.log").read_text()
    assert "NCCL_NET=Accord WORKERS=8" in w8, w8
    assert "/callers/own/lib" in w8, "the caller's LD_LIBRARY_PATH is kept"
    socket = (tmp_path / "out" / "socket_r2.log").read_text()
    assert "NCCL_NET=Socket WORKERS= " in socket, socket


def test_without_the_mpich_wheel_it_says_so(tmp_path: Path) -> None:
    env = stand_ins(tmp_path)
    env.pop("MPICH_WHEEL")
    r = run(tmp_path / "out", env, MPICH_WHEEL="")
    assert r.returncode != 0
    assert "MPICH_WHEEL" in r.stdout + r.stderr
