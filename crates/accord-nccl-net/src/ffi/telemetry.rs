//! Telemetry's switch for a program that runs NCCL over this plugin: the plugin's engine is
//! built inside NCCL, out of the program's reach, but the library NCCL loaded is one the
//! program can load too (`dlopen` of the same file returns the same library, so
//! `ctypes.CDLL(<the path in NCCL_NET_PLUGIN>)` reaches the engine NCCL uses). A benchmark
//! pauses and resumes recording between blocks of collectives, measuring telemetry's cost in
//! one process pair (`scripts/device/nccl_plugin_bench.py --telemetry-ab`).

use std::ffi::c_int;
use std::panic::catch_unwind;

/// Pauses (`on` = 0) or resumes (any other value) telemetry's recording in this process
/// (`accord_engine::telemetry::set_recording`: the endpoint and the trace stay up, transfers
/// and collectives are not recorded while paused). Returns 1 when it was recording before, 0
/// when not, -1 on an internal error. Callable at any time, before NCCL's `init` too: a pause
/// set first holds when the engine turns telemetry on.
#[no_mangle]
pub extern "C" fn accord_telemetry_set_recording(on: c_int) -> c_int {
    catch_unwind(|| c_int::from(accord_engine::telemetry::set_recording(on != 0))).unwrap_or(-1)
}

/// 1 when an engine of this process turned telemetry on (`ACCORD_METRICS_ADDR` or
/// `ACCORD_TRACE_FILE` set where the plugin started), paused or not; 0 otherwise; -1 on an
/// internal error. A benchmark checks it before comparing paused with recording.
#[no_mangle]
pub extern "C" fn accord_telemetry_enabled() -> c_int {
    catch_unwind(|| c_int::from(accord_engine::telemetry::enabled())).unwrap_or(-1)
}

/// Copies up to `len` of the GPU-buffers counters ([`crate::gpu_stats::NAMES`] order) to `out`
/// and returns how many there are in all (so a caller may ask with `len` 0 first); -1 on an
/// internal error. A program reads them from the library NCCL loaded, as for telemetry's switch.
///
/// # Safety
/// `out` must be null or valid for `len` writes of `u64`.
#[no_mangle]
#[allow(unsafe_code)]
pub unsafe extern "C" fn accord_net_gpu_stats(out: *mut u64, len: c_int) -> c_int {
    let values = crate::gpu_stats::snapshot();
    let wanted = usize::try_from(len).unwrap_or(0).min(values.len());
    if !out.is_null() {
        for (i, v) in values.iter().take(wanted).enumerate() {
            // Safety: i < len, and the caller vouches for `len` writable words.
            unsafe { out.add(i).write(*v) };
        }
    }
    values.len() as c_int
}
