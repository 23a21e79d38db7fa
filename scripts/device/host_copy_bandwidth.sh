#!/usr/bin/env bash
# Prints this host's aggregate memcpy bandwidth (scripts/device/copy_bandwidth.c), one line, so
# a benchmark table carries the state of the host it ran on: a same-host transport copies each
# byte twice and its ceiling moves with what other tenants leave of the memory bandwidth.
# Usage: scripts/device/host_copy_bandwidth.sh [THREADS (default 12)]   (needs cc; else says so)
set -uo pipefail
SRC="$(dirname "$0")/copy_bandwidth.c"
BIN="${TMPDIR:-/tmp}/accord-copy-bandwidth-$(id -u)"
if ! command -v cc >/dev/null; then
    echo "copy bandwidth: skipped (no C compiler on this host)"
    exit 0
fi
if [ ! -x "$BIN" ] || [ "$SRC" -nt "$BIN" ]; then
    cc -O2 -pthread -o "$BIN" "$SRC" || { echo "copy bandwidth: skipped (build failed)"; exit 0; }
fi
"$BIN" "${1:-12}" 16777216 65536 1
