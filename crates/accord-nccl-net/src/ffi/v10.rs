//! The v10 shim (NCCL 2.25-2.27): no contexts, a config argument on `connect`, the v10
//! properties struct. Everything else is the v11 entry point.

use super::*;

unsafe extern "C" fn init_v10(logger: DebugLogger, _profiler: ProfilerCallback) -> NcclResult {
    guard("init", || start(logger).map(|_| ()))
}

unsafe extern "C" fn get_properties_v10(dev: c_int, props: *mut PropertiesV10) -> NcclResult {
    guard("getProperties", || {
        let value = properties(dev)?;
        // Safety: NCCL passes a writable v10 properties struct.
        unsafe { store(props, value, "props") }
    })
}

unsafe extern "C" fn listen_v10(dev: c_int, handle: *mut c_void, lc: *mut *mut c_void) -> NcclResult {
    // Safety: NCCL's arguments satisfy listen_common's contract (null context: process runtime).
    unsafe { listen_common(std::ptr::null_mut(), dev, handle, lc) }
}

unsafe extern "C" fn connect_v10(
    dev: c_int,
    _config: *mut CommConfig,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _send_dev_comm: *mut *mut c_void,
) -> NcclResult {
    // Safety: NCCL's arguments satisfy connect_common's contract (null context: process runtime).
    unsafe { connect_common(std::ptr::null_mut(), dev, handle, send_comm) }
}

/// The v10 table, for NCCL 2.25-2.27.
#[no_mangle]
pub static ncclNetPlugin_v10: abi::NetV10 = abi::NetV10 {
    name: PLUGIN_NAME.as_ptr(),
    init: init_v10,
    devices,
    getProperties: get_properties_v10,
    listen: listen_v10,
    connect: connect_v10,
    calls: CALLS,
};
