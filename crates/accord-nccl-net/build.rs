//! Links `libnccl-net-accord.so` (the name NCCL looks for with `NCCL_NET_PLUGIN=accord`) to the
//! `libnccl_net_accord.so` Cargo builds: Cargo forbids hyphens in library names. The link is
//! made in the profile directory (`target/<profile>/`, three levels above `OUT_DIR`) before the
//! library exists and resolves once it is built.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let Some(out_dir) = std::env::var_os("OUT_DIR").map(PathBuf::from) else { return };
    let Some(profile_dir) = out_dir.ancestors().nth(3) else { return };
    let target = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target != "linux" {
        return;
    }
    let link = profile_dir.join("libnccl-net-accord.so");
    if std::fs::read_link(&link).is_ok_and(|t| t == std::path::Path::new("libnccl_net_accord.so")) {
        return;
    }
    let _ = std::fs::remove_file(&link);
    #[cfg(unix)]
    if let Err(e) = std::os::unix::fs::symlink("libnccl_net_accord.so", &link) {
        println!("cargo:warning=could not link {}: {e}", link.display());
    }
}
