//! Run-time compilation with NVRTC, cached per (source hash, architecture),
//! and modules loaded into a GPU's context.

pub mod cache;

use std::ffi::CString;
use std::sync::{Arc, Mutex, OnceLock};

use crate::context::Gpu;
use crate::error::{CudaError, Result};
use crate::ffi::driver::{self, RawFunction, RawModule};
use crate::ffi::nvrtc::{self, Compiled};
use cache::BoundedCache;

/// Most compiled binaries kept in the process-wide cache.
pub const KERNEL_CACHE_ENTRIES_MAX: usize = 64;

/// Key of a compiled binary: FNV-1a hash of the source and the target architecture.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CompileKey {
    /// 64-bit FNV-1a of the source text.
    pub source_hash: u64,
    /// Target architecture, for example `sm_90`.
    pub arch: String,
}

/// A compiled binary with the source it came from (compared on lookup, so a
/// hash collision can never return the wrong code).
#[derive(Debug)]
struct CachedCubin {
    source: String,
    cubin: Vec<u8>,
}

fn cubin_cache() -> &'static Mutex<BoundedCache<CompileKey, Arc<CachedCubin>>> {
    static CACHE: OnceLock<Mutex<BoundedCache<CompileKey, Arc<CachedCubin>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(BoundedCache::new(KERNEL_CACHE_ENTRIES_MAX)))
}

/// 64-bit FNV-1a, stable across builds and processes.
pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The NVRTC architecture name of a compute capability, for example `sm_90`.
pub fn arch_name(compute_capability: (i32, i32)) -> String {
    format!("sm_{}{}", compute_capability.0, compute_capability.1)
}

/// NVRTC options for `arch` with the given include folders.
pub fn compile_options(arch: &str, include_dirs: &[std::path::PathBuf]) -> Vec<String> {
    let mut options = vec![format!("--gpu-architecture={arch}"), "-std=c++17".to_string(), "-DACCORD_NVRTC=1".into()];
    options.extend(include_dirs.iter().map(|d| format!("--include-path={}", d.display())));
    options
}

/// Compiles `source` for `arch` (or returns the cached binary).
pub fn compile_cached(source: &str, program_name: &str, arch: &str) -> Result<Vec<u8>> {
    compile_cached_with_includes(source, program_name, arch, &[])
}

/// As [`compile_cached`], with `extra_include_dirs` searched (before the CUDA headers' folders)
/// for the source's `#include`s: how kernels that include a library header, such as
/// `accord/device.cuh`, are built. The cache key covers the folders' names, not the headers'
/// contents: a header edited while the process runs is not seen by a cached source.
pub fn compile_cached_with_includes(
    source: &str,
    program_name: &str,
    arch: &str,
    extra_include_dirs: &[std::path::PathBuf],
) -> Result<Vec<u8>> {
    // The folders are part of what was compiled: the cached entry's text is source + folders.
    let mut keyed = source.to_string();
    for dir in extra_include_dirs {
        keyed.push_str("\n//accord-include-dir ");
        keyed.push_str(&dir.display().to_string());
    }
    let key = CompileKey { source_hash: fnv1a_64(keyed.as_bytes()), arch: arch.to_string() };
    let hit = cubin_cache().lock().unwrap_or_else(|p| p.into_inner()).get(&key);
    if let Some(entry) = hit {
        if entry.source == keyed {
            return Ok(entry.cubin.clone());
        }
    }
    nvrtc::ensure_nvrtc()?;
    let mut include_dirs = extra_include_dirs.to_vec();
    include_dirs.extend(crate::paths::cuda_include_dirs());
    let options = compile_options(arch, &include_dirs);
    match nvrtc::compile_to_cubin(source, program_name, &options)? {
        Compiled::Cubin(cubin) => {
            let entry = Arc::new(CachedCubin { source: keyed, cubin: cubin.clone() });
            cubin_cache().lock().unwrap_or_else(|p| p.into_inner()).insert(key, entry);
            Ok(cubin)
        }
        Compiled::Failed(log) => Err(CudaError::Compile {
            program: program_name.to_string(),
            arch: arch.to_string(),
            log,
            include_dirs: include_dirs.iter().map(|d| d.display().to_string()).collect(),
        }),
    }
}

/// Entries in the process-wide binary cache now.
pub fn cached_binary_count() -> usize {
    cubin_cache().lock().unwrap_or_else(|p| p.into_inner()).len()
}

/// A module loaded into one GPU's context; unloaded when the last
/// [`Kernel`] from it is dropped.
#[derive(Debug)]
pub struct Module {
    gpu: Gpu,
    raw: RawModule,
}

impl Module {
    /// Compiles (cached) and loads `source` on `gpu`.
    pub fn compile_and_load(gpu: &Gpu, source: &str, program_name: &str) -> Result<Arc<Module>> {
        let cubin = compile_cached(source, program_name, &arch_name(gpu.compute_capability()))?;
        gpu.bind()?;
        let raw = driver::module_load_data(&cubin)?;
        Ok(Arc::new(Module { gpu: gpu.clone(), raw }))
    }

    /// As [`Module::compile_and_load`], with `extra_include_dirs` searched for the source's
    /// `#include`s (see [`compile_cached_with_includes`]).
    pub fn compile_and_load_with_includes(
        gpu: &Gpu,
        source: &str,
        program_name: &str,
        extra_include_dirs: &[std::path::PathBuf],
    ) -> Result<Arc<Module>> {
        let arch = arch_name(gpu.compute_capability());
        let cubin = compile_cached_with_includes(source, program_name, &arch, extra_include_dirs)?;
        gpu.bind()?;
        let raw = driver::module_load_data(&cubin)?;
        Ok(Arc::new(Module { gpu: gpu.clone(), raw }))
    }

    /// The kernel named `name` (an `extern "C"` function).
    pub fn kernel(self: &Arc<Module>, name: &str) -> Result<Kernel> {
        let name_c = CString::new(name)
            .map_err(|_| CudaError::InvalidArgument { what: "kernel name contains a NUL byte".into() })?;
        self.gpu.bind()?;
        let raw = driver::module_get_function(self.raw, &name_c)?;
        Ok(Kernel { module: Arc::clone(self), raw, name: name.to_string() })
    }

    /// The GPU the module is loaded on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if let Ok(_restore) = self.gpu.bind_scoped() {
            let _ = driver::module_unload(self.raw);
        }
    }
}

/// A kernel function; keeps its module loaded.
#[derive(Debug, Clone)]
pub struct Kernel {
    module: Arc<Module>,
    raw: RawFunction,
    name: String,
}

impl Kernel {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The GPU it runs on.
    pub fn gpu(&self) -> &Gpu {
        &self.module.gpu
    }

    pub(crate) fn raw(&self) -> RawFunction {
        self.raw
    }
}

#[cfg(test)]
mod tests;
