//! Where NVRTC and the CUDA headers live on a host: the loader path, the CUDA
//! toolkit, or the `nvidia-*` Python wheels that PyTorch installs.
//!
//! Environment overrides (colon-separated folder lists, searched first):
//! - `ACCORD_CUDA_LIB_DIRS`: folders holding `libnvrtc.so*`.
//! - `ACCORD_CUDA_INCLUDE_DIRS`: folders holding `cuda_fp16.h` / `cuda_bf16.h`.
//! - `CUDA_HOME`, `CUDA_PATH`: a CUDA toolkit root.
//!
//! A script can make NVRTC visible to any program with
//! `export LD_LIBRARY_PATH=$(accord-cuda-check --print-nvrtc-dirs):$LD_LIBRARY_PATH`.

use std::path::{Path, PathBuf};

/// Environment variable listing extra library folders.
pub const ENV_LIB_DIRS: &str = "ACCORD_CUDA_LIB_DIRS";
/// Environment variable listing extra include folders.
pub const ENV_INCLUDE_DIRS: &str = "ACCORD_CUDA_INCLUDE_DIRS";
/// Most site-packages folders looked at, so a crowded `/opt` cannot make discovery slow.
pub const SITE_PACKAGES_DIRS_MAX: usize = 32;

/// Folders under a site-packages folder where the CUDA 13 / 12 wheels put libraries.
const WHEEL_LIB_SUBDIRS: &[&str] = &["nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib", "nvidia/cu12/lib"];
/// Folders under a site-packages folder where the wheels put headers.
const WHEEL_INCLUDE_SUBDIRS: &[&str] =
    &["nvidia/cu13/include", "nvidia/cuda_nvrtc/include", "nvidia/cuda_runtime/include", "nvidia/cu12/include"];

/// Folders holding `libnvrtc.so*`, best first, without duplicates.
pub fn nvrtc_library_dirs() -> Vec<PathBuf> {
    let mut candidates = env_dirs(ENV_LIB_DIRS);
    for root in toolkit_roots() {
        candidates.push(root.join("lib64"));
        candidates.push(root.join("targets/x86_64-linux/lib"));
        candidates.push(root.join("targets/sbsa-linux/lib"));
    }
    for site in site_packages_dirs() {
        candidates.extend(WHEEL_LIB_SUBDIRS.iter().map(|sub| site.join(sub)));
    }
    dirs_containing(candidates, |name| name.starts_with("libnvrtc.so"))
}

/// Folders holding `cuda_fp16.h`, best first, without duplicates. Passed to
/// NVRTC as `--include-path`.
pub fn cuda_include_dirs() -> Vec<PathBuf> {
    let mut candidates = env_dirs(ENV_INCLUDE_DIRS);
    for root in toolkit_roots() {
        candidates.push(root.join("include"));
        candidates.push(root.join("targets/x86_64-linux/include"));
        candidates.push(root.join("targets/sbsa-linux/include"));
    }
    for site in site_packages_dirs() {
        candidates.extend(WHEEL_INCLUDE_SUBDIRS.iter().map(|sub| site.join(sub)));
    }
    dirs_containing(candidates, |name| name == "cuda_fp16.h")
}

/// [`nvrtc_library_dirs`] joined with `:`, ready for `LD_LIBRARY_PATH`.
pub fn nvrtc_library_path() -> String {
    join_paths(&nvrtc_library_dirs())
}

/// Joins folders with `:`.
pub fn join_paths(dirs: &[PathBuf]) -> String {
    dirs.iter().map(|d| d.to_string_lossy().into_owned()).collect::<Vec<_>>().join(":")
}

/// Splits a `:`-separated list, dropping empty entries.
pub fn split_paths(list: &str) -> Vec<PathBuf> {
    list.split(':').filter(|s| !s.is_empty()).map(PathBuf::from).collect()
}

fn env_dirs(name: &str) -> Vec<PathBuf> {
    // `env` fails only for a name or kind the table lacks (accord-knobs' tests).
    accord_knobs::env::<String>(name).ok().flatten().map(|v| split_paths(&v)).unwrap_or_default()
}

fn toolkit_roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> =
        ["CUDA_HOME", "CUDA_PATH"].iter().filter_map(std::env::var_os).map(PathBuf::from).collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    roots.extend(children_matching(Path::new("/usr/local"), |n| n.starts_with("cuda-")));
    roots
}

/// Python site-packages folders: active virtualenv/conda first, then common
/// system and `/opt/*` layouts. At most [`SITE_PACKAGES_DIRS_MAX`].
pub fn site_packages_dirs() -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> =
        ["VIRTUAL_ENV", "CONDA_PREFIX"].iter().filter_map(std::env::var_os).map(PathBuf::from).collect();
    for opt in children_matching(Path::new("/opt"), |_| true) {
        prefixes.push(opt.join(".venv"));
        prefixes.push(opt.join("venv"));
        prefixes.push(opt.clone());
    }
    prefixes.push(PathBuf::from("/usr/local"));
    prefixes.push(PathBuf::from("/usr"));
    if let Some(home) = std::env::var_os("HOME") {
        prefixes.push(PathBuf::from(home).join(".local"));
    }
    let mut sites = Vec::new();
    for prefix in prefixes {
        for python in children_matching(&prefix.join("lib"), |n| n.starts_with("python3")) {
            for leaf in ["site-packages", "dist-packages"] {
                let site = python.join(leaf);
                if site.is_dir() {
                    sites.push(site);
                }
            }
        }
        if sites.len() >= SITE_PACKAGES_DIRS_MAX {
            break;
        }
    }
    let dist = PathBuf::from("/usr/lib/python3/dist-packages");
    if dist.is_dir() {
        sites.push(dist);
    }
    sites.truncate(SITE_PACKAGES_DIRS_MAX);
    sites
}

fn children_matching(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(&keep))
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    out.sort();
    out
}

/// Keeps the candidate folders that hold a file whose name satisfies
/// `has_file`, in order, each once.
pub fn dirs_containing(candidates: Vec<PathBuf>, has_file: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = Vec::new();
    for dir in candidates {
        let canonical = dir.canonicalize().unwrap_or(dir);
        if found.contains(&canonical) {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&canonical) else { continue };
        if entries.flatten().any(|e| e.file_name().to_str().is_some_and(&has_file)) {
            found.push(canonical);
        }
    }
    found
}

#[cfg(test)]
mod tests;
