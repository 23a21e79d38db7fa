"""What the Python objects of one torch.distributed call through a Python backend cost on this
host, warm, in us each (issue 20: the torch layer's share of a 1 MiB call): a c10d `Work` and a
subclass of it, an options object and its `reduceOp`, a lock, a weak reference, a flat detached
view, a tensor attribute, a closure. Two rounds; no process group needed.

    CUDA_VISIBLE_DEVICES= python3 scripts/device/torch_object_costs.py

docs/results/2026-11-27-proxy-host-steps-and-torch-layer.md compares the 2xH200 host's figures
with the 2-core machine's."""
import timeit, threading, weakref, sys
import torch, torch.distributed as dist
W = torch._C._distributed_c10d.Work
class S(W):
    def __init__(self):
        super().__init__()
class P:
    __slots__ = ("a",)
    def __init__(self): self.a = 1
opts = dist.AllreduceOptions()
t = torch.ones(1024)
n = 20000
def us(f): return timeit.timeit(f, number=n) / n * 1e6
rows = [
    ("Work()", lambda: W()),
    ("Work subclass", lambda: S()),
    ("plain __slots__ object", lambda: P()),
    ("AllreduceOptions()", lambda: dist.AllreduceOptions()),
    ("opts.reduceOp", lambda: opts.reduceOp),
    ("opts.reduceOp == SUM", lambda: opts.reduceOp == dist.ReduceOp.SUM),
    ("threading.Lock()", lambda: threading.Lock()),
    ("weakref.ref(obj)", lambda: weakref.ref(opts)),
    ("t.detach().view(-1)", lambda: t.detach().view(-1)),
    ("t.is_cuda", lambda: t.is_cuda),
    ("t.data_ptr()", lambda: t.data_ptr()),
    ("closure", lambda: (lambda: t)),
]
for r in range(2):
    print(" | ".join(f"{name} {us(f):.2f}" for name, f in rows), flush=True)
print(sys.version)
