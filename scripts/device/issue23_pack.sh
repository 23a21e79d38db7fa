#!/usr/bin/env bash
# Makes the bundle scripts/device/issue23.sh runs on the GPU host (run here, at the repo root):
# the accord wheel (maturin, release), the GPU test binaries of the copy shapes (accord-cuda's
# `gpu` tests, accord-engine's library tests; stripped), this checkout's benches and device
# scripts (so the bundle measures this code whatever the device's checkout holds), NIXL and
# Mooncake.
#
#   [MATURIN=path/to/maturin] [NIXL_WHEEL=nixl_cu13-*.whl | NIXL_TREE=nixl-*.tar.xz] \
#     [MOONCAKE_WHEEL=mooncake_transfer_engine_cuda13-*.whl | MOONCAKE_TREE=mooncake-*.tar.xz] \
#     scripts/device/issue23_pack.sh DEST
#
# DEST must be a folder the checkout ignores (the device tool carries ignored folders named in
# `carry`); about 32 MB with NIXL and Mooncake (the carry limit is 64 MiB). NIXL_TREE, when set, is copied in: a .tar.xz of the nixl-cu13
# cp312 wheel's files. NIXL_WHEEL (`pip download nixl-cu13 --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux_2_28_x86_64`) is made into one: unzipped, its
# nixl_ep_cu13/ package (expert-parallel kernels) and UCX's perftest left out, xz-packed (the
# whole wheel is 59 MB, over the carry limit beside the rest; the tree packs to 18 MB).
# MOONCAKE_WHEEL (`pip download mooncake-transfer-engine-cuda13 --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux_2_28_x86_64`, 50 MB) is trimmed the same way to what
# `import mooncake.engine` loads: the package's __init__.py and engine.pyi, engine.so and the
# closure of its NEEDED entries found in the wheel (libasio, libetcd_wrapper, yaml-cpp, jsoncpp,
# glog, gflags), xz-packed (6.5 MB); the store, the master, the client, pg, ep and the transfer
# bench are left out. MOONCAKE_TREE, when set, is copied in.
set -euo pipefail
DEST=${1:?usage: issue23_pack.sh DEST}
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
MATURIN=${MATURIN:-$(command -v maturin || echo target/pyenv/bin/maturin)}
mkdir -p "$DEST/bin" "$DEST/repo/examples" "$DEST/repo/scripts/device"
rm -f "$DEST"/accord-*.whl
nice -n 10 "$MATURIN" build --release --quiet --out "$DEST" --interpreter python3
for spec in "accord-cuda --test gpu:gpu" "accord-engine --lib:accord_engine"; do
  args=${spec%%:*} name=${spec##*:}
  # shellcheck disable=SC2086
  bin=$(nice -n 10 cargo test --release -p $args --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' | tail -1)
  strip -o "$DEST/bin/$name" "$bin"
done
cp examples/gpu_bench.py examples/kv_gpu_bench.py examples/kv_nixl_bench.py examples/weight_push_gpu_bench.py "$DEST/repo/examples/"
cp examples/kv_mooncake_bench.py "$DEST/repo/examples/"
cp scripts/device/budget.sh scripts/device/kv_gpu.sh scripts/device/kv_nixl.sh scripts/device/kv_mooncake.sh \
  scripts/device/weights_gpu.sh scripts/device/issue23.sh "$DEST/repo/scripts/device/"
if [ -n "${NIXL_TREE:-}" ]; then
  cp "$NIXL_TREE" "$DEST/"
elif [ -n "${NIXL_WHEEL:-}" ]; then
  tree=$(mktemp -d)
  python3 -m zipfile -e "$NIXL_WHEEL" "$tree"
  rm -rf "$tree"/nixl_ep_cu13 "$tree"/*.scripts
  find "$tree" -name '*perftest*' -delete
  tar -cJf "$DEST/$(basename "$NIXL_WHEEL" .whl)-trimmed.tar.xz" -C "$tree" .
  rm -rf "$tree"
fi
rm -f "$DEST"/mooncake*.tar.xz
if [ -n "${MOONCAKE_TREE:-}" ]; then
  cp "$MOONCAKE_TREE" "$DEST/"
elif [ -n "${MOONCAKE_WHEEL:-}" ]; then
  tree=$(mktemp -d)
  python3 -m zipfile -e "$MOONCAKE_WHEEL" "$tree"
  # The closure of mooncake/engine.so's NEEDED entries among the wheel's own libraries.
  queue=(mooncake/engine.so) keep=()
  while [ ${#queue[@]} -gt 0 ]; do
    f=${queue[0]}
    queue=("${queue[@]:1}")
    case " ${keep[*]} " in *" $f "*) continue ;; esac
    keep+=("$f")
    for needed in $(readelf -d "$tree/$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      for lib in "mooncake/$needed" "$(cd "$tree" && ls -d mooncake_transfer_engine_*.libs)/$needed"; do
        if [ -e "$tree/$lib" ]; then queue+=("$lib"); fi
      done
    done
  done
  tar -cJf "$DEST/$(basename "$MOONCAKE_WHEEL" .whl)-trimmed.tar.xz" -C "$tree" mooncake/__init__.py mooncake/engine.pyi "${keep[@]}"
  rm -rf "$tree"
fi
du -sh "$DEST"/*
du -sh "$DEST"
