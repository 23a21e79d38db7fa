//! The plugin's telemetry switch as a benchmark reaches it: through `dlopen` of the built
//! library, after the plugin's `init` built its engine with telemetry on (`ACCORD_METRICS_ADDR`),
//! `accord_telemetry_enabled` says so and `accord_telemetry_set_recording` pauses and resumes,
//! each call reporting the state before it. A test binary of its own: it sets the process's
//! environment and telemetry's switch is the whole process's. The GPU-buffers counters are read
//! the same way (`accord_net_gpu_stats`).
#![allow(unsafe_code)]

use nccl_net_accord::abi::{self, CommConfig, NetV11};
use std::ffi::c_int;
mod plugin_lib;

use plugin_lib::plugin_path;

#[test]
fn a_benchmark_pauses_and_resumes_the_plugins_recording_through_the_library() {
    // The only test of this binary that sets the environment or starts an engine.
    std::env::set_var("ACCORD_NET_IFS", "127.0.0.1");
    std::env::set_var("ACCORD_METRICS_ADDR", "127.0.0.1:0");
    std::env::remove_var("ACCORD_TRACE_FILE");
    let path = plugin_path();
    // Safety: loading our own plugin; its initialisers only set up Rust statics.
    let lib = unsafe { libloading::Library::new(&path) }.expect("dlopen the plugin");
    // Safety: the symbols are the plugin's `extern "C" fn(c_int) -> c_int` and `fn() -> c_int`,
    // alive while `lib` is.
    let (set_recording, enabled) = unsafe {
        (
            *lib.get::<extern "C" fn(c_int) -> c_int>(b"accord_telemetry_set_recording\0").expect("exported"),
            *lib.get::<extern "C" fn() -> c_int>(b"accord_telemetry_enabled\0").expect("exported"),
        )
    };
    assert_eq!(enabled(), 0, "no engine yet");
    // Safety: ncclNetPlugin_v11 is a static NetV11 in the plugin, alive while `lib` is.
    let table: &NetV11 = unsafe { &**lib.get::<*const NetV11>(b"ncclNetPlugin_v11\0").expect("exported") };
    let mut ctx = std::ptr::null_mut();
    let mut config = CommConfig { trafficClass: -1 };
    // Safety: valid out-pointers; no logger (warnings go to stderr).
    let rc = unsafe { (table.init)(&mut ctx, 1, &mut config, None, std::ptr::null_mut()) };
    assert_eq!(rc, abi::NCCL_SUCCESS, "init");
    assert_eq!(enabled(), 1, "the plugin's engine turned the metrics endpoint on");
    assert_eq!(set_recording(0), 1, "it was recording");
    assert_eq!(set_recording(0), 0, "paused already");
    assert_eq!(enabled(), 1, "a pause leaves telemetry enabled");
    assert_eq!(set_recording(1), 0, "resumed from a pause");
    assert_eq!(set_recording(7), 1, "any non-zero value means on");
    // Safety: the context from init, handed back once.
    assert_eq!(unsafe { (table.finalize)(ctx) }, abi::NCCL_SUCCESS);
}

/// The GPU-buffers counters as a benchmark reads them: the count of counters first, then the
/// values (zero here: nothing moved through GPU memory), never more than asked for.
#[test]
fn a_program_reads_the_gpu_buffer_counters_through_the_library() {
    // Safety: loading our own plugin; its initialisers only set up Rust statics.
    let lib = unsafe { libloading::Library::new(plugin_path()) }.expect("dlopen the plugin");
    // Safety: the plugin's `unsafe extern "C" fn(*mut u64, c_int) -> c_int`, alive while `lib` is.
    let stats = unsafe {
        *lib.get::<unsafe extern "C" fn(*mut u64, c_int) -> c_int>(b"accord_net_gpu_stats\0").expect("exported")
    };
    // Safety: a null pointer with length 0 is allowed.
    let count = unsafe { stats(std::ptr::null_mut(), 0) };
    assert_eq!(count as usize, nccl_net_accord::gpu_stats::NAMES.len());
    let mut values = vec![u64::MAX; count as usize + 1];
    // Safety: room for `count` words; the last one must stay untouched.
    assert_eq!(unsafe { stats(values.as_mut_ptr(), count) }, count);
    assert!(values[..count as usize].iter().all(|v| *v == 0), "{values:?}");
    assert_eq!(values[count as usize], u64::MAX, "wrote past the length it was given");
}
