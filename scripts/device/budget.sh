# Sourced by the device scripts (device_api.sh, kv_gpu.sh, torch_backend_bench.sh): the
# environment every run on the GPU host needs, the paths, and the time budget, in one place.
# The caller sets DEFAULT_BUDGET_S first; BUDGET_S overrides it. Defines START, BUDGET, HERE
# (scripts/device), ROOT (the repository), OUT (made), PY, and:
#   left        seconds left of the budget;
#   capped      a run's time limit within what is left;
#   host_facts  the load and the GPUs, printed at a run's start.
START=$SECONDS BUDGET=${BUDGET_S:-${DEFAULT_BUDGET_S:-480}}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"

left() { echo $((BUDGET - (SECONDS - START))); }

# capped CAP [FLOOR]: CAP seconds, or what is left of the budget if less; fails (prints nothing)
# when under FLOOR (default 30) seconds are left, too little to start a run.
capped() {
  local t; t=$(left)
  [ "$t" -ge "${2:-30}" ] || return 1
  if [ "$t" -lt "$1" ]; then echo "$t"; else echo "$1"; fi
}

host_facts() {
  echo "load at the start: $(uptime)"
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not available"
}
