"""Which CUDA calls in PyTorch's (primary) context wait while another thread is blocked in a
synchronous copy (``tensor.cpu()``) behind a long kernel?

The torch backend's GPU collectives move bytes from a progress thread. In the primary context a
blocked ``tensor.cpu()`` held that thread's copies and event queries for the kernel's whole length
(docs/results/2026-11-26-torch-gpu-path.md), so they run in a private context; but a private
context's kernels (the all_reduce's reduction) are time-sliced against the framework's kernels
instead of running beside them. This probe asks, call by call, which primary-context calls a second
thread can still make promptly during such a block: if kernel launches and stream memory writes
return at once, the reduction can run in the primary context while the copies stay private.

    python3 scripts/device/primary_context_stall_probe.py      # one GPU; prints one line per call

Each trial: a spinning kernel of about --spin-ms on the current stream, then ``x.cpu()`` (pageable,
so synchronous) on the main thread; after --delay-ms a second thread makes one call on another
stream and times how long the call took to return (not to execute). A call that waited shows about
the kernel's remaining length; the main thread's ``cpu()`` time is the reference.
"""

from __future__ import annotations

import argparse
import ctypes
import threading
import time
from typing import Any, Callable


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spin-ms", type=float, default=600.0)
    ap.add_argument("--delay-ms", type=float, default=150.0)
    args = ap.parse_args()

    import torch

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    cu = ctypes.CDLL("libcuda.so.1")
    write_value: Any = getattr(cu, "cuStreamWriteValue64_v2", None) or cu.cuStreamWriteValue64
    write_value.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint]
    write_value.restype = ctypes.c_int
    wait_value: Any = getattr(cu, "cuStreamWaitValue64_v2", None) or cu.cuStreamWaitValue64
    wait_value.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint]
    wait_value.restype = ctypes.c_int

    def driver(name: str, result: int) -> None:
        """A driver call's result: an error ends the probe (a call that failed at once would
        read as one that did not wait)."""
        if result != 0:
            raise SystemExit(f"{name} returned CUDA error {result}")

    x = torch.ones(4 << 20, device=dev)
    y = torch.ones(1 << 20, device=dev)
    z = torch.empty_like(y)
    flag = torch.zeros(1, dtype=torch.int64, device=dev)
    side = torch.cuda.Stream(dev)
    recorded: Any = torch.cuda.Event()
    spin: Any = torch.cuda._sleep
    # Cycles per millisecond of the spinning kernel, from a short calibration run.
    spin(1000)  # the first launch loads the module: not part of the calibration
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    spin(10_000_000)
    end.record()
    end.synchronize()
    cycles_per_ms = 10_000_000 / max(start.elapsed_time(end), 1e-3)

    def with_side(fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with torch.cuda.stream(side):
                return fn()

        return run

    calls: list[tuple[str, Callable[[], Any]]] = [
        ("kernel launch (y.add_(1))", with_side(lambda: y.add_(1))),
        ("event record", lambda: recorded.record(side)),
        ("event query", lambda: recorded.query()),
        (
            "stream write value (cuStreamWriteValue64)",
            lambda: driver("cuStreamWriteValue64", write_value(side.cuda_stream, flag.data_ptr(), 7, 0)),
        ),
        (
            "stream wait value (cuStreamWaitValue64, already true)",
            lambda: driver("cuStreamWaitValue64", wait_value(side.cuda_stream, flag.data_ptr(), 0, 0)),
        ),
        ("copy device to device, async (z.copy_(y))", with_side(lambda: z.copy_(y, non_blocking=True))),
        ("stream query", lambda: side.query()),
    ]
    print(f"spinning kernel: {args.spin_ms:.0f} ms ({cycles_per_ms:.0f} cycles/ms); the call starts {args.delay_ms:.0f} ms in")
    for name, call in calls:
        took: dict[str, float] = {}

        def other() -> None:
            # This thread's current context is the primary one, as a progress thread's would
            # be in the primary-context design (the runtime makes it current here).
            torch.cuda.set_device(dev)
            torch.cuda.current_stream(dev).query()
            time.sleep(args.delay_ms / 1e3)
            t0 = time.perf_counter()
            call()
            took["call"] = (time.perf_counter() - t0) * 1e3

        torch.cuda.synchronize()
        thread = threading.Thread(target=other, daemon=True)
        spin(int(args.spin_ms * cycles_per_ms))
        thread.start()
        t0 = time.perf_counter()
        x.cpu()
        main_ms = (time.perf_counter() - t0) * 1e3
        # Bounded: a call that never returns is itself the answer, not a hang of the probe.
        thread.join(timeout=args.spin_ms / 1e3 + 30.0)
        if thread.is_alive():
            raise SystemExit(f"{name}: the call had not returned {args.spin_ms / 1e3 + 30.0:.0f} s after the spin began")
        torch.cuda.synchronize()
        print(f"{name:58s} returned after {took['call']:9.3f} ms   (main thread's cpu(): {main_ms:7.1f} ms)", flush=True)


if __name__ == "__main__":
    main()
