"""scripts/device/nvshmem_anchor.sh (issue 19's NVSHMEM anchor) on a machine without GPUs: it says
plainly why NVSHMEM is not available and exits 0, finds NVSHMEM through Python's site-packages,
builds the command the GPU host runs (checked in --dry-run, which builds and runs nothing), refuses
bad arguments, and copies itself with its source into a self-contained folder to carry. Where
nvcc and NVSHMEM are both present, the program itself is compiled (--compile-only)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device" / "nvshmem_anchor.sh"
SOURCE = ROOT / "examples" / "anchors" / "nvshmem_putsignal.cu"

NVSHMEM_FILES = [
    "include/nvshmem.h",
    "include/nvshmemx.h",
    "lib/libnvshmem_device.a",
    "lib/libnvshmem_host.so.3",
    "lib/nvshmem_bootstrap_uid.so.3",
]


def fake_nvshmem(root: Path, leave_out: str = "") -> Path:
    """A folder laid out like the nvidia-nvshmem wheel's nvidia/nvshmem (empty files)."""
    home = root / "nvidia" / "nvshmem"
    for name in NVSHMEM_FILES:
        if name != leave_out:
            (home / name).parent.mkdir(parents=True, exist_ok=True)
            (home / name).write_text("")
    return home


def fake_nvcc(root: Path) -> Path:
    """An executable that stands for nvcc: --dry-run never runs it, so it fails if run."""
    nvcc = root / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True, exist_ok=True)
    nvcc.write_text("#!/bin/sh\necho 'fake nvcc must not run' >&2\nexit 1\n")
    nvcc.chmod(0o755)
    return nvcc


def run(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in ("NVSHMEM_HOME", "NVCC", "CUDA_HOME")}
    environment.update(env)
    return subprocess.run(
        ["bash", str(script), *args], capture_output=True, text=True, timeout=120, env=environment
    )


def test_an_absent_library_is_not_available_and_exits_zero(tmp_path: Path) -> None:
    build = tmp_path / "build"
    r = run(SCRIPT, NVSHMEM_HOME=str(tmp_path / "empty"), BUILD_DIR=str(build))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("NVSHMEM not available: ")
    assert "include/nvshmem.h" in r.stdout
    assert not build.exists(), "nothing is built when NVSHMEM is absent"


@pytest.mark.parametrize(
    "missing", ["lib/libnvshmem_device.a", "lib/libnvshmem_host.so.3", "lib/nvshmem_bootstrap_uid.so.3"]
)
def test_each_missing_piece_is_named(tmp_path: Path, missing: str) -> None:
    home = fake_nvshmem(tmp_path, leave_out=missing)
    r = run(SCRIPT, "--dry-run", NVSHMEM_HOME=str(home), NVCC=str(fake_nvcc(tmp_path)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "NVSHMEM not available: " in r.stdout
    assert Path(missing).name in r.stdout
    assert "build:" not in r.stdout


def test_a_python_without_nvshmem_is_reported_with_its_reason(tmp_path: Path) -> None:
    python = tmp_path / "python-without-nvshmem"
    python.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'nvidia'\" >&2\nexit 1\n")
    python.chmod(0o755)
    r = run(SCRIPT, PYTHON=str(python))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("NVSHMEM not available: ")
    assert "No module named 'nvidia'" in r.stdout


def test_dry_run_finds_nvshmem_in_site_packages_and_prints_the_device_command(tmp_path: Path) -> None:
    home = fake_nvshmem(tmp_path / "site")
    nvcc = fake_nvcc(tmp_path)
    build = tmp_path / "build"
    env = {"PYTHON": sys.executable, "PYTHONPATH": str(tmp_path / "site"), "NVCC": str(nvcc),
           "BUILD_DIR": str(build), "ARCH": "sm_90"}
    r = run(SCRIPT, "--dry-run", **env)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = {line.split(":", 1)[0]: line for line in r.stdout.splitlines() if ":" in line}
    assert f"at {home.resolve()}" in r.stdout
    build_line, run_line = lines["build"], lines["run (each PE under timeout -k 5 60)"]
    for part in ["-rdc=true", "-arch=sm_90", f"{home.resolve()}/lib/libnvshmem_device.a",
                 f"{home.resolve()}/lib/libnvshmem_host.so.3", f"-rpath,{home.resolve()}/lib", str(SOURCE)]:
        assert part in build_line, part
    for part in ["NVSHMEM_DISABLE_NVLS=1", "NCCL_NVLS_ENABLE=0", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1",
                 "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=lo", "NVSHMEM_SYMMETRIC_SIZE=768M",
                 f"NVSHMEM_BOOTSTRAP_UID_PLUGIN={home.resolve()}/lib/nvshmem_bootstrap_uid.so.3",
                 "--iters 1000", "--sizes-mib 1,4,16,64,256", "--timeout-s 55 --step-timeout-s 30"]:
        assert part in run_line, part
    assert not build.exists(), "--dry-run builds nothing"


def test_no_nvcc_says_so_and_exits_zero(tmp_path: Path) -> None:
    home = fake_nvshmem(tmp_path)
    r = run(SCRIPT, NVSHMEM_HOME=str(home), NVCC=str(tmp_path / "no-such-nvcc"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "NVSHMEM anchor not run: NVCC=" in r.stdout


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--bogus"], {}, "unknown argument '--bogus'"),
        (["--carry"], {}, "--carry needs a folder"),
        (["--dry-run"], {"LIMIT_S": "ten"}, "LIMIT_S must be whole seconds"),
        (["--dry-run"], {"LIMIT_S": "5"}, "LIMIT_S must be at least 20"),
        (["--dry-run"], {"BUDGET_S": "-1"}, "BUDGET_S must be whole seconds"),
        (["--dry-run"], {"SIZES_MIB": "1,x"}, "SIZES_MIB must be whole MiB"),
    ],
)
def test_bad_arguments_are_refused_with_a_reason(
    tmp_path: Path, args: list[str], env: dict[str, str], says: str
) -> None:
    home = fake_nvshmem(tmp_path)
    r = run(SCRIPT, *args, NVSHMEM_HOME=str(home), NVCC=str(fake_nvcc(tmp_path)), **env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert says in r.stdout


def test_carry_makes_a_folder_that_runs_on_its_own(tmp_path: Path) -> None:
    folder = tmp_path / "carry"
    r = run(SCRIPT, "--carry", str(folder))
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["nvshmem_anchor.sh", "nvshmem_putsignal.cu"]
    assert (folder / "nvshmem_putsignal.cu").read_bytes() == SOURCE.read_bytes()
    home = fake_nvshmem(tmp_path)
    carried = run(folder / "nvshmem_anchor.sh", "--dry-run", NVSHMEM_HOME=str(home), NVCC=str(fake_nvcc(tmp_path)))
    assert carried.returncode == 0, carried.stdout + carried.stderr
    assert str((folder / "nvshmem_putsignal.cu").resolve()) in carried.stdout, "the carried copy builds its own source"


def real_nvshmem_home() -> str | None:
    probe = subprocess.run(
        [sys.executable, "-c", "import nvidia.nvshmem as m; print(list(m.__path__)[0])"],
        capture_output=True, text=True, timeout=60,
    )
    home = probe.stdout.strip()
    return home if probe.returncode == 0 and (Path(home) / "include" / "nvshmem.h").is_file() else None


def test_the_program_compiles_where_nvcc_and_nvshmem_are_present(tmp_path: Path) -> None:
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    home = real_nvshmem_home()
    if not nvcc or not home:
        pytest.skip(f"needs nvcc (NVCC or PATH: {nvcc}) and an importable nvidia.nvshmem with headers ({home})")
    build = tmp_path / "build"
    r = run(SCRIPT, "--compile-only", NVSHMEM_HOME=home, NVCC=nvcc, BUILD_DIR=str(build), ARCH="sm_90")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (build / "nvshmem_putsignal").is_file()


# The run path, with stand-ins for nvidia-smi (two GPUs), nvcc (it "builds" by copying a shell
# script) and the program (the shell script, which behaves as the case needs). What is checked is
# the script's own work: both PEs started with the safety environment, rows collected, a failure
# before any row retried once without VMM, a failure reported, a hung PE cut by its bound.
PROGRAMS = {
    "passes": """
case " $* " in *" --pe 0 "*) pe=0 ;; *) pe=1 ;; esac
[ "$NVSHMEM_DISABLE_NVLS" = 1 ] && [ "$NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME" = lo ] || { echo "unsafe env" >&2; exit 9; }
echo "# PE$pe table"
[ $pe = 0 ] && echo '{"bench":"device_pingpong","route":"nvshmem","ok":true}'
exit 0
""",
    "needs_no_vmm": """
[ "${NVSHMEM_DISABLE_CUDA_VMM:-0}" = 1 ] || { echo "init failed with VMM" >&2; exit 5; }
case " $* " in *" --pe 0 "*) echo '{"bench":"device_put_bandwidth","route":"nvshmem","ok":true}' ;; esac
exit 0
""",
    "wrong_bytes": """
case " $* " in *" --pe 0 "*) echo '{"bench":"device_pingpong","route":"nvshmem","wrong_bytes":3,"ok":false}'; exit 1 ;; esac
exit 0
""",
    "pe1_hangs": """
case " $* " in *" --pe 0 "*) echo '{"bench":"device_pingpong","route":"nvshmem","ok":true}'; exit 0 ;; esac
exec sleep 287
""",
}


def stand_ins(tmp_path: Path, program: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\ncase "$1" in -L) echo "GPU 0: fake"; echo "GPU 1: fake" ;; *) echo 9.0 ;; esac\n')
    fake = tmp_path / "program.sh"
    fake.write_text("#!/bin/sh\n" + PROGRAMS[program])
    nvcc = bin_dir / "nvcc"
    nvcc.write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done\n'
                    f'cp "{fake}" "$out" && chmod +x "$out"\n')
    for f in (smi, fake, nvcc):
        f.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "NVCC": str(nvcc),
            "NVSHMEM_HOME": str(fake_nvshmem(tmp_path)), "OUT": str(tmp_path / "out")}


def test_a_passing_run_collects_pe0s_rows(tmp_path: Path) -> None:
    r = run(SCRIPT, **stand_ins(tmp_path, "passes"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PE0 exit 0, PE1 exit 0" in r.stdout and "# PE1 table" in r.stdout
    assert (tmp_path / "out" / "nvshmem.jsonl").read_text().count('"route":"nvshmem"') == 1


def test_a_failure_before_any_row_is_retried_once_without_vmm(tmp_path: Path) -> None:
    r = run(SCRIPT, **stand_ins(tmp_path, "needs_no_vmm"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no row came back" in r.stdout and "init failed with VMM" in r.stdout
    assert "== no-vmm: 2 PEs" in r.stdout and "with NVSHMEM_DISABLE_CUDA_VMM=1" in r.stdout
    assert (tmp_path / "out" / "pe0-vmm.txt").exists()
    assert "device_put_bandwidth" in (tmp_path / "out" / "nvshmem.jsonl").read_text()


def test_wrong_bytes_fail_the_command_without_a_retry(tmp_path: Path) -> None:
    r = run(SCRIPT, **stand_ins(tmp_path, "wrong_bytes"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "nvshmem_anchor: FAILED" in r.stdout and "no-vmm" not in r.stdout
    assert '"wrong_bytes":3' in (tmp_path / "out" / "nvshmem.jsonl").read_text()


def test_a_hung_pe_is_cut_by_its_bound_and_named(tmp_path: Path) -> None:
    env = stand_ins(tmp_path, "pe1_hangs")
    r = run(SCRIPT, LIMIT_S="20", BUDGET_S="30", **env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "PE0 exit 0, PE1 exit 124" in r.stdout and "cut by timeout" in r.stdout
    left = subprocess.run(["pgrep", "-f", "sleep 287"], capture_output=True, text=True, timeout=10)
    assert left.stdout == "", f"processes left behind: {left.stdout}"


def test_a_failed_build_fails_the_command_and_shows_nvcc_output(tmp_path: Path) -> None:
    env = stand_ins(tmp_path, "passes")
    (tmp_path / "bin" / "nvcc").write_text("#!/bin/sh\necho 'error: no such header' >&2\nexit 2\n")
    r = run(SCRIPT, **env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "error: no such header" in r.stdout and "nvcc could not build" in r.stdout and "(exit 2;" in r.stdout
    assert "== default" not in r.stdout, "nothing runs after a failed build"


ACCORD_ROWS: list[dict[str, object]] = [
    {"bench": "device_pingpong", "route": "ipc", "mode": "put", "bytes": 8, "rtt_p99_us": 30.0,
     "one_way_us": 13.07, "ok": True},
    {"bench": "device_pingpong", "route": "ipc", "mode": "put_direct", "skipped": "no peer mapped"},
    {"bench": "device_put_bandwidth", "route": "ipc", "bytes": 1048576, "put_gbps": 113.5,
     "put_vs_ceiling": 0.583, "copy_sms": 0},
]
NVSHMEM_ROWS: list[dict[str, object]] = [
    {"bench": "device_pingpong", "route": "nvshmem", "mode": "nvshmem_putmem_signal_nbi", "bytes": 8,
     "rtt_p99_us": 6.5, "one_way_us": 2.75, "ok": True},
    {"bench": "device_put_bandwidth", "route": "nvshmem", "bytes": 1048576, "put_gbps": 42.25,
     "put_vs_ceiling": 0.217, "copy_sms": 1},
    {"bench": "device_put_bandwidth", "route": "nvshmem", "bytes": 4194304, "put_gbps": 50.0,
     "put_vs_ceiling": None, "copy_sms": 1},
]


def write_rows(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not a row\n")
    return path


def test_beside_prints_accords_and_nvshmems_rows_matched_by_size(tmp_path: Path) -> None:
    accord = write_rows(tmp_path / "ipc.jsonl", ACCORD_ROWS)
    nvshmem = write_rows(tmp_path / "nvshmem.jsonl", NVSHMEM_ROWS)
    r = run(SCRIPT, "--beside", str(accord), str(nvshmem))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [line.split() for line in r.stdout.splitlines() if not line.startswith("#")]
    assert ["accord", "put", "8", "13.07", "30.00", "True"] in lines
    assert ["nvshmem", "nvshmem_putmem_signal_nbi", "8", "2.75", "6.50", "True"] in lines
    assert ["1048576", "113.5", "0.583", "42.2", "0.217", "1"] in lines, "one row per size, both libraries"
    assert ["4194304", "-", "-", "50.0", "-", "1"] in lines, "a size only one side ran shows '-'"
    assert not any("put_direct" in line for line in lines), "skipped rows are left out"


def test_beside_after_a_run_and_an_unreadable_file_is_said(tmp_path: Path) -> None:
    r = run(SCRIPT, BESIDE=str(tmp_path / "missing.jsonl"), **stand_ins(tmp_path, "passes"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "######## beside Accord" in r.stdout and "cannot read" in r.stdout
