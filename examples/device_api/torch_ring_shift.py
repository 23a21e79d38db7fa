"""Accord's device API from Python: torch CUDA tensors as windows, and ring_shift.cu (a kernel
that puts to the next rank with a signal, waits for the previous rank's, and adds what arrived)
built as a torch C++/CUDA extension with ``torch.utils.cpp_extension.load_inline`` (nvcc), the
header found through ``accord.device.include_dir()`` (or with NVRTC through cuda.bindings where
no CUDA toolkit is installed: ``--compiler``), launched on torch's current stream with the
device table's address.

    torchrun --nproc-per-node 2 examples/device_api/torch_ring_shift.py
    python examples/device_api/torch_ring_shift.py --nprocs 2     # accord.run starts the ranks

Each rank needs a GPU of its own (``LOCAL_RANK`` picks it), and nvcc (the CUDA toolkit torch was
built for) or cuda.bindings with NVRTC. Exits 0 when every rank's result is right, 1 on a wrong result or a device error,
2 when torch or CUDA is missing (it says which).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import accord
import accord.device

HERE = Path(__file__).resolve().parent

# The launcher the extension exports: ring_shift.cu's kernel, on torch's current stream.
LAUNCHER = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

void launch_ring_shift(int64_t table, int64_t bytes, int64_t launch, torch::Tensor out, torch::Tensor status) {
  TORCH_CHECK(out.is_cuda() && out.scalar_type() == torch::kFloat32 && out.is_contiguous(), "out: contiguous float32 CUDA");
  TORCH_CHECK(status.is_cuda() && status.scalar_type() == torch::kInt32, "status: int32 CUDA");
  auto stream = at::cuda::getCurrentCUDAStream();
  ring_shift<<<1, 256, 0, stream>>>(reinterpret_cast<const accord::device::DeviceTable*>(table),
                                    static_cast<unsigned long long>(bytes),
                                    static_cast<unsigned long long>(launch), out.data_ptr<float>(),
                                    status.data_ptr<int>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""
DECLARATION = (
    "void launch_ring_shift(int64_t table, int64_t bytes, int64_t launch, torch::Tensor out, torch::Tensor status);"
)


def missing(why: str) -> SystemExit:
    print(f"torch_ring_shift: {why}", file=sys.stderr, flush=True)
    return SystemExit(2)


def require_cuda() -> Any:
    """torch, or exit 2 saying what is missing."""
    try:
        import torch
    except ImportError as e:
        raise missing(f"needs torch with CUDA ({e})") from None
    if not torch.cuda.is_available():
        raise missing("needs a CUDA GPU per rank: torch.cuda.is_available() is False")
    return torch


def nvcc_extension() -> Callable[..., None]:
    """ring_shift.cu and the launcher compiled with nvcc as a torch C++/CUDA extension (cached
    by torch between runs, under TORCH_EXTENSIONS_DIR); its launch_ring_shift(table, bytes,
    launch, out, status)."""
    import torch.utils.cpp_extension

    load_inline: Any = torch.utils.cpp_extension.load_inline  # untyped in torch
    kernel = (HERE / "ring_shift.cu").read_text()
    module = load_inline(
        name="accord_torch_ring_shift",
        cpp_sources=[DECLARATION],
        cuda_sources=[kernel + LAUNCHER],
        functions=["launch_ring_shift"],
        extra_include_paths=[accord.device.include_dir()],
        extra_cuda_cflags=["-std=c++17"],
        verbose=False,
    )
    launch: Callable[..., None] = module.launch_ring_shift
    return launch


def nvrtc_kernel(torch: Any, ordinal: int) -> Callable[..., None]:
    """ring_shift.cu compiled with NVRTC by accord.nvrtc (cuda.bindings, which torch's CUDA wheels
    bring) for GPU `ordinal` and loaded into its primary context (torch's); a launcher with the
    nvcc extension's signature, on torch's current stream."""
    import accord.nvrtc
    from accord.nvrtc import u64

    module = accord.nvrtc.KernelModule.from_source(
        (HERE / "ring_shift.cu").read_text(), "ring_shift.cu", ordinal, torch.cuda.get_device_capability(ordinal)
    )
    kernel = module.kernel("ring_shift")

    def launch(table: int, nbytes: int, index: int, out: Any, status: Any) -> None:
        # Every parameter of ring_shift is 8 bytes: pointers and unsigned long long.
        args = (u64(table), u64(nbytes), u64(index), u64(out.data_ptr()), u64(status.data_ptr()))
        kernel.launch(1, 256, torch.cuda.current_stream().cuda_stream, *args)

    return launch


def build_kernel(torch: Any, ordinal: int, compiler: str) -> tuple[str, Callable[..., None]]:
    """The kernel's launcher, from nvcc (a torch extension) or NVRTC; `auto` takes nvcc where
    torch finds a CUDA toolkit, else NVRTC."""
    if compiler == "auto":
        from torch.utils.cpp_extension import CUDA_HOME

        compiler = "nvcc" if CUDA_HOME or shutil.which("nvcc") else "nvrtc"
    if compiler == "nvcc":
        return compiler, nvcc_extension()
    return compiler, nvrtc_kernel(torch, ordinal)


def rank_main(elements: int, launches: int, compiler: str) -> str:
    """One rank: returns a line describing its verified result; raises on a wrong one."""
    torch = require_cuda()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    compiler, launch_ring_shift = build_kernel(torch, local_rank, compiler)
    comm = accord.Communicator()
    with accord.device.DeviceComm(comm, gpu=local_rank) as dc:
        rank, world = dc.rank, dc.world_size
        prev = (rank - 1) % world
        device = torch.device("cuda", local_rank)
        # Window 0 receives, window 1 is the source (ring_shift.cu's order), on every rank.
        recv = torch.zeros(elements, dtype=torch.float32, device=device)
        send = torch.arange(elements, dtype=torch.float32, device=device) + 1000.0 * rank
        # The zeros and the source must be in memory before a peer's put can land or be read:
        # the registration's exchange orders the ranks, not this rank's stream.
        torch.cuda.synchronize()
        ids = (dc.register_window(recv), dc.register_window(send))
        if ids != (0, 1):
            raise RuntimeError(f"rank {rank}: windows got ids {ids}, ring_shift.cu expects (0, 1)")
        out = torch.zeros(elements, dtype=torch.float32, device=device)
        status = torch.zeros(1, dtype=torch.int32, device=device)
        table = dc.table_ptr
        for launch in range(launches):
            launch_ring_shift(table, elements * 4, launch, out, status)
            torch.cuda.current_stream().synchronize()
            # No rank overwrites a receive window before its owner has added it in.
            dc.barrier()
        errors = dc.errors()
        code = int(status.item())
        if code != 0 or errors:
            raise RuntimeError(f"rank {rank}: device status {code}, proxy errors {errors[:4]}")
        want = launches * (torch.arange(elements, dtype=torch.float32, device=device) + 1000.0 * prev)
        if not torch.equal(out, want):
            bad = int((out != want).nonzero()[0].item())
            raise RuntimeError(
                f"rank {rank}: out[{bad}] is {out[bad].item()}, want {want[bad].item()} "
                f"({launches} launches of rank {prev}'s data)"
            )
        stats = dc.stats()
    return (
        f"rank {rank}: {launches} ring shifts of {elements * 4} bytes from rank {prev} verified ({compiler}; "
        f"{stats['descriptors_executed']} descriptors, {stats['lane_batches']} lane batches)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", type=int, default=1 << 16, help="floats per put (default 65536)")
    parser.add_argument("--launches", type=int, default=5, help="kernel launches per rank (default 5)")
    parser.add_argument(
        "--compiler",
        choices=["auto", "nvcc", "nvrtc"],
        default="auto",
        help="nvcc (a torch C++/CUDA extension) or NVRTC (cuda.bindings); auto: nvcc where a toolkit is found",
    )
    parser.add_argument("--nprocs", type=int, default=2, help="ranks to start when not under torchrun")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole job (accord.run)")
    args = parser.parse_args(argv)
    require_cuda()  # fail here, clearly, before any rank starts
    try:
        if "RANK" in os.environ:
            print(rank_main(args.elements, args.launches, args.compiler), flush=True)
        else:
            ranks = accord.run(rank_main, args.nprocs, args.elements, args.launches, args.compiler, timeout=args.timeout)
            for line in ranks:
                print(line, flush=True)
    except (RuntimeError, accord.AccordError) as e:
        print(f"torch_ring_shift: FAILED: {e}", file=sys.stderr, flush=True)
        return 1
    print("torch_ring_shift: every rank verified", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
