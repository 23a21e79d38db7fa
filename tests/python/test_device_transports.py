"""scripts/device/transports.sh: the environment each named NCCL transport means in the device
scripts, and the NAME+VAR=value form for one-off sweeps. A word that is not VAR=value must make
the name unknown: it would otherwise become the program `env` runs in front of the benchmark."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device" / "transports.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def transport_env(name: str, plugin_dir: str = "/plugins") -> list[str]:
    out = subprocess.run(
        ["bash", "-c", 'source "$0" && transport_env "$1" "$2"', str(SCRIPT), name, plugin_dir],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return out.stdout.split()


def test_named_transports_give_their_environment() -> None:
    socket = transport_env("socket")
    assert "NCCL_NET=Socket" in socket and "NCCL_P2P_DISABLE=1" in socket
    accord = transport_env("accord")
    assert "NCCL_NET=Accord" in accord
    assert "NCCL_NET_PLUGIN=/plugins/libnccl-net-accord.so" in accord
    assert transport_env("nvlink") == []
    assert transport_env("no_such_transport") == ["UNKNOWN"]


def test_extra_settings_follow_a_plus() -> None:
    words = transport_env("accord+NCCL_BUFFSIZE=1048576+ACCORD_TUNER=0")
    assert words[: len(transport_env("accord"))] == transport_env("accord")
    assert words[-2:] == ["NCCL_BUFFSIZE=1048576", "ACCORD_TUNER=0"]
    assert transport_env("socket+NCCL_SOCKET_NTHREADS=2")[-1] == "NCCL_SOCKET_NTHREADS=2"


@pytest.mark.parametrize("name", ["accord+foo", "accord+A=1+rm", "accord+X=a/b", "accord+=1", "nope+A=1"])
def test_a_word_that_is_not_an_assignment_makes_the_name_unknown(name: str) -> None:
    assert transport_env(name) == ["UNKNOWN"]
