"""What the GPU benches (kv_gpu_bench.py, weight_push_gpu_bench.py) share: the copy ceiling they
compare against (one contiguous torch ``copy_`` of the same bytes from GPU 0 to the last GPU,
timed the same way by both, so their ratios to it mean the same thing), and their rows' JSON
lines and table cells."""

from __future__ import annotations

import json
import statistics
import time
from typing import Any


def copy_ceiling_s(torch: Any, nbytes: int, iters: int) -> float:
    """Seconds of one contiguous bf16 ``copy_`` of ``nbytes`` GPU 0 -> last GPU: the median of
    ``iters`` timed copies after one warm-up, each waited for on both GPUs."""
    last = torch.cuda.device_count() - 1
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda:0")
    dst = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=f"cuda:{last}")
    dst.copy_(src)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(last)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(last)
        times.append(time.perf_counter() - t0)
    del src, dst
    torch.cuda.empty_cache()
    return statistics.median(times)


class PeerFailed(RuntimeError):
    """The other process of a bench reported a failed request (``("failed", why)``); it is
    still up."""


def peer_answer(conn: Any, what: str, peer: str, timeout: float) -> Any:
    """The value of the other process's next message, which must be ``(what, value)``.
    Raises RuntimeError naming ``peer`` when it does not answer within ``timeout`` seconds,
    reports an error or answers something else; PeerFailed for ``("failed", why)``."""
    if not conn.poll(timeout):
        raise RuntimeError(f"the {peer} did not answer {what!r} within {timeout:.0f} s")
    kind, value = conn.recv()
    if kind == "error":
        raise RuntimeError(f"the {peer} failed: {value}")
    if kind == "failed":
        raise PeerFailed(value)
    if kind != what:
        raise RuntimeError(f"expected {what!r} from the {peer}, got {kind!r}")
    return value


def read_rows(paths: list[str]) -> list[dict[str, Any]]:
    """The rows (JSON objects, one a line) of these JSON-lines files; other lines are skipped."""
    return [json.loads(line) for name in paths for line in open(name) if line.startswith("{")]


def append_rows(path: str, rows: list[dict[str, Any]]) -> None:
    """Appends ``rows`` to the JSON-lines file ``path``, one a line."""
    with open(path, "a") as out:
        for r in rows:
            out.write(json.dumps(r) + "\n")


def cell(value: Any) -> str:
    """A table cell: ``-`` for a value not measured."""
    return "-" if value is None else str(value)


def check_note(checked: bool | None, wrong: bool, error: str, extra: str = "") -> str:
    """A row's last column: whether its bytes were checked and right, then ``extra`` and the
    start of its error, if any."""
    note = "bytes ok" if checked else ("BYTES WRONG" if wrong else "not checked")
    return note + extra + (f"; {error[:120]}" if error else "")
