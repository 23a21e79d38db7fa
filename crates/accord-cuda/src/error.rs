//! The error enum of every CUDA operation, and the mapping from driver and
//! NVRTC result codes to messages that say what to do next.

/// Everything an `accord-cuda` operation can fail with. Each message says what
/// to do next.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// The CUDA driver or NVRTC library could not be loaded, or no GPU exists.
    #[error("CUDA is not available: {reason}")]
    NotAvailable {
        /// Why, and what to install or set.
        reason: String,
    },
    /// A driver API call returned an error.
    #[error("{call} failed with {name} ({code}): {hint}")]
    Driver {
        /// The driver function, for example `cuMemAlloc_v2`.
        call: &'static str,
        /// The numeric `CUresult`.
        code: i32,
        /// The symbolic `CUresult` name.
        name: String,
        /// What to do about it.
        hint: &'static str,
    },
    /// An NVRTC call other than compilation itself failed.
    #[error("{call} failed with {name} ({code}); check that libnvrtc matches the driver's CUDA major version")]
    Nvrtc {
        /// The NVRTC function.
        call: &'static str,
        /// The numeric `nvrtcResult`.
        code: i32,
        /// The symbolic `nvrtcResult` name.
        name: String,
    },
    /// NVRTC rejected a program; the log holds the compiler's messages.
    #[error(
        "NVRTC could not compile {program} for {arch}: {log}\n\
         (include dirs searched: {include_dirs:?}; set ACCORD_CUDA_INCLUDE_DIRS to the folder holding cuda_fp16.h)"
    )]
    Compile {
        /// The program's name.
        program: String,
        /// The target architecture, for example `sm_90`.
        arch: String,
        /// The compiler's log.
        log: String,
        /// The include directories that were passed.
        include_dirs: Vec<String>,
    },
    /// An argument was out of range (an ordinal, a length, an offset).
    #[error("invalid argument: {what}")]
    InvalidArgument {
        /// What was wrong, phrased with the valid range.
        what: String,
    },
    /// A device pointer passed in does not lie inside one live allocation.
    #[error(
        "device range 0x{ptr:x}+{len_bytes} is not inside one live allocation ({detail}); \
         pass a pointer from a DeviceBuffer, PinnedHostBuffer or IpcMapping that is still alive"
    )]
    BadDeviceRange {
        /// The start of the range.
        ptr: u64,
        /// Its length in bytes.
        len_bytes: usize,
        /// What the driver said about it.
        detail: String,
    },
    /// An IPC handle could not be opened.
    #[error(
        "could not open the IPC handle exported by pid {exporter_pid}: {reason}; \
         the exporter must be alive and keep the allocation until every importer closed it, \
         and a handle cannot be opened in the process that exported it"
    )]
    IpcOpen {
        /// The exporting process.
        exporter_pid: u32,
        /// What went wrong.
        reason: String,
    },
    /// Memory exported as POSIX file descriptors ([`crate::ipc::vmm`]) could not be taken or
    /// mapped.
    #[error(
        "could not map the device memory pid {exporter_pid} exported as file descriptors: {reason}; \
         the exporter must be alive, let this process take its descriptors (pidfd_getfd needs \
         ptrace permission over it) and keep the memory until every importer unmapped it"
    )]
    VmmShare {
        /// The exporting process.
        exporter_pid: u32,
        /// What went wrong.
        reason: String,
    },
    /// A wait did not finish in time.
    #[error("{what} did not complete within {timeout_ms} ms; check that the work it waits for was submitted")]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// The limit that applied.
        timeout_ms: u64,
    },
}

/// Errors of parsing a serialised [`crate::IpcHandle`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum IpcHandleParseError {
    /// The text had the wrong length.
    #[error("an IPC handle is {expected} hex characters, got {got}; pass the string IpcHandle::to_hex produced")]
    Length {
        /// Characters expected.
        expected: usize,
        /// Characters received.
        got: usize,
    },
    /// The text had a character that is not a hex digit.
    #[error("character {index} of the IPC handle is not a hex digit; pass the string IpcHandle::to_hex produced")]
    NotHex {
        /// Index of the first bad character.
        index: usize,
    },
    /// The version byte did not match this build.
    #[error("IPC handle version {got} is not {expected}; exporter and importer must run the same accord-cuda")]
    Version {
        /// Version this build writes.
        expected: u8,
        /// Version found.
        got: u8,
    },
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, CudaError>;

/// What to do about a driver error code (`CUresult` as an integer).
pub fn driver_error_hint(code: i32) -> &'static str {
    match code {
        1 => "an argument is invalid; check pointers, lengths and flags",
        2 => "the GPU is out of memory; free buffers or allocate less",
        3 => "the driver is not initialised; call probe() or Gpu::open first",
        4 => "the driver is shutting down; do not call CUDA from exit handlers",
        34 => "libcuda is the toolkit's stub, not the driver; put the real driver's folder first in LD_LIBRARY_PATH",
        46 => "the device is unavailable (exclusive-process mode or in use); free it or change its compute mode",
        100 => "no CUDA-capable device was found; check nvidia-smi and CUDA_VISIBLE_DEVICES",
        101 => "the device ordinal is out of range; use an ordinal below probe().device_count",
        200 | 209 | 218 => "the kernel image is not valid for this GPU; recompile for its architecture",
        222 => "the PTX is newer than this driver understands; update the driver or use an older NVRTC",
        201 => "no valid context is current; open the Gpu before using its objects",
        205 => "the mapping failed; the exporter may have exited or freed the allocation",
        217 => "peer access is not supported between these GPUs; copies go through the host instead",
        400 => "the handle is invalid or was already destroyed",
        600 => "the work is not finished yet; query again later",
        700 => "a kernel accessed an illegal address; the context is lost, restart the process",
        704 => "peer access is already enabled; nothing to do",
        705 => "peer access was not enabled; call enable_peer_access first",
        712 => "the host memory is already registered; unregister it first or use the existing registration",
        713 => "the host memory is not registered",
        719 => "a launch failed; the context is lost, restart the process",
        803 => "the user-mode driver and the kernel module differ in version; reboot or reinstall the driver",
        999 => "an unknown driver error; check dmesg and nvidia-smi",
        _ => "see the CUDA driver API documentation of this code",
    }
}

/// The symbolic name of a driver error code, without needing the library.
pub fn driver_error_name(code: i32) -> String {
    let name = match code {
        0 => "CUDA_SUCCESS",
        1 => "CUDA_ERROR_INVALID_VALUE",
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        4 => "CUDA_ERROR_DEINITIALIZED",
        34 => "CUDA_ERROR_STUB_LIBRARY",
        46 => "CUDA_ERROR_DEVICE_UNAVAILABLE",
        100 => "CUDA_ERROR_NO_DEVICE",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        200 => "CUDA_ERROR_INVALID_IMAGE",
        201 => "CUDA_ERROR_INVALID_CONTEXT",
        205 => "CUDA_ERROR_MAP_FAILED",
        209 => "CUDA_ERROR_NO_BINARY_FOR_GPU",
        217 => "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
        218 => "CUDA_ERROR_INVALID_PTX",
        222 => "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        400 => "CUDA_ERROR_INVALID_HANDLE",
        600 => "CUDA_ERROR_NOT_READY",
        700 => "CUDA_ERROR_ILLEGAL_ADDRESS",
        704 => "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
        705 => "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
        712 => "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
        713 => "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
        719 => "CUDA_ERROR_LAUNCH_FAILED",
        803 => "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => return format!("CUresult {code}"),
    };
    name.to_string()
}

/// Builds the error of a failed driver call.
pub fn driver_error(call: &'static str, code: i32) -> CudaError {
    CudaError::Driver { call, code, name: driver_error_name(code), hint: driver_error_hint(code) }
}

#[cfg(test)]
mod tests;
