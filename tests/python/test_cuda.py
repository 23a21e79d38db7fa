"""CUDA tensors in the engine: registered through DLPack, written GPU to GPU by the copy engine
(same process, and across processes through CUDA IPC), the immediate counted once the bytes
landed. Skipped where torch or a CUDA device is missing; run on the GPU host."""

from __future__ import annotations


import pytest

import accord
import cuda_roles
from conftest import cuda_torch, role_process

pytestmark = pytest.mark.timeout(120)

COUNT = 1 << 20  # 4 MiB of float32


def test_cuda_tensor_write_between_engines_of_one_process() -> None:
    torch = cuda_torch()
    last = torch.cuda.device_count() - 1
    a = accord.Engine(ignore_env=True)
    b = accord.Engine(ignore_env=True)
    try:
        a.add_peer(b.address)
        b.add_peer(a.address)
        src = torch.arange(COUNT, dtype=torch.float32, device="cuda:0")
        dst = torch.zeros(COUNT, dtype=torch.float32, device=f"cuda:{last}")
        torch.cuda.synchronize()
        with a.register(src) as s, b.register(dst) as d:
            assert d.nbytes == COUNT * 4
            a.write(s, d.descriptor, imm=9).wait(timeout=30)
            b.imm_counter(9).wait(1, timeout=30)
            torch.cuda.synchronize()
            assert torch.equal(dst.cpu(), src.cpu())
    finally:
        a.close()
        b.close()


def test_cuda_tensor_write_to_another_process() -> None:
    torch = cuda_torch()
    last = torch.cuda.device_count() - 1
    with role_process(cuda_roles.cuda_receiver, last, COUNT, join_s=30) as (parent, hello):
        with accord.Engine(ignore_env=True) as engine:
            engine.add_peer(hello["address"])
            parent.send(engine.address)
            src = torch.arange(COUNT, dtype=torch.float32, device="cuda:0")
            torch.cuda.synchronize()
            with engine.register(src) as s:
                engine.write(s, hello["region"], imm=cuda_roles.IMM).wait(timeout=30)
                report = parent.recv()
                parent.send("done")
        assert report == {"ok": True}, report


def test_cuda_tensor_to_host_memory_is_refused_clearly() -> None:
    torch = cuda_torch()
    import numpy as np

    with accord.Engine(ignore_env=True) as a, accord.Engine(ignore_env=True) as b:
        a.add_peer(b.address)
        b.add_peer(a.address)
        src = torch.ones(1024, device="cuda:0")
        dst = np.zeros(4096, np.uint8)
        with a.register(src) as s, b.register(dst) as d:
            with pytest.raises(accord.AccordError):
                a.write(s, d.descriptor).wait(timeout=10)
