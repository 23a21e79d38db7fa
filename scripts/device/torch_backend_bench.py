"""Issue 20's measurements of the torch.distributed backend "accord", one backend per run.

Run under torchrun (one run per backend and rank count; torch_backend_bench.sh drives them):

    torchrun --standalone --nproc_per_node N torch_backend_bench.py --backend accord --device cpu

Each run prints JSON lines on rank 0:
- {"kind": "local", ...}: the same model's step with no communication (no DDP), the compute
  floor under the DDP and FSDP2 rows (skip it with --skip local);
- {"kind": "ddp", ...}: DDP step time (forward, backward with gradient all-reduce, SGD step) of
  an MLP of about 50M parameters, mean of the timed steps, the slowest rank's time;
- {"kind": "fsdp2", ...}: the same model under fully_shard (CPU runs only);
- {"kind": "op", ...}: busbw of all_reduce / all_gather_into_tensor / reduce_scatter_tensor /
  all_to_all_single through torch.distributed at the given sizes (nccl-tests' busbw factors),
  --op-warmup and --op-iters calls, the slowest rank's mean, the median of --op-rounds rounds
  (default 1; torch_backend_bench.sh runs 3);
  for the accord backend on CPU also `direct_us` (timed in the same rounds, the two alternating
  which goes first), the group's own Communicator called directly on the same tensors (the same
  collective and schedule: all_to_all_single is all_to_allv there, whose schedule is the CLI's
  all_to_all's with per-peer counts), so the report splits py/cli into the Python layer's
  share (py/dir) and the rest;
- {"kind": "sms", ...} (CUDA runs only): the GPU kernels one all_reduce / all_gather of
  --sm-bytes launches, from torch.profiler's CUDA trace: their names and the most CTAs
  (thread blocks) any of them ran, which is the number of SMs the op occupies while its kernel
  runs (NCCL: one CTA per channel); copies (memcpy, copy engines) are counted apart and use no
  SM. A backend that moves data only with copies shows 0 kernels.

`--report DIR` joins the JSON files torch_backend_bench.sh wrote into the printed tables.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time
from typing import Any


def busbw_factor(op: str, n: int) -> float:
    return 2.0 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def model(width: int, depth: int):
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def add_model_args(ap: Any) -> None:
    """The model's options (--width, --depth, --batch), shared by the scripts that train it
    (ddp_gpu_trace.py, scripts/ddp_timeline_probe.py), so their defaults stay this bench's."""
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--depth", type=int, default=3)  # 3 x (4096^2 + 4096) = 50.3M parameters
    ap.add_argument("--batch", type=int, default=32)


def timed(step, warmup: int, iters: int, sync, device) -> float:
    """Mean seconds per call over `iters` after `warmup`, the slowest rank's."""
    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        step()
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    sync()
    t = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # on the group's own backend: a cpu or cuda tensor
    return float(t.item())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", required=True)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    add_model_args(ap)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--op-warmup", type=int, default=5, help="warm-up calls per op row (accord bench -w)")
    ap.add_argument("--op-iters", type=int, default=20, help="timed calls per op row (accord bench -n)")
    ap.add_argument("--op-rounds", type=int, default=1,
                    help="rounds per op row: torch and direct alternate which goes first; medians reported")
    ap.add_argument("--sizes", default="1048576,4194304,16777216,67108864")
    ap.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter,all_to_all")
    ap.add_argument("--skip", default="", help="comma list of local,ddp,fsdp2,ops,sms to leave out")
    ap.add_argument("--sm-bytes", type=int, default=64 << 20, help="size of the ops whose kernels are counted")
    ap.add_argument("--report", help="print the tables from the JSON files in this folder")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch intra-op threads per rank on CPU (default: cores / local ranks)")
    args = ap.parse_args()
    if args.op_rounds < 1:
        ap.error("--op-rounds must be at least 1")
    if args.report:
        report(pathlib.Path(args.report))
        return

    import torch
    import torch.distributed as dist

    import accord.torch  # noqa: F401 - registers "accord"

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    n_local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        sync = torch.cuda.synchronize
    else:
        torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // n_local))
        device = torch.device("cpu")
        sync = lambda: None  # noqa: E731
    dist.init_process_group(args.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    skip = set(filter(None, args.skip.split(",")))
    meta = {"backend": args.backend, "device": args.device, "ranks": n, "torch": torch.__version__,
            "threads": torch.get_num_threads()}

    def emit(row: dict) -> None:
        if rank == 0:
            print(json.dumps({**meta, **row}), flush=True)

    params = sum(p.numel() for p in model(args.width, args.depth).parameters())
    x = torch.randn(args.batch, args.width, device=device)

    def step_time(module: Any) -> float:
        """Mean step time (forward, backward, SGD step) of `module` on `x`: the local, DDP and FSDP2
        rows differ only in how the module was wrapped."""
        opt = torch.optim.SGD(module.parameters(), lr=1e-4)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            module(x).square().mean().backward()
            opt.step()

        return timed(step, args.warmup, args.iters, sync, device)

    if "local" not in skip:
        # The same step with no communication at all: the compute floor under DDP's step time,
        # on the same threads, while the other ranks do the same (so what DDP adds is its
        # communication and how it shares the cores with the backward pass).
        emit({"kind": "local", "params": params, "step_s": step_time(model(args.width, args.depth).to(device))})

    if "ddp" not in skip:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model(args.width, args.depth).to(device), device_ids=[local_rank] if args.device == "cuda" else None)
        row = {"kind": "ddp", "params": params, "step_s": step_time(ddp)}
        native = getattr(dist.group.WORLD, "_native_ops", None)
        if native is not None:
            # (CUDA, CPU) all_reduces accord.torch's compiled backend ran without Python.
            row["native_ops"] = list(native())
        emit(row)
        del ddp

    if "fsdp2" not in skip and args.device == "cpu":
        from torch.distributed.fsdp import fully_shard

        m = model(args.width, args.depth)
        for layer in m:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(m)
        native = getattr(dist.group.WORLD, "_native_ops", None)
        before = list(native()) if native is not None else None
        row = {"kind": "fsdp2", "params": params, "step_s": step_time(m)}
        if native is not None and before is not None:
            # The ops the compiled backend ran without Python during these steps (CUDA, CPU):
            # FSDP2's all_gather and reduce_scatter run compiled only on registered tensors.
            row["native_ops"] = [a - b for a, b in zip(native(), before)]
        emit(row)
        del m

    if "ops" not in skip:
        # The accord group's own Communicator, called directly on the same tensors with the same
        # warm-up and count: `direct_us` beside each accord row, so the table tells the Python
        # layer's share (busbw / direct) apart from the collective's against the CLI.
        comm = None
        if args.backend == "accord" and args.device == "cpu":
            comm = dist.group.WORLD._get_backend(torch.device("cpu"))._comm
        for op in args.ops.split(","):
            for size in (int(s) for s in args.sizes.split(",")):
                elems = max(size // 4 // n * n, n)
                full = torch.ones(elems, device=device)
                part = torch.ones(elems // n, device=device)
                # all_to_all_single's output: its own tensor, made once like the other ops' (a
                # fresh clone each call timed the allocation and first-touch page faults too).
                spare = torch.ones(elems, device=device)
                calls = {
                    "all_reduce": lambda: dist.all_reduce(full),
                    "all_gather": lambda: dist.all_gather_into_tensor(full, part),
                    "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full),
                    "all_to_all": lambda: dist.all_to_all_single(spare, full),
                }
                direct = None
                if comm is not None:
                    # all_to_all_single goes through all_to_allv (split sizes are per rank, so
                    # the backend cannot tell that every rank's are even): the same here.
                    block = [elems // n] * n
                    direct = {
                        "all_reduce": lambda: comm.all_reduce(full),
                        "all_gather": lambda: comm.all_gather(part, full),
                        "reduce_scatter": lambda: comm.reduce_scatter(full, part),
                        "all_to_all": lambda: comm.all_to_allv(full, spare, block, block),
                    }[op]
                # Rounds alternate which of the two goes first, and each reports its median: on
                # the 2-core machine the one timed first was up to 1.5x slower than the same
                # call timed second (all_gather 1 MiB: 1.47-1.49x torch/direct timed one after
                # the other, 1.08x alternated), which read as Python overhead.
                torch_s, direct_s = [], []
                for r in range(args.op_rounds):
                    pair = [(calls[op], torch_s)] + ([(direct, direct_s)] if direct is not None else [])
                    for step, times in pair if r % 2 == 0 else reversed(pair):
                        times.append(timed(step, args.op_warmup, args.op_iters, sync, device))
                t = statistics.median(torch_s)
                nbytes = elems * 4
                row = {"kind": "op", "op": op, "bytes": nbytes, "time_us": t * 1e6,
                       "busbw_gbps": nbytes / t / 1e9 * busbw_factor(op, n), "rounds": args.op_rounds}
                if direct_s:
                    row["direct_us"] = statistics.median(direct_s) * 1e6
                emit(row)
    if "sms" not in skip and args.device == "cuda":
        for op in ("all_reduce", "all_gather"):
            try:
                found = kernels_of(op, args.sm_bytes, n, device)
            except Exception as e:  # noqa: BLE001 - a profiler problem must not lose the other rows
                found = {"kernels": -1, "max_ctas": -1, "kernel_names": [f"profiler failed: {e}"[:80]], "copies": -1}
            emit({"kind": "sms", "op": op, "bytes": args.sm_bytes, **found})
    dist.barrier()
    dist.destroy_process_group()


def kernels_of(op: str, nbytes: int, n: int, device) -> dict:
    """The GPU kernels and copies three calls of `op` launch, from torch.profiler's CUDA trace
    (chrome trace events of category "kernel" carry their grid)."""
    import tempfile

    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    elems = max(nbytes // 4 // n * n, n)
    full, part = torch.ones(elems, device=device), torch.ones(elems // n, device=device)
    call = (lambda: dist.all_reduce(full)) if op == "all_reduce" else (lambda: dist.all_gather_into_tensor(full, part))
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            call()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name)).get("traceEvents", [])
    kernels = [e for e in events if e.get("cat") == "kernel"]
    copies = [e for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    ctas = 0
    for e in kernels:
        grid = e.get("args", {}).get("grid", [0, 0, 0])
        ctas = max(ctas, int(grid[0]) * int(grid[1]) * int(grid[2]))
    names = sorted({e.get("name", "?")[:60] for e in kernels})
    return {"kernels": len(kernels) // 3, "max_ctas": ctas, "kernel_names": names, "copies": len(copies) // 3}


def load(path: pathlib.Path) -> list[dict]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return rows


def report(out: pathlib.Path) -> None:
    runs = {p.stem: load(p) for p in sorted(out.glob("torch_*.jsonl"))}
    print("\n## Step time (s): accord vs baseline, same model, same host, same call")
    print(f"{'device':>6} {'ranks':>5} {'kind':>6} {'params':>10} {'accord_s':>9} {'base':>5} {'base_s':>9} {'speedup':>7}")
    for device, base in (("cpu", "gloo"), ("cuda", "nccl")):
        for n in (2, 4, 8):
            a, b = runs.get(f"torch_accord_{device}_{n}", []), runs.get(f"torch_{base}_{device}_{n}", [])
            for kind in ("local", "ddp", "fsdp2"):
                ra = next((r for r in a if r["kind"] == kind), None)
                rb = next((r for r in b if r["kind"] == kind), None)
                if ra or rb:
                    sa, sb = (ra or {}).get("step_s", float("nan")), (rb or {}).get("step_s", float("nan"))
                    params = (ra or rb or {}).get("params", 0)
                    print(f"{device:>6} {n:>5} {kind:>6} {params:>10} {sa:>9.4f} {base:>5} {sb:>9.4f} {sb / sa:>7.2f}")
    print("\n## Op busbw (GB/s): torch.distributed 'accord' vs its baseline vs `accord bench` (CPU)")
    print("(py/cli: the accord op's busbw over `accord bench`'s, same sizes, ranks, warm-up and count, the slowest\n"
          " rank's time both; direct: the group's Communicator called directly on the same tensors, GB/s busbw;\n"
          " py/dir: the op's busbw over that, the Python layer's share)")
    print(f"{'device':>6} {'ranks':>5} {'op':>14} {'bytes':>10} {'accord':>8} {'base':>8} {'vs_base':>7} {'cli':>8} {'py/cli':>6} "
          f"{'direct':>8} {'py/dir':>6}")
    for device, base in (("cpu", "gloo"), ("cuda", "nccl")):
        for n in (2, 4, 8):
            a = [r for r in runs.get(f"torch_accord_{device}_{n}", []) if r["kind"] == "op"]
            b = {(r["op"], r["bytes"]): r for r in runs.get(f"torch_{base}_{device}_{n}", []) if r["kind"] == "op"}
            for r in a:
                rb = b.get((r["op"], r["bytes"]))
                bb = rb["busbw_gbps"] if rb else float("nan")
                cli = float("nan")
                for row in (load(out / f"cli_{r['op']}_{n}.json")[:1] or [{}])[0].get("rows", []):
                    if row["bytes"] == r["bytes"]:
                        cli = row["busbw_gbps"]
                ratio = r["busbw_gbps"] / bb if bb == bb and bb > 0 else float("nan")
                py_cli = r["busbw_gbps"] / cli if cli == cli and cli > 0 else float("nan")
                direct = float("nan")
                if r.get("direct_us"):
                    direct = r["bytes"] / (r["direct_us"] / 1e6) / 1e9 * busbw_factor(r["op"], n)
                py_dir = r["busbw_gbps"] / direct if direct == direct and direct > 0 else float("nan")
                print(f"{device:>6} {n:>5} {r['op']:>14} {r['bytes']:>10} {r['busbw_gbps']:>8.2f} {bb:>8.2f} "
                      f"{ratio:>7.2f} {cli:>8.2f} {py_cli:>6.2f} {direct:>8.2f} {py_dir:>6.2f}")
    report_sms(out, runs)


def report_sms(out: pathlib.Path, runs: dict) -> None:
    print("\n## SMs per op (CUDA, 2 GPUs): kernels one call launches and their most CTAs (= SMs held)")
    print(f"{'backend':>8} {'op':>11} {'bytes':>10} {'kernels':>7} {'max_ctas':>8} {'copies':>6}  kernel names / NCCL channels")
    for b in ("accord", "nccl"):
        channels = ""
        err = out / f"torch_{b}_cuda_2.err"
        if b == "nccl" and err.exists():
            counts = sorted({line.split("Channel ")[1].split(":")[0].split("/")[1].strip()
                             for line in err.read_text(errors="replace").splitlines()
                             if "NCCL INFO Channel " in line and "->" not in line
                             and "/" in line.split("Channel ")[1].split(":")[0]})
            channels = f"NCCL_DEBUG=INFO channels: {','.join(counts) or '?'}"
        for r in (r for r in runs.get(f"torch_{b}_cuda_2", []) if r["kind"] == "sms"):
            print(f"{b:>8} {r['op']:>11} {r['bytes']:>10} {r['kernels']:>7} {r['max_ctas']:>8} {r['copies']:>6}  "
                  f"{', '.join(r['kernel_names']) or '-'} {channels}")


if __name__ == "__main__":
    sys.exit(main())
