//! Checked wrappers over NVRTC as `cudarc` loads it at run time, plus the
//! preload that lets a library outside the loader path be found.
//!
//! Invariant: nothing here except `ensure_nvrtc` runs before it returned `Ok`.

use std::ffi::{c_char, CString};
use std::path::Path;
use std::sync::OnceLock;

use cudarc::nvrtc::sys;

use crate::error::{CudaError, Result};

fn check(call: &'static str, result: sys::nvrtcResult) -> Result<()> {
    if result == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Nvrtc { call, code: result as i32, name: format!("{result:?}") })
    }
}

static NVRTC_STATE: OnceLock<std::result::Result<(), String>> = OnceLock::new();

/// Makes libnvrtc loadable, once per process. Never panics.
///
/// When the loader cannot find it by name, the folders of
/// [`crate::nvrtc_library_dirs`] are searched and the library is opened by
/// absolute path with `RTLD_GLOBAL`; glibc then resolves `cudarc`'s later
/// open by soname (`libnvrtc.so.13`) to the already-loaded copy.
pub(crate) fn ensure_nvrtc() -> Result<()> {
    let state = NVRTC_STATE.get_or_init(|| {
        // Safety: is_culib_present only tries dlopen on candidate names and never panics.
        if unsafe { sys::is_culib_present() } {
            return Ok(());
        }
        let dirs = crate::paths::nvrtc_library_dirs();
        for dir in &dirs {
            preload_from(dir);
            // Safety: as above.
            if unsafe { sys::is_culib_present() } {
                return Ok(());
            }
        }
        Err(format!(
            "no NVRTC library (libnvrtc.so.13) on the loader path or in {dirs:?}; \
             install the nvidia-cuda-nvrtc wheel or the CUDA toolkit, or set ACCORD_CUDA_LIB_DIRS \
             (or LD_LIBRARY_PATH) to the folder holding it"
        ))
    });
    state.clone().map_err(|reason| CudaError::NotAvailable { reason })
}

/// Opens `libnvrtc-builtins.so*` and then `libnvrtc.so*` from `dir`, globally,
/// and never closes them.
fn preload_from(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut names: Vec<String> = entries.flatten().filter_map(|e| e.file_name().into_string().ok()).collect();
    names.sort();
    // Builtins first: libnvrtc opens them on first compile.
    let builtins = names.iter().filter(|n| n.starts_with("libnvrtc-builtins.so"));
    let main = names.iter().filter(|n| n.starts_with("libnvrtc.so"));
    for name in builtins.chain(main) {
        let Ok(path) = CString::new(dir.join(name).to_string_lossy().into_owned()) else { continue };
        // Safety: dlopen of an absolute path; the handle is deliberately leaked so the library
        // stays loaded for the process. A failed open returns null and changes nothing.
        let _handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    }
}

/// NVRTC's `(major, minor)` version.
pub(crate) fn version() -> Result<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // Safety: writes two ints to valid locals.
    check("nvrtcVersion", unsafe { sys::nvrtcVersion(&mut major, &mut minor) })?;
    Ok((major, minor))
}

/// Outcome of one compilation: the cubin, or the compiler log.
pub(crate) enum Compiled {
    /// The compiled binary.
    Cubin(Vec<u8>),
    /// Compilation failed; the log says why.
    Failed(String),
}

/// Compiles `source` with `options` to a cubin.
pub(crate) fn compile_to_cubin(source: &str, program_name: &str, options: &[String]) -> Result<Compiled> {
    let source_c = CString::new(source)
        .map_err(|_| CudaError::InvalidArgument { what: "kernel source contains a NUL byte; remove it".into() })?;
    let name_c = CString::new(program_name)
        .map_err(|_| CudaError::InvalidArgument { what: "program name contains a NUL byte; remove it".into() })?;
    let options_c: Vec<CString> =
        options.iter().map(|o| CString::new(o.as_str())).collect::<std::result::Result<_, _>>().map_err(|_| {
            CudaError::InvalidArgument { what: "a compiler option contains a NUL byte; remove it".into() }
        })?;
    let option_ptrs: Vec<*const c_char> = options_c.iter().map(|o| o.as_ptr()).collect();

    let mut program: sys::nvrtcProgram = std::ptr::null_mut();
    // Safety: strings are NUL-terminated and outlive the call; no headers are passed.
    check("nvrtcCreateProgram", unsafe {
        sys::nvrtcCreateProgram(&mut program, source_c.as_ptr(), name_c.as_ptr(), 0, std::ptr::null(), std::ptr::null())
    })?;
    let outcome = compile_created(program, &option_ptrs);
    // Safety: program was created above and is destroyed exactly once here.
    let destroyed = check("nvrtcDestroyProgram", unsafe { sys::nvrtcDestroyProgram(&mut program) });
    let outcome = outcome?;
    destroyed?;
    Ok(outcome)
}

fn compile_created(program: sys::nvrtcProgram, option_ptrs: &[*const c_char]) -> Result<Compiled> {
    // Safety: program is live; option pointers are NUL-terminated and outlive the call.
    let result = unsafe { sys::nvrtcCompileProgram(program, option_ptrs.len() as i32, option_ptrs.as_ptr()) };
    if result == sys::nvrtcResult::NVRTC_ERROR_COMPILATION {
        return Ok(Compiled::Failed(program_log(program)?));
    }
    check("nvrtcCompileProgram", result)?;
    let mut size = 0usize;
    // Safety: program compiled; writes one usize to a valid local.
    check("nvrtcGetCUBINSize", unsafe { sys::nvrtcGetCUBINSize(program, &mut size) })?;
    let mut cubin = vec![0u8; size];
    // Safety: the buffer holds exactly the size NVRTC reported.
    check("nvrtcGetCUBIN", unsafe { sys::nvrtcGetCUBIN(program, cubin.as_mut_ptr() as *mut c_char) })?;
    Ok(Compiled::Cubin(cubin))
}

fn program_log(program: sys::nvrtcProgram) -> Result<String> {
    let mut size = 0usize;
    // Safety: program is live; writes one usize to a valid local.
    check("nvrtcGetProgramLogSize", unsafe { sys::nvrtcGetProgramLogSize(program, &mut size) })?;
    let mut log = vec![0u8; size.max(1)];
    // Safety: the buffer holds at least the size NVRTC reported.
    check("nvrtcGetProgramLog", unsafe { sys::nvrtcGetProgramLog(program, log.as_mut_ptr() as *mut c_char) })?;
    let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
    Ok(String::from_utf8_lossy(&log[..end]).into_owned())
}
