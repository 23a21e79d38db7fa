//! The plugin's telemetry switch as a benchmark reaches it: through `dlopen` of the built
//! library, after the plugin's `init` built its engine with telemetry on (`ACCORD_METRICS_ADDR`),
//! `accord_telemetry_enabled` says so and `accord_telemetry_set_recording` pauses and resumes,
//! each call reporting the state before it. A test binary of its own: it sets the process's
//! environment and telemetry's switch is the whole process's.
#![allow(unsafe_code)]

use nccl_net_accord::abi::{self, CommConfig, NetV11};
use std::ffi::c_int;
mod plugin_lib;

use plugin_lib::plugin_path;

#[test]
fn a_benchmark_pauses_and_resumes_the_plugins_recording_through_the_library() {
    // The only test of this binary: nothing else reads the environment concurrently.
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
