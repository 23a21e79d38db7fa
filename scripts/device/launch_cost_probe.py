"""Host cost of one kernel launch through accord.nvrtc, on one GPU: ``Kernel.launch`` with a
ctypes value made per argument (through cuda.bindings) against ``Kernel.bind``'s ``Launcher``
(plain ints packed into one reused buffer, libcuda called directly), and a torch op's launch as
a reference. An empty kernel with ep_wait's eleven parameters; launches between two
synchronisations, alternated rounds.

    python3 scripts/device/launch_cost_probe.py [--launches 5000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from accord import nvrtc
from accord.nvrtc import i32, u32, u64

SOURCE = (
    'extern "C" __global__ void empty11(const void* t, unsigned int me, unsigned int ranks, unsigned int sig, '
    "unsigned long long per_peer, unsigned long long lag, unsigned long long* state, unsigned int slot, "
    "unsigned long long timeout_ns, int stage, int* status) {}"
)


def per_launch(call: Callable[[], None], launches: int) -> float:
    """Microseconds of host time per call of `call`."""
    for _ in range(200):
        call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(launches):
        call()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / launches * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.zeros(1, device="cuda")
    module = nvrtc.KernelModule.from_source(SOURCE, "empty11.cu", 0, torch.cuda.get_device_capability(0))
    kernel = module.kernel("empty11")
    launcher = kernel.bind(nvrtc.parameter_formats(SOURCE, "empty11"))
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    handle = int(stream.cuda_stream)
    state = torch.zeros(16, dtype=torch.int64, device="cuda")
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    small = torch.zeros(16, device="cuda")

    def ctypes_values() -> None:
        # As accord.ep's call sites were: a ctypes value per argument, data_ptr() per call.
        kernel.launch(
            1, 32, int(stream.cuda_stream), u64(1 << 40), u32(0), u32(2), u32(3), u64(1), u64(0),
            u64(state.data_ptr()), u32(1), u64(10**9), i32(2), u64(status.data_ptr()),
        )

    state_ptr, status_ptr = state.data_ptr(), status.data_ptr()

    def plain_ints() -> None:
        launcher(1, 32, handle, 1 << 40, 0, 2, 3, 1, 0, state_ptr, 1, 10**9, 2, status_ptr)

    def torch_op() -> None:
        small.add_(1)

    variants = {"Kernel.launch, ctypes values": ctypes_values, "Launcher, plain ints": plain_ints, "torch add_ (reference)": torch_op}
    rows: dict[str, list[float]] = {name: [] for name in variants}
    with torch.cuda.stream(stream):
        for _ in range(args.rounds):
            for name, call in variants.items():
                rows[name].append(per_launch(call, args.launches))
    print(f"| launch path ({args.launches} launches a round) | " + " | ".join(f"round {r + 1} us" for r in range(args.rounds)) + " |")
    print("|---|" + "---|" * args.rounds)
    for name, values in rows.items():
        print(f"| {name} | " + " | ".join(f"{v:.2f}" for v in values) + " |")


if __name__ == "__main__":
    main()
