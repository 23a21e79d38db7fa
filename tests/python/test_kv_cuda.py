"""accord.kv on CUDA tensors (bf16 caches): pull by READ and push by paged WRITE between two
engines of one process (copy engine; and over the network stack, staged and landed) and between
two processes (through CUDA IPC; and with IPC off: staged and landed). Skips without torch or a
CUDA device."""

from __future__ import annotations

from typing import Any

import pytest

import accord
import cuda_roles
from accord.kv import DecodeCache, KvLayout, PrefillCache
from conftest import Pair, cuda_torch, role_process

pytestmark = pytest.mark.timeout(180)

LAYOUT_ARGS = (4, 16, 2, 64)  # layers, block_size, heads, head_dim
LAYOUT = KvLayout(*LAYOUT_ARGS, dtype="bfloat16")
BLOCKS = 24


def check_blocks(torch: Any, decode: DecodeCache, dst: list[int], want: Any, src: list[int]) -> None:
    torch.cuda.synchronize()
    got = decode.cache[:, :, dst].cpu()
    assert torch.equal(got, want[:, :, src].cpu()), "the blocks landed byte-exact"


def test_cuda_caches_pull_and_push_in_one_process(cuda_pair: Pair) -> None:
    torch = cuda_torch()
    last = torch.cuda.device_count() - 1
    p, d = cuda_pair
    want = cuda_roles.kv_pattern(LAYOUT.shape(BLOCKS), 3, "cuda:0")
    torch.cuda.synchronize()
    prefill = PrefillCache(p, LAYOUT, BLOCKS, cache=want.clone())
    zeros = torch.zeros(LAYOUT.shape(BLOCKS), dtype=torch.bfloat16, device=f"cuda:{last}")
    decode = DecodeCache(d, LAYOUT, BLOCKS, cache=zeros)
    torch.cuda.synchronize()
    src, dst = [5, 6, 7, 0, 23, 11], [1, 2, 3, 9, 0, 20]
    decode.pull(prefill.source, src, dst, request="cuda-pull", imm=51).wait(timeout=60)
    check_blocks(torch, decode, dst, want, src)
    reads = DecodeCache.reads_per_pull(LAYOUT, src, dst)
    assert d.imm_counter(51).wait(reads, timeout=30) == reads
    src2, dst2 = [12, 13, 1], [4, 5, 22]
    prefill.push(decode.target, src2, dst2, request="cuda-push", imm=52, pages_per_write=4).wait(timeout=60)
    assert d.imm_counter(52).wait(1, timeout=30) == 1
    check_blocks(torch, decode, dst2, want, src2)


@pytest.mark.parametrize("device_ipc", [True, False], ids=["ipc", "network"])
def test_cuda_caches_pull_and_push_across_processes(device_ipc: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = cuda_torch()
    last = torch.cuda.device_count() - 1
    monkeypatch.setenv("ACCORD_DEVICE_IPC", "1" if device_ipc else "0")
    with role_process(cuda_roles.kv_prefill, 0, LAYOUT_ARGS, BLOCKS, device_ipc) as (parent, hello):
        with accord.Engine() as engine:
            parent.send(engine.address)
            want = cuda_roles.kv_pattern(LAYOUT.shape(BLOCKS), 3, "cpu")
            zeros = torch.zeros(LAYOUT.shape(BLOCKS), dtype=torch.bfloat16, device=f"cuda:{last}")
            decode = DecodeCache(engine, LAYOUT, BLOCKS, cache=zeros)
            torch.cuda.synchronize()
            src, dst = [0, 1, 2, 17, 9], [3, 4, 5, 0, 23]
            decode.pull(hello["source"], src, dst, request="mp-pull", imm=53).wait(timeout=120)
            check_blocks(torch, decode, dst, want, src)
            # Once the prefill engine knows the decode cache's IPC handle (announced with the
            # first read), it writes reads through it; with IPC off it lands them all.
            mapped = 0
            for attempt in range(5):
                decode.pull(hello["source"], [3, 4], [6, 7], request=f"again-{attempt}").wait(timeout=120)
                parent.send("stats")
                mapped = parent.recv()["reads_into_device_mapped"]
                if mapped or not device_ipc:
                    break
            check_blocks(torch, decode, [6, 7], want, [3, 4])
            assert (mapped > 0) == device_ipc, mapped
            parent.send((decode.target, [20, 21, 8], [10, 11, 12], 54))
            report = parent.recv()
            assert report == {"pushed": True}, report
            assert engine.imm_counter(54).wait(1, timeout=30) == 1
            check_blocks(torch, decode, [10, 11, 12], want, [20, 21, 8])
            parent.send("exit")
            decode.close()
