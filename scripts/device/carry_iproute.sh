#!/usr/bin/env bash
# Copies this machine's `ip` (iproute2) and every shared library it loads, its dynamic loader
# and C library included, into DEST, so that scripts/device/nic_failover.sh can make network
# namespaces on a host without iproute2 (the GPU hosts have none):
#
#   scripts/device/carry_iproute.sh .carry/iproute
#   IP_BIN=.carry/iproute/ip IP_LIB_DIR=.carry/iproute scripts/device/nic_failover.sh OUT
#
# Why the loader and libc too: the copy must not depend on the other host's C library being
# as new as this one's (`ip` built against glibc 2.36 does not start on an older one).
# nic_failover.sh runs it as `DEST/ld-linux-x86-64.so.2 --library-path DEST DEST/ip ...`, so
# nothing of DEST reaches the environment of the programs `ip netns exec` starts.
#
# Knobs: IP_SRC (the `ip` to copy; default: the one on PATH). Prints what it copied; exits
# non-zero, naming the reason, when `ip` or `ldd` is missing or a library cannot be found.
set -euo pipefail

DEST=${1:?usage: scripts/device/carry_iproute.sh DEST}
IP_SRC=${IP_SRC:-$(command -v ip || true)}
[ -n "$IP_SRC" ] || { echo "carry_iproute: no 'ip' on PATH here; set IP_SRC" >&2; exit 1; }
IP_SRC=$(readlink -f "$IP_SRC")
command -v ldd >/dev/null || { echo "carry_iproute: no ldd here" >&2; exit 1; }

mkdir -p "$DEST"
cp -f "$IP_SRC" "$DEST/ip"
echo "ip: $IP_SRC"
# ldd lines: "name => /path (0x...)", "/path/ld-linux... (0x...)", "linux-vdso.so.1 (0x...)"
# (no file), "name => not found" (refused below).
ldd "$IP_SRC" | while read -r first second third _; do
    if [ "$second" = "=>" ]; then
        [ "$third" != "not" ] || { echo "carry_iproute: $first not found (ldd $IP_SRC)" >&2; exit 1; }
        name=$first path=$third
    elif [ "${first#/}" != "$first" ]; then
        name=$(basename "$first") path=$first
    else
        continue
    fi
    cp -f "$(readlink -f "$path")" "$DEST/$name"
    echo "$name: $path"
done
"$DEST/ld-linux-x86-64.so.2" --library-path "$DEST" "$DEST/ip" -V
du -sh "$DEST" | awk '{print "total: " $1}'
