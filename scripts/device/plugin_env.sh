# Sourced first by the scripts that run NCCL with the Accord plugin (nccl_plugin_bench.sh,
# peer_death_torch.sh), with the caller's first argument and its default output folder under
# target/, e.g. `. "$(dirname "$0")/plugin_env.sh" "${1:-}" peer-death`. Moves to the
# repository root; defines ROOT, OUT (made) and PYTHON; keeps NVLink SHARP / multicast off in
# every environment the script starts; and defines
#   accord_plugin  the plugin's absolute path in PLUGIN: $ACCORD_NCCL_PLUGIN, or built here (its
#                  log in $OUT/build.log); calls the caller's fail() when there is none.
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
OUT=${1:-$ROOT/target/$2}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

accord_plugin() {
    if [ -n "${ACCORD_NCCL_PLUGIN:-}" ]; then
        PLUGIN=$ACCORD_NCCL_PLUGIN
    else
        command -v cargo >/dev/null || fail "cargo not found: build elsewhere and set ACCORD_NCCL_PLUGIN"
        cargo build --release -p accord-nccl-net >"$OUT/build.log" 2>&1 || fail "cargo build failed, see $OUT/build.log"
        PLUGIN=$ROOT/target/release/libnccl-net-accord.so
    fi
    PLUGIN=$(readlink -f "$PLUGIN")
    [ -f "$PLUGIN" ] || fail "plugin $PLUGIN does not exist"
}
