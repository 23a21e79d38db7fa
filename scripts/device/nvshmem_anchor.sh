#!/usr/bin/env bash
# Issue 19's NVSHMEM anchor: NVSHMEM's own device-initiated put-with-signal on the same 2-GPU
# host as Accord's device-API runs (scripts/device/device_api.sh), so Accord's ping-pong and
# large-put rows have the established library's figures beside them. Builds
# nvshmem_putsignal.cu with nvcc against the NVSHMEM that Python's site-packages already hold
# (the nvidia-nvshmem-cu13 wheel PyTorch depends on: headers, libnvshmem_host.so.3,
# libnvshmem_device.a, the unique-id bootstrap plugin) and runs it as two processes, PE0 on GPU 0
# and PE1 on GPU 1, each under `timeout`.
#
# Usage (GPU host, from the repository root or a carried copy of this folder):
#   bash scripts/device/nvshmem_anchor.sh [--dry-run | --compile-only | --carry DIR]
#   --dry-run       find NVSHMEM and nvcc, print the build and run commands, build and run nothing
#   --compile-only  build the binary and stop (needs nvcc and NVSHMEM, no GPU)
#   --carry DIR     copy this script and nvshmem_putsignal.cu into DIR (a self-contained folder to
#                   carry to the GPU host) and stop
#   --beside ACCORD NVSHMEM  print the rows of two JSON-lines files side by side (Accord's from
#                   device_api.sh, e.g. $OUT/ipc.jsonl; NVSHMEM's nvshmem.jsonl) and stop
# Environment: NVSHMEM_HOME (skip the search; a folder with include/ and lib/), PYTHON (default
# python3: whose site-packages are searched), NVCC (default: nvcc on PATH, $CUDA_HOME/bin/nvcc,
# /usr/local/cuda/bin/nvcc), ARCH (default from nvidia-smi's compute capability, else sm_90),
# OUT (default a new temporary folder: pe0.txt, pe1.txt, nvshmem.jsonl), BUILD_DIR (default a new
# temporary folder), BUDGET_S (default 115: the whole command, build included), LIMIT_S (default 60:
# one attempt's bound, cut to what is left of BUDGET_S), ITERS, RUNS, BW_ITERS, THREADS,
# SIZES_MIB (the program's --iters, --runs, --bw-iters, --threads, --sizes-mib), BESIDE (an
# Accord rows file: after the run, its rows and NVSHMEM's are printed side by side).
#
# Prints "NVSHMEM not available: <why>" and exits 0 when the library or its headers are absent,
# and "NVSHMEM anchor not run: <why>" (exit 0) without nvcc or without 2 GPUs. Exits 1 when the
# build fails or a run fails (a wrong byte, a watchdog, a timeout). A run that fails before any
# row (initialisation) is tried once more with NVSHMEM_DISABLE_CUDA_VMM=1 (IPC handles instead of
# VMM sharing), and the output says so.
set -uo pipefail

# NVLink multicast stays off: on a shared host it can put the GPUs out of service.
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python3}"
MODE=run
case "${1:-}" in
  "") ;;
  --dry-run) MODE=dry ;;
  --compile-only) MODE=compile ;;
  --carry)
    [ -n "${2:-}" ] || { echo "nvshmem_anchor: --carry needs a folder"; exit 2; }
    MODE=carry ;;
  --beside)
    [ -n "${2:-}" ] && [ -n "${3:-}" ] || { echo "nvshmem_anchor: --beside needs Accord's and NVSHMEM's rows files"; exit 2; }
    MODE=beside ;;
  *) echo "nvshmem_anchor: unknown argument '$1' (--dry-run, --compile-only, --carry DIR, --beside A N)"; exit 2 ;;
esac

# beside ACCORD_ROWS NVSHMEM_ROWS: ping-pong one way and large-put bandwidth of both, one table
# each, rows matched by bytes; a missing value is shown as "-", lines that are not JSON skipped.
beside() {
  "$PY" - "$1" "$2" <<'PYEOF'
import json, sys

def rows(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict) and "skipped" not in row:
                    out.append(row)
    except OSError as e:
        print(f"# cannot read {path}: {e.strerror}")
    return out

def num(row, key, fmt):
    v = row.get(key)
    return format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"

def size(row):
    b = row.get("bytes")
    return b if isinstance(b, int) else 0

accord, nvshmem = rows(sys.argv[1]), rows(sys.argv[2])
print(f"# ping-pong, kernel to kernel, one way = half the median round trip ({sys.argv[1]} beside {sys.argv[2]})")
print(f"# {'library':>8} {'mode':>30} {'bytes':>7} {'one_way_us':>11} {'rtt_p99_us':>11} {'ok':>5}")
ping = [("accord", r) for r in accord if r.get("bench") == "device_pingpong"]
ping += [("nvshmem", r) for r in nvshmem if r.get("bench") == "device_pingpong"]
for lib, r in sorted(ping, key=lambda p: (size(p[1]), p[0])):
    print(f"  {lib:>8} {str(r.get('mode', '-')):>30} {str(r.get('bytes', '-')):>7}"
          f" {num(r, 'one_way_us', '.2f'):>11} {num(r, 'rtt_p99_us', '.2f'):>11} {str(r.get('ok', '-')):>5}")
print("# large puts, one issuing CTA: GB/s, and the fraction of the same run's copy ceiling")
print(f"# {'bytes':>11} {'accord_GB/s':>12} {'accord/ceil':>12} {'nvshmem_GB/s':>13} {'nvshmem/ceil':>13}"
      f" {'nvshmem_SMs':>12}")
bw_a = {size(r): r for r in accord if r.get("bench") == "device_put_bandwidth"}
bw_n = {size(r): r for r in nvshmem if r.get("bench") == "device_put_bandwidth"}
for b in sorted(set(bw_a) | set(bw_n)):
    a, n = bw_a.get(b, {}), bw_n.get(b, {})
    print(f"  {b:>11} {num(a, 'put_gbps', '.1f'):>12} {num(a, 'put_vs_ceiling', '.3f'):>12}"
          f" {num(n, 'put_gbps', '.1f'):>13} {num(n, 'put_vs_ceiling', '.3f'):>13} {num(n, 'copy_sms', 'd'):>12}")
PYEOF
}

# The program's source: beside this script in a carried folder, else in the repository.
if [ -f "$HERE/nvshmem_putsignal.cu" ]; then
  SRC="$HERE/nvshmem_putsignal.cu"
else
  SRC="$HERE/../../examples/anchors/nvshmem_putsignal.cu"
fi
[ -f "$SRC" ] || { echo "nvshmem_anchor: no nvshmem_putsignal.cu beside this script or in examples/anchors"; exit 1; }
SRC="$(cd "$(dirname "$SRC")" && pwd)/$(basename "$SRC")"

if [ "$MODE" = beside ]; then
  beside "$2" "$3"
  exit 0
fi

if [ "$MODE" = carry ]; then
  mkdir -p "$2" || exit 1
  cp "${BASH_SOURCE[0]}" "$2/nvshmem_anchor.sh" && cp "$SRC" "$2/nvshmem_putsignal.cu" || exit 1
  echo "carried folder $2: $(cd "$2" && ls | tr '\n' ' ')"
  exit 0
fi

not_available() {
  echo "NVSHMEM not available: $*"
  exit 0
}

# find_nvshmem: the NVSHMEM folder (include/ and lib/) on stdout, or why not on stderr.
find_nvshmem() {
  if [ -n "${NVSHMEM_HOME:-}" ]; then
    echo "$NVSHMEM_HOME"
    return 0
  fi
  command -v "$PY" >/dev/null 2>&1 || { echo "no python ($PY) to search site-packages with" >&2; return 1; }
  "$PY" - <<'EOF'
import os, site, sys
candidates = []
try:
    import nvidia.nvshmem as m
    candidates += list(getattr(m, "__path__", []))
    if getattr(m, "__file__", None):
        candidates.append(os.path.dirname(m.__file__))
    why = "python imports nvidia.nvshmem, but no folder of it holds include/nvshmem.h"
except Exception as e:  # the namespace path below is the fallback
    why = f"python cannot import nvidia.nvshmem ({type(e).__name__}: {e}) and no site-packages holds nvidia/nvshmem/include/nvshmem.h"
roots = list(sys.path)
try:
    roots += site.getsitepackages() + [site.getusersitepackages()]
except Exception:
    pass
candidates += [os.path.join(r, "nvidia", "nvshmem") for r in roots if r]
for c in candidates:
    if os.path.isfile(os.path.join(c, "include", "nvshmem.h")):
        print(os.path.realpath(c))
        sys.exit(0)
print(why, file=sys.stderr)
sys.exit(1)
EOF
}

WHY=$(find_nvshmem 2>&1 >/dev/null) || not_available "$WHY"
NV=$(find_nvshmem 2>/dev/null)
for f in include/nvshmem.h include/nvshmemx.h lib/libnvshmem_device.a; do
  [ -f "$NV/$f" ] || not_available "$NV has no $f"
done
HOST_LIB=""
for f in lib/libnvshmem_host.so.3 lib/libnvshmem_host.so; do [ -f "$NV/$f" ] && { HOST_LIB="$NV/$f"; break; }; done
[ -n "$HOST_LIB" ] || not_available "$NV has no lib/libnvshmem_host.so.3"
UID_PLUGIN=""
for f in lib/nvshmem_bootstrap_uid.so.3 lib/nvshmem_bootstrap_uid.so; do [ -f "$NV/$f" ] && { UID_PLUGIN="$NV/$f"; break; }; done
[ -n "$UID_PLUGIN" ] || not_available "$NV has no lib/nvshmem_bootstrap_uid.so.3 (the unique-id bootstrap)"
VERSION=$(sed -n 's/^#define NVSHMEM_VENDOR_\(MAJOR\|MINOR\|PATCH\)_VERSION \([0-9]*\).*/\2/p' \
  "$NV/include/non_abi/nvshmem_version.h" 2>/dev/null | paste -sd. -)
echo "NVSHMEM ${VERSION:-of unknown version} at $NV"

NVCC_BIN="${NVCC:-}"
if [ -z "$NVCC_BIN" ]; then
  for c in "$(command -v nvcc 2>/dev/null)" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" /usr/local/cuda/bin/nvcc; do
    [ -n "$c" ] && [ -x "$c" ] && { NVCC_BIN="$c"; break; }
  done
fi
if [ -n "${NVCC:-}" ] && [ ! -x "$NVCC_BIN" ]; then
  echo "NVSHMEM anchor not run: NVCC=$NVCC is not an executable"
  exit 0
elif [ -z "$NVCC_BIN" ]; then
  echo "NVSHMEM anchor not run: no nvcc (NVCC unset, none on PATH, none under CUDA_HOME, no /usr/local/cuda/bin/nvcc)"
  exit 0
fi

if [ -z "${ARCH:-}" ]; then
  CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  ARCH="sm_${CAP:-90}"
fi
# A toolkit from pip keeps its libraries in ../lib; a full one finds its own.
CUDA_LIBS=()
for d in "$(dirname "$NVCC_BIN")/../lib64" "$(dirname "$NVCC_BIN")/../lib"; do
  [ -f "$d/libcudart_static.a" ] && CUDA_LIBS+=(-L "$d")
done
# BUILD_DIR is made (and removed after the run) only when the caller gave none.
OWN_BUILD_DIR=0
if [ -z "${BUILD_DIR:-}" ]; then
  if [ "$MODE" = dry ]; then BUILD_DIR="/tmp/nvshmem-anchor-build.XXXXXX"; else
    BUILD_DIR="$(mktemp -d /tmp/nvshmem-anchor-build.XXXXXX)" && OWN_BUILD_DIR=1 || exit 1
  fi
fi
[ "$OWN_BUILD_DIR" -eq 1 ] && [ "$MODE" = run ] && trap 'rm -rf "$BUILD_DIR"' EXIT
BIN="$BUILD_DIR/nvshmem_putsignal"
BUILD=("$NVCC_BIN" -O2 -std=c++17 -rdc=true -arch="$ARCH" -I "$NV/include" "$SRC" -o "$BIN"
  "$NV/lib/libnvshmem_device.a" -Xlinker "$HOST_LIB" ${CUDA_LIBS[@]+"${CUDA_LIBS[@]}"} -Xlinker -rpath,"$NV/lib")

LIMIT_S="${LIMIT_S:-60}" BUDGET_S="${BUDGET_S:-115}"
for v in LIMIT_S BUDGET_S; do
  case "${!v}" in ''|*[!0-9]*) echo "nvshmem_anchor: $v must be whole seconds, not '${!v}'"; exit 2 ;; esac
  [ "${!v}" -ge 20 ] || { echo "nvshmem_anchor: $v must be at least 20"; exit 2; }
done
# The heap holds the bandwidth source and destination of the largest size, and 256 MiB for
# NVSHMEM's own objects and the small buffers.
[[ "${SIZES_MIB:-1}" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "nvshmem_anchor: SIZES_MIB must be whole MiB separated by commas, not '$SIZES_MIB'"; exit 2; }
MAX_MIB=$(echo "${SIZES_MIB:-1,4,16,64,256}" | tr ',' '\n' | sort -n | tail -1)
# Bootstrap over loopback only; one host, so no remote transport and no NCCL.
RUN_ENV=(NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
  NVSHMEM_BOOTSTRAP=UID NVSHMEM_BOOTSTRAP_UID_PLUGIN="$UID_PLUGIN" NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=lo
  NVSHMEM_REMOTE_TRANSPORT=none NVSHMEM_DISABLE_NCCL=1
  NVSHMEM_SYMMETRIC_SIZE="${NVSHMEM_SYMMETRIC_SIZE:-$((2 * MAX_MIB + 256))M}"
  LD_LIBRARY_PATH="$NV/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
ARGS=(--iters "${ITERS:-1000}" --runs "${RUNS:-5}" --bw-iters "${BW_ITERS:-10}" --threads "${THREADS:-1024}"
  --sizes-mib "${SIZES_MIB:-1,4,16,64,256}")
# limits CAP: the program's own bounds inside a `timeout` of CAP seconds (its watchdog speaks first).
limits() {
  local step=$(( $1 - 10 < 30 ? $1 - 10 : 30 ))
  echo --timeout-s $(( $1 - 5 )) --step-timeout-s $step --id-wait-s $step
}

if [ "$MODE" = dry ]; then
  echo "build: ${BUILD[*]}"
  echo "run (each PE under timeout -k 5 $LIMIT_S): env ${RUN_ENV[*]} $BIN --pe {0,1} --id-file $BUILD_DIR/uid ${ARGS[*]} $(limits "$LIMIT_S")"
  echo "budget: $BUDGET_S s for the whole command"
  echo "output: ${OUT:-a new folder /tmp/nvshmem-anchor-out.XXXXXX}"
  exit 0
fi

mkdir -p "$BUILD_DIR" || exit 1
START=$SECONDS  # the budget counts from the build
echo "== build ($ARCH): ${BUILD[*]}"
BUILD_CAP=$(( BUDGET_S - 25 < 90 ? BUDGET_S - 25 : 90 ))
[ "$BUILD_CAP" -ge 10 ] || BUILD_CAP=10
timeout -k 5 "$BUILD_CAP" "${BUILD[@]}" > "$BUILD_DIR/build.txt" 2>&1
BUILD_RC=$?
if [ "$BUILD_RC" -ne 0 ]; then
  cat "$BUILD_DIR/build.txt"
  echo "nvshmem_anchor: FAILED: nvcc could not build $SRC (exit $BUILD_RC; 124: over $BUILD_CAP s)"
  exit 1
fi
echo "   built in $((SECONDS - START)) s"
[ "$MODE" = compile ] && { echo "binary: $BIN"; exit 0; }

GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "${GPUS:-0}" -lt 2 ]; then
  echo "NVSHMEM anchor not run: needs 2 GPUs, nvidia-smi lists ${GPUS:-0}"
  exit 0
fi
OUT="${OUT:-$(mktemp -d /tmp/nvshmem-anchor-out.XXXXXX)}"
mkdir -p "$OUT" || exit 1

# attempt NAME EXTRA_ENV...: both PEs, each bounded by LIMIT_S and by what is left of BUDGET_S
# (less 5 s for the kill grace); 0 when both exit 0; 1 (and says so) when too little is left.
attempt() {
  local name=$1; shift
  local uid="$BUILD_DIR/uid.$name"
  local cap=$(( BUDGET_S - (SECONDS - START) - 5 ))
  : > "$OUT/pe0.txt"; : > "$OUT/pe1.txt"
  [ "$cap" -le "$LIMIT_S" ] || cap=$LIMIT_S
  if [ "$cap" -lt 20 ]; then
    echo "== $name: skipped, $cap s left of the $BUDGET_S s budget"
    return 1
  fi
  local bounds; bounds=$(limits "$cap")
  rm -f "$uid"
  echo "== $name: 2 PEs (at most $cap s each)${*:+ with $*}"
  # shellcheck disable=SC2086  # $bounds is flags and numbers only
  env "${RUN_ENV[@]}" "$@" timeout -k 5 "$cap" "$BIN" --pe 0 --id-file "$uid" "${ARGS[@]}" $bounds > "$OUT/pe0.txt" 2>&1 &
  local p0=$!
  # shellcheck disable=SC2086
  env "${RUN_ENV[@]}" "$@" timeout -k 5 "$cap" "$BIN" --pe 1 --id-file "$uid" "${ARGS[@]}" $bounds > "$OUT/pe1.txt" 2>&1 &
  local p1=$!
  wait "$p0"; local rc0=$?
  wait "$p1"; local rc1=$?
  echo "   PE0 exit $rc0, PE1 exit $rc1 ($((SECONDS - START)) s since the build started)"
  [ "$rc0" -eq 124 ] || [ "$rc1" -eq 124 ] && echo "   (124: cut by timeout after $cap s)"
  [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ]
}

FAILED=0
if ! attempt default; then
  FAILED=1
  if ! grep -q '^{' "$OUT/pe0.txt"; then
    echo "   no row came back; PE0 said:"; tail -5 "$OUT/pe0.txt" | sed 's/^/     /'
    echo "   PE1 said:"; tail -5 "$OUT/pe1.txt" | sed 's/^/     /'
    mv "$OUT/pe0.txt" "$OUT/pe0-vmm.txt"; mv "$OUT/pe1.txt" "$OUT/pe1-vmm.txt"
    attempt no-vmm NVSHMEM_DISABLE_CUDA_VMM=1 && FAILED=0
  fi
fi
grep '^{' "$OUT/pe0.txt" > "$OUT/nvshmem.jsonl"
echo
echo "######## nvshmem (PE0)"
grep -v '^{' "$OUT/pe0.txt"
echo "######## nvshmem (PE1)"
grep -v '^{' "$OUT/pe1.txt"
echo
echo "rows: $(wc -l < "$OUT/nvshmem.jsonl") in $OUT/nvshmem.jsonl; $((SECONDS - START)) s"
if [ -n "${BESIDE:-}" ]; then
  echo
  echo "######## beside Accord"
  beside "$BESIDE" "$OUT/nvshmem.jsonl"
fi
[ "$FAILED" -eq 0 ] || echo "nvshmem_anchor: FAILED (see $OUT)"
exit $FAILED
