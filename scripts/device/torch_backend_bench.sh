#!/usr/bin/env bash
# Issue 20's acceptance run for the torch.distributed backend "accord", in one command:
#   CPU:  DDP (~50M-parameter MLP) and FSDP2 step time, 4 and 8 ranks, "accord" vs "gloo"; op
#         busbw through torch.distributed vs `accord bench` at the same sizes (1-64 MiB).
#   CUDA: (when 2+ GPUs) DDP step time on 2 GPUs, "accord" vs "nccl"; all_reduce / all_gather
#         busbw 1-256 MiB; the SMs each uses (kernels and their CTAs from torch.profiler, and
#         NCCL's channel count from NCCL_DEBUG=INFO). CUDA tensors go through the copy-engine
#         GPU collectives (ACCORD_TORCH_GPU=0 stages them through host memory instead).
# Prints the tables at the end; JSON lines stay in $OUT.
# Usage (GPU host, repo root): scripts/device/torch_backend_bench.sh   (OUT=dir to keep files;
# PARTS="cpu cuda" by default, PARTS=cuda for the GPU rows only; CPU_SKIP=ddp,local passes
# --skip to the CPU runs, e.g. when ddp_cpu_variants.sh times DDP in the same call; OP_ROUNDS,
# default 3, the rounds of each op row, torch and direct alternating which goes first)
# Needs torch, and either cargo (builds the accord CLI and the Python extension; no maturin, no
# network) or BIN_DIR holding a prebuilt `accord` and `lib_accord.so` (the GPU host has no Rust:
# build them here with `cargo build --release -p accord-py -p accord-cli` and carry them).
# Budget: about 6 minutes on the 2xH200 host; BUDGET_S (default 450 s, from the start, build
# included) caps the whole command under 8 minutes (see `run_capped` below).
set -uo pipefail
DEFAULT_BUDGET_S=450
. "$(dirname "$0")/budget.sh"

# The accord package from this tree: the extension (built here, or carried), beside the Python
# sources.
stage_package "${BIN_DIR:-}"
echo "load at the start: $(uptime)"
BIN="$STAGED_BIN_DIR/accord"
# `accord bench` took nccl-tests' flags (issue 22): the rank count is --ranks, -n iterations.
RANKS_FLAG="-n"; ITERS_FLAG="-i"
if "$BIN" bench all-reduce --help 2>/dev/null | grep -q -- "--ranks"; then RANKS_FLAG="--ranks"; ITERS_FLAG="-n"; fi
RUN="$PY -m torch.distributed.run --standalone"

# One budget for the whole command (BUDGET_S, counted from the start): each run's cap is the
# smaller of its own and what is left (budget.sh's `capped`); a run with under 10 s left is skipped.
run_capped() {  # run_capped SECONDS CMD...: runs CMD under `timeout`, or says it was skipped for time
  local t; t=$(capped "$1" 10) || { shift; echo "skipped for the time budget: $*" >&2; return 1; }
  shift
  timeout -k 10 "$t" "$@"
}

PARTS="${PARTS:-cpu cuda}"
# The op rows and `accord bench` are timed alike (issue 20's py/cli column): the same sizes,
# rank count, warm-up and count, and the slowest rank's mean both (-a 3; the CLI's default is
# the mean over ranks).
OP_WARMUP="${OP_WARMUP:-5}"; OP_ITERS="${OP_ITERS:-20}"; OP_ROUNDS="${OP_ROUNDS:-3}"
for n in 4 8; do
  case " $PARTS " in *" cpu "*) ;; *) break ;; esac
  for b in accord gloo; do
    echo "== cpu $b n=$n" >&2
    # No GPU visible to CPU runs: FSDP2's fully_shard would pick cuda:<rank>, which does not
    # exist past the host's GPU count (the 05:54 call failed so at 4 and 8 ranks).
    CUDA_VISIBLE_DEVICES= run_capped 150 $RUN --nproc_per_node "$n" "$HERE/torch_backend_bench.py" --backend "$b" --device cpu \
      ${CPU_SKIP:+--skip "$CPU_SKIP"} --op-warmup "$OP_WARMUP" --op-iters "$OP_ITERS" --op-rounds "$OP_ROUNDS" > "$OUT/torch_${b}_cpu_${n}.jsonl" 2> "$OUT/torch_${b}_cpu_${n}.err" || { echo "cpu $b n=$n FAILED"; tail -n 15 "$OUT/torch_${b}_cpu_${n}.err"; }
  done
  for op in all_reduce all_gather reduce_scatter all_to_all; do
    sub=${op//_/-}
    # The backend runs all_to_all_single as all_to_allv (split sizes are per rank): the CLI row
    # is the same collective where the CLI has it (`accord bench all-to-allv`, stop 45).
    if [ "$op" = all_to_all ] && "$BIN" bench all-to-allv --help > /dev/null 2>&1; then sub=all-to-allv; fi
    run_capped 60 "$BIN" bench "$sub" "$RANKS_FLAG" "$n" -b 1M -e 64M -f 4 -w "$OP_WARMUP" "$ITERS_FLAG" "$OP_ITERS" -a 3 --json > "$OUT/cli_${op}_${n}.json" 2>/dev/null \
      || echo "accord bench $op n=$n FAILED or skipped for time ($RANKS_FLAG ranks, $ITERS_FLAG iterations)"
  done
done

if [[ " $PARTS " != *" cuda "* ]]; then
  echo "PARTS=$PARTS: CUDA rows skipped"
elif [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
  for b in accord nccl; do
    echo "== cuda $b n=2" >&2
    # NCCL_DEBUG=INFO (INIT, GRAPH) logs the channels NCCL sets up: its SM count per kernel.
    # CUDA steps take milliseconds, so 30 timed steps (CUDA_ITERS) cost little. With the CPU
    # rows' 5, one late step can move the mean a lot: session 52's row gave 1.55x NCCL, against
    # 1.15-1.27x as the medians of 30- and 50-step rounds in the same session.
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH \
    run_capped 150 $RUN --nproc_per_node 2 "$HERE/torch_backend_bench.py" --backend "$b" --device cuda --skip fsdp2 \
      --warmup 5 --iters "${CUDA_ITERS:-30}" \
      --ops all_reduce,all_gather --sizes 1048576,4194304,16777216,67108864,268435456 \
      > "$OUT/torch_${b}_cuda_2.jsonl" 2> "$OUT/torch_${b}_cuda_2.err" || { echo "cuda $b FAILED"; tail -n 15 "$OUT/torch_${b}_cuda_2.err"; }
  done
else
  echo "fewer than 2 GPUs: CUDA rows skipped"
fi
echo "load at the end: $(uptime)"
"$PY" "$HERE/torch_backend_bench.py" --backend none --report "$OUT"
echo "files: $OUT"
