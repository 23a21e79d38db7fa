#!/usr/bin/env bash
# Issue 19's network route (two processes, ACCORD_DEVICE_IPC=0 ACCORD_SHM=0: every put and
# signal into the peer's GPU takes the engine's landing route) with the landing route's inline
# asks on and off, alternated round by round in one call: kernel-to-kernel ping-pong one way,
# put 8 B / 4 KiB and put_value 8 B (each with its signal). Then, unless BW=0, issue 19's
# large puts over IPC against the copy ceiling in bursts of 10 and of 100 puts a size.
# Usage (GPU host with 2 GPUs, repo root): BIN_DIR=.carry/cNN OUT=... scripts/device/landing_inline_ab.sh
# ROUNDS (default 2), ITERS (ping-pong round trips a mode, default 300), RUN_CAP_S (default 60),
# BUDGET_S (default 330 s for the whole command).
set -uo pipefail
DEFAULT_BUDGET_S=330
. "$(dirname "$0")/budget.sh"
BIN="${BIN_DIR:?set BIN_DIR to a folder holding accord-device-bench}/accord-device-bench"
[ -x "$BIN" ] || { echo "no accord-device-bench in $BIN_DIR"; exit 1; }
host_facts
# one NAME ARGS...: one bench run under `timeout`, capped by the budget; its JSON rows kept.
one() {
  local name=$1 t; shift
  t=$(capped "${RUN_CAP_S:-60}" 25) || { echo "skipped for the time budget: $name"; return; }
  timeout "$t" "$@" --timeout-s $((t - 10)) > "$OUT/$name.txt" 2>&1 || echo "$name: exit $?"
  grep '^{' "$OUT/$name.txt" > "$OUT/$name.jsonl"
}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for inline in 1 0; do
    ACCORD_DEVICE_LANDING_INLINE=$inline one "inline${inline}_r$round" \
      "$BIN" --route network --only pingpong --iters "${ITERS:-300}"
  done
done
if [ "${BW:-1}" = 1 ]; then
  for burst in 10 100; do
    one "bw$burst" "$BIN" --route ipc --only bandwidth --sizes-mib 1,4,16 --bw-iters "$burst"
  done
fi
"$PY" - "$OUT" "${ROUNDS:-2}" <<'PY'
import json, pathlib, sys
out, rounds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
def rows(name, bench):
    f = out / f"{name}.jsonl"
    got = [json.loads(l) for l in f.read_text().splitlines() if l.startswith("{")] if f.exists() else []
    return [r for r in got if r.get("bench") == bench and not r.get("skipped")]
print("network route ping-pong, one way, us (median of the run): inline asks on / off (off / on)")
for r in range(1, rounds + 1):
    on = {(x["mode"], x["bytes"]): x for x in rows(f"inline1_r{r}", "device_pingpong")}
    off = {(x["mode"], x["bytes"]): x for x in rows(f"inline0_r{r}", "device_pingpong")}
    for key in sorted(set(on) | set(off)):
        a, b = on.get(key, {}).get("one_way_us"), off.get(key, {}).get("one_way_us")
        ratio = f"{b / a:.2f}" if a and b else "-"
        ok = all(x.get(key, {}).get("ok", False) for x in (on, off))
        print(f"  round {r} {key[0]:>10} {key[1]:>6} B: {a if a else '-':>9} / {b if b else '-':>9}  ({ratio})  ok={ok}")
print("large puts over IPC against the copy ceiling (put / ceiling)")
for burst in (10, 100):
    for x in rows(f"bw{burst}", "device_put_bandwidth"):
        print(f"  {burst:>3} puts of {x['bytes'] >> 20:>3} MiB: put {x['put_gbps']} GB/s, ceiling {x['ceiling_gbps']} GB/s, "
              f"ratio {x['put_vs_ceiling']}, wrong bytes {x['wrong_bytes']}, ok={x['ok']}")
PY
