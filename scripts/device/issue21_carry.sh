#!/usr/bin/env bash
# Fills the folder that issue 21's device call carries (run here, on the build machine):
# the stripped plugin, this directory's scripts that scripts/device/issue21.sh runs, nccl-tests'
# source tarball and the mpich wheel, side by side, so `bash DIR/issue21.sh $OUT` runs from any
# checkout on the GPU host.
# Usage: scripts/device/issue21_carry.sh DIR
# Env:   NCCL_TESTS_TARBALL (default /work/main/.carry/peers/nccl-tests.tar.gz), MPICH_WHEEL (default:
#        pip download of mpich==5.0.2 for CPython 3.12 on manylinux_2_28_x86_64, unless DIR has one)
set -euo pipefail
DIR=${1:?carried folder}
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
mkdir -p "$DIR"
(cd "$ROOT" && nice -n 10 cargo build --release -p accord-nccl-net)
install -m 0644 "$ROOT/target/release/libnccl_net_accord.so" "$DIR/libnccl-net-accord.so"
strip "$DIR/libnccl-net-accord.so"
for f in issue21.sh issue21_verdict.py nccl_tests.sh transports.sh ddp_transports.sh ddp_transports.py ddp_transports_table.py; do
    install -m 0755 "$ROOT/scripts/device/$f" "$DIR/$f"
done
[ -e "$DIR/nccl-tests.tar.gz" ] || cp "${NCCL_TESTS_TARBALL:-/work/main/.carry/peers/nccl-tests.tar.gz}" "$DIR/nccl-tests.tar.gz"
if [ -n "${MPICH_WHEEL:-}" ]; then
    cp "$MPICH_WHEEL" "$DIR/"
elif ! ls "$DIR"/mpich-*.whl >/dev/null 2>&1; then
    python3 -m pip download --no-deps --python-version 3.12 --only-binary=:all: \
        --platform manylinux_2_28_x86_64 mpich==5.0.2 -d "$DIR"
fi
(cd "$ROOT" && git rev-parse --short HEAD) >"$DIR/COMMIT"
du -sh "$DIR"
