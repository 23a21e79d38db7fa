"""What importing accord.torch costs a CUDA process, now that its GPU path is the default
(ACCORD_TORCH_GPU=auto): the import sets CUDA_MODULE_LOADING=EAGER (and expandable segments)
where CUDA has not started, so every CUDA module loads when CUDA starts, not at first launch.

Runs fresh processes one after the other, variants alternated round by round, and prints one
table: seconds to import, to start CUDA (the first tensor on the GPU), to run a first small
training step (forward, backward, optimiser: kernels loaded at first use under lazy loading),
and the GPU memory in use after that (the device's total minus free: nothing else may run on
the GPU meanwhile).

    python3 scripts/device/cuda_loading_cost.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, os, time
t0 = time.perf_counter()
import torch
if os.environ.get("PROBE_IMPORT_ACCORD") == "1":
    import accord.torch  # noqa: F401
t1 = time.perf_counter()
x = torch.zeros(1, device="cuda")
torch.cuda.synchronize()
t2 = time.perf_counter()
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss = torch.nn.functional.cross_entropy(model(torch.randn(64, 1024, device="cuda")), torch.randint(0, 10, (64,), device="cuda"))
loss.backward()
opt.step()
torch.cuda.synchronize()
t3 = time.perf_counter()
free, total = torch.cuda.mem_get_info()
print(json.dumps({"import_s": t1 - t0, "cuda_start_s": t2 - t1, "first_step_s": t3 - t2,
                  "gpu_used_mib": (total - free) / 2**20,
                  "loading": os.environ.get("CUDA_MODULE_LOADING", "(unset)"),
                  "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}))
"""

VARIANTS = {
    "torch alone (lazy loading)": {"PROBE_IMPORT_ACCORD": "0"},
    "import accord.torch (auto)": {"PROBE_IMPORT_ACCORD": "1"},
    "import accord.torch, ACCORD_TORCH_GPU=0": {"PROBE_IMPORT_ACCORD": "1", "ACCORD_TORCH_GPU": "0"},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rows = []
    for round_ in range(1, args.rounds + 1):
        for name, extra in VARIANTS.items():
            env = {k: v for k, v in os.environ.items() if k not in ("CUDA_MODULE_LOADING", "ACCORD_TORCH_GPU")}
            env.update(extra)
            done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                print(f"{name}: failed\n{done.stderr[-2000:]}")
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row.update(variant=name, round=round_)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| variant | round | loading | import s | CUDA start s | first step s | GPU used MiB |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['variant']} | {r['round']} | {r['loading']} | {r['import_s']:.2f} | {r['cuda_start_s']:.2f} "
            f"| {r['first_step_s']:.2f} | {r['gpu_used_mib']:.0f} |"
        )


if __name__ == "__main__":
    main()
