//! Where the plugin's shared library is, for the tests that load it as NCCL does (`dlopen`).

use std::path::PathBuf;

/// `libnccl_net_accord.so` of this build: `cargo test` refreshes the copy in deps/ (the one in
/// the profile directory is uplifted by `cargo build` only and may be stale).
pub fn plugin_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps directory");
    for dir in [deps, deps.parent().expect("profile directory")] {
        let candidate = dir.join("libnccl_net_accord.so");
        if candidate.exists() {
            return candidate;
        }
    }
    panic!("libnccl_net_accord.so not found next to {}: build the crate first", exe.display());
}
