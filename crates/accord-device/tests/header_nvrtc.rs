//! Every kernel in `kernels/` and `examples/device_api/` (and so the whole device API in `include/accord/device.cuh`)
//! compiles with NVRTC, through accord-cuda, with the options Accord's own kernels use
//! (`-DACCORD_NVRTC=1`, C++17). NVRTC needs no GPU: this runs wherever libnvrtc is found
//! (`ACCORD_CUDA_LIB_DIRS`, the loader path, a CUDA toolkit, the nvidia-cuda-nvrtc wheel) and
//! prints `skipped: <reason>` elsewhere. Each kernel file is compiled for the architectures of
//! the GPUs present, or for sm_80 and sm_90 without a GPU.

use std::path::{Path, PathBuf};

use accord_cuda::kernels::{arch_name, compile_cached_with_includes};
use accord_cuda::{probe, CudaError};

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `.cu` files of `dir`, sorted by name.
fn cu_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{dir:?}: {e}"))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    files.sort();
    files
}

/// The harness kernels and the user examples under `examples/device_api/`.
fn kernel_files() -> Vec<PathBuf> {
    let mut files = cu_files(&crate_dir().join("kernels"));
    files.extend(cu_files(&crate_dir().join("../../examples/device_api")));
    files
}

/// Folders the kernels include from: the public header's, and the kernels' own (common.cuh).
fn include_dirs() -> Vec<PathBuf> {
    vec![crate_dir().join("include"), crate_dir().join("kernels")]
}

fn architectures() -> Vec<String> {
    let mut arches: Vec<String> = probe().devices.iter().map(|d| arch_name(d.compute_capability)).collect();
    if arches.is_empty() {
        arches = vec!["sm_80".into(), "sm_90".into()];
    }
    arches.sort();
    arches.dedup();
    arches
}

#[test]
fn every_kernel_compiles_with_nvrtc() {
    let availability = probe();
    if !availability.nvrtc {
        println!("skipped: no NVRTC ({})", availability.nvrtc_problem.unwrap_or_default());
        return;
    }
    let files = kernel_files();
    assert!(files.len() >= 7, "expected the harness kernels and the example, found {files:?}");
    let mut failures = Vec::new();
    for arch in architectures() {
        for file in &files {
            let source = std::fs::read_to_string(file).expect("kernel source");
            let name = file.file_name().expect("name").to_string_lossy().into_owned();
            match compile_cached_with_includes(&source, &name, &arch, &include_dirs()) {
                Ok(cubin) => assert!(!cubin.is_empty(), "{name} for {arch}: empty binary"),
                Err(CudaError::Compile { log, .. }) => failures.push(format!("{name} for {arch}:\n{log}")),
                Err(other) => failures.push(format!("{name} for {arch}: {other}")),
            }
        }
    }
    assert!(failures.is_empty(), "kernels that do not compile:\n{}", failures.join("\n"));
}

/// A user kernel that includes only the public header, the way the header's top comment shows,
/// compiles; one that misuses the API (a pointer where a window id goes) does not, with the
/// compiler naming the call: the header's types are checked, not just pasted in.
#[test]
fn the_header_example_compiles_and_misuse_is_refused() {
    if !probe().nvrtc {
        println!("skipped: no NVRTC");
        return;
    }
    let example = r#"
#include <accord/device.cuh>
namespace ad = accord::device;
extern "C" __global__ void ping(const ad::DeviceTable* table, unsigned long long n, int* status) {
  if (threadIdx.x != 0) return;
  unsigned peer = table->rank ^ 1u;
  ad::Status s = ad::OK;
  if (table->rank == 0) {
    s = ad::put(table, 0, peer, 0, 1, 0, n, ad::SIGNAL_ADD, 0, 1);
    if (s == ad::OK) s = ad::wait_signal(table, 0, 1, 1000000000ull);
  } else {
    s = ad::wait_signal(table, 0, 1, 1000000000ull);
    if (s == ad::OK) s = ad::signal(table, peer, 0, ad::SIGNAL_ADD, 1);
  }
  *status = s;
}
"#;
    let header_only = [crate_dir().join("include")];
    let built = compile_cached_with_includes(example, "example.cu", "sm_90", &header_only);
    assert!(built.is_ok(), "the header's example must compile: {built:?}");
    let misuse = example.replace("ad::put(table, 0, peer", "ad::put(table, status, peer");
    match compile_cached_with_includes(&misuse, "misuse.cu", "sm_90", &header_only) {
        Err(CudaError::Compile { log, .. }) => assert!(log.contains("put"), "{log}"),
        other => panic!("a pointer passed as a window id must not compile, got {other:?}"),
    }
}
