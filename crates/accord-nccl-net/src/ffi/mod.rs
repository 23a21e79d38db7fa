//! The exported tables `ncclNetPlugin_v11` and `ncclNetPlugin_v10` and their entry points, and
//! telemetry's switch for the program NCCL runs in (`telemetry.rs`).
//!
//! Every entry point runs its body under `guard`: errors are logged through NCCL's logger and
//! returned as NCCL codes, and panics are caught and returned as `ncclInternalError`, so
//! nothing unwinds into NCCL and nothing aborts the process. Objects handed to NCCL (contexts,
//! comms, memory handles, requests) are `Box`es turned into raw pointers; NCCL hands each back
//! to the matching close/free call exactly once.
#![allow(unsafe_code)]

mod telemetry;
mod v10;

use crate::abi::{self, CommConfig, DebugLogger, NcclResult, NetAttr, NetCalls, NetV11, ProfilerCallback};
use crate::abi::{PropertiesV10, PropertiesV11, VDeviceProps, NET_HANDLE_BYTES_MAX};
use crate::comm::recv::RecvArgs;
use crate::comm::send::SendArgs;
use crate::comm::{RecvComm, RecvRequest, SendComm, SendRequest};
use crate::config::NetConfig;
use crate::cts::RECVS_MAX;
use crate::error::{PluginError, Result};
use crate::log;
use crate::mr::MemoryRegion;
use crate::runtime::{self, Runtime, COMMS_MAX};
use crate::setup::{self, ListenComm};
use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

pub use telemetry::{accord_net_gpu_stats, accord_telemetry_enabled, accord_telemetry_set_recording};
pub use v10::ncclNetPlugin_v10;

/// Name NCCL matches against `NCCL_NET`.
pub const PLUGIN_NAME: &std::ffi::CStr = c"Accord";

/// What `init` hands NCCL as `ctx`.
struct Context {
    rt: Arc<Runtime>,
}

/// What `isend`/`irecv` hand NCCL as `request`.
enum Request {
    Send(SendRequest),
    Recv(RecvRequest),
}

/// Runs an entry point's body: errors logged and mapped, panics caught.
fn guard(name: &'static str, body: impl FnOnce() -> Result<()>) -> NcclResult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => abi::NCCL_SUCCESS,
        Ok(Err(e)) => {
            log::warn(line!(), &format!("{name} failed: {e}"));
            if matches!(name, "isend" | "irecv" | "test") {
                // NCCL aborts next: leave the record of what was in flight (rate-limited).
                dump_in_flight(&format!("{name} failed: {e}"));
            }
            e.code()
        }
        Err(_) => {
            let e = PluginError::Panic(name);
            log::warn(line!(), &e.to_string());
            e.code()
        }
    }
}

/// Dumps the in-flight requests (see `crate::inflight`) when the runtime is up.
fn dump_in_flight(reason: &str) {
    if let Ok(rt) = runtime::current() {
        crate::inflight::dump(rt.engine.id(), reason, false);
    }
}

fn null_arg(what: &str) -> PluginError {
    PluginError::InvalidArgument(format!("{what} is null"))
}

/// Stores `value` at `out` (checked non-null).
///
/// # Safety
/// `out` must be null or valid for a write of `T`.
unsafe fn store<T>(out: *mut T, value: T, what: &str) -> Result<()> {
    if out.is_null() {
        return Err(null_arg(what));
    }
    // Safety: non-null, and the caller vouches it is writable.
    unsafe { out.write(value) };
    Ok(())
}

/// Boxes `value` for NCCL.
fn into_raw<T>(value: T) -> *mut c_void {
    Box::into_raw(Box::new(value)).cast()
}

/// The runtime a context names (or the process runtime when NCCL passes no context).
///
/// # Safety
/// `ctx` must be null or a pointer `init` returned and `finalize` has not freed.
unsafe fn runtime_of(ctx: *mut c_void) -> Result<Arc<Runtime>> {
    if ctx.is_null() {
        return runtime::current();
    }
    // Safety: per the contract, a live Context from init.
    Ok(unsafe { &*(ctx as *const Context) }.rt.clone())
}

/// The properties of device `dev`.
fn properties(dev: c_int) -> Result<PropertiesV10> {
    properties_of(&*runtime::current()?, dev)
}

/// The properties of device `dev` of `rt`; the pointers in them live as long as `rt`.
fn properties_of(rt: &Runtime, dev: c_int) -> Result<PropertiesV10> {
    let device = rt.device(dev)?;
    let mut devs = [0; abi::NET_DEVS_PER_NIC_MAX];
    devs[0] = dev;
    Ok(PropertiesV10 {
        // NCCL only reads the name; it stays valid as long as the runtime (the process).
        name: device.name.as_ptr().cast_mut(),
        // No PCI path: NCCL attaches the device to the first CPU. A GPU's own path crashed NCCL
        // 2.28.9 at init; GPUDirect comes from NCCL_NET_GDR_LEVEL instead (crate::gdr_level).
        pciPath: std::ptr::null_mut(),
        guid: device.guid,
        ptrSupport: if rt.gpu_buffers { abi::PTR_HOST | abi::PTR_CUDA } else { abi::PTR_HOST },
        regIsGlobal: 0,
        forceFlush: 0,
        speed: device.speed_mbps,
        port: 0,
        latency: 0.0,
        maxComms: COMMS_MAX as c_int,
        maxRecvs: RECVS_MAX as c_int,
        netDeviceType: abi::NET_DEVICE_HOST,
        netDeviceVersion: abi::NET_DEVICE_INVALID_VERSION,
        vProps: VDeviceProps { ndevs: 1, devs },
        maxP2pBytes: abi::NET_SIZE_BYTES_MAX,
        maxCollBytes: abi::NET_SIZE_BYTES_MAX,
    })
}

fn start(logger: DebugLogger) -> Result<Arc<Runtime>> {
    crate::engine_log::use_nccl_logger(logger);
    let rt = runtime::start()?;
    offer_gdr_level(&rt);
    let names: Vec<String> = rt.devices.iter().map(|d| d.name.to_string_lossy().into_owned()).collect();
    log::info(
        abi::SUBSYS_INIT | abi::SUBSYS_NET,
        line!(),
        &format!(
            "Accord net plugin ready: {} device(s) {names:?}, engine {:x}, {}",
            names.len(),
            rt.engine.id().0,
            rt.datapath_summary()
        ),
    );
    crate::inflight::watch_signal(rt.engine.id());
    if let Some(hint) = default_device_hint(&rt.config, std::env::var("NCCL_SOCKET_IFNAME").ok()) {
        log::info(abi::SUBSYS_INIT | abi::SUBSYS_NET, line!(), &hint);
    }
    Ok(rt)
}

/// Sets `NCCL_NET_GDR_LEVEL` for NCCL when GPU buffers are on and the user left it unset
/// (`ACCORD_NET_GDR_LEVEL`, see [`crate::gdr_level`]): NCCL first reads it when it computes its
/// topology paths, which follows its net plugin's `init`. Done once per process, under the
/// runtime's start (the first `init`), and logged, since it changes the process environment.
fn offer_gdr_level(rt: &Runtime) {
    static OFFERED: std::sync::Once = std::sync::Once::new();
    OFFERED.call_once(|| {
        let var = crate::gdr_level::NCCL_GDR_LEVEL_VAR;
        let user = std::env::var(var).ok();
        let Some(value) = crate::gdr_level::gdr_level_to_set(rt.config.gdr_level, rt.gpu_buffers, user.as_deref())
        else {
            if rt.gpu_buffers {
                let why = user.map_or("ACCORD_NET_GDR_LEVEL=off".to_string(), |v| format!("{var}={v:?} is the user's"));
                log::info(
                    abi::SUBSYS_INIT | abi::SUBSYS_NET,
                    line!(),
                    &format!("GPU buffers on; {var} left alone ({why})"),
                );
            }
            return;
        };
        // setenv races a getenv on another thread; this runs once per process, inside NCCL's
        // first communicator init, before that init reads the variable.
        std::env::set_var(var, value);
        log::info(
            abi::SUBSYS_INIT | abi::SUBSYS_NET,
            line!(),
            &format!(
                "GPU buffers on: set {var}={value} so NCCL hands the devices GPU memory (GPUDirect); \
                 ACCORD_NET_GDR_LEVEL=off leaves it unset"
            ),
        );
    });
}

/// What to tell a user who left `ACCORD_NET_IFS` unset: the default device serves jobs on one
/// host only (a job across hosts fails at its first connect, naming the variable).
fn default_device_hint(config: &NetConfig, nccl_socket_ifname: Option<String>) -> Option<String> {
    if !config.default_devices {
        return None;
    }
    let nccl_ifs = nccl_socket_ifname
        .filter(|v| !v.trim().is_empty())
        .map(|v| format!(" (NCCL_SOCKET_IFNAME is {v:?}: the same interface is a good choice)"))
        .unwrap_or_default();
    Some(format!(
        "ACCORD_NET_IFS is unset: one device on 127.0.0.1, for jobs on one host; for a job across hosts set \
         ACCORD_NET_IFS on every rank to the interfaces or addresses the hosts reach each other by{nccl_ifs}"
    ))
}

unsafe extern "C" fn init_v11(
    ctx: *mut *mut c_void,
    comm_id: u64,
    _config: *mut CommConfig,
    logger: DebugLogger,
    _profiler: ProfilerCallback,
) -> NcclResult {
    guard("init", || {
        // Safety: NCCL passes a writable pointer for the context.
        unsafe { store(ctx, std::ptr::null_mut(), "ctx")? };
        let rt = start(logger)?;
        log::trace(line!(), &format!("init for communicator {comm_id:#x}"));
        // Safety: checked writable above.
        unsafe { store(ctx, into_raw(Context { rt }), "ctx") }
    })
}

unsafe extern "C" fn devices(ndev: *mut c_int) -> NcclResult {
    guard("devices", || {
        let count = runtime::current()?.devices.len() as c_int;
        // Safety: NCCL passes a writable int.
        unsafe { store(ndev, count, "ndev") }
    })
}

unsafe extern "C" fn get_properties_v11(dev: c_int, props: *mut PropertiesV11) -> NcclResult {
    guard("getProperties", || {
        let value = PropertiesV11 { base: properties(dev)?, maxMultiRequestSize: 1 };
        // Safety: NCCL passes a writable v11 properties struct.
        unsafe { store(props, value, "props") }
    })
}

/// `listen` for both versions.
///
/// # Safety
/// `ctx` as for [`runtime_of`]; `handle` null or `NCCL_NET_HANDLE_MAXSIZE` writable bytes;
/// `listen_comm` null or writable.
unsafe fn listen_common(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> NcclResult {
    guard("listen", || {
        // Safety: per the function contract.
        unsafe { store(listen_comm, std::ptr::null_mut(), "listenComm")? };
        if handle.is_null() {
            return Err(null_arg("handle"));
        }
        // Safety: per the function contract.
        let rt = unsafe { runtime_of(ctx)? };
        let (comm, h) = ListenComm::new(rt, dev)?;
        // Safety: NCCL gives NCCL_NET_HANDLE_MAXSIZE bytes for the handle, not aliased meanwhile.
        let bytes = unsafe { &mut *(handle as *mut [u8; NET_HANDLE_BYTES_MAX]) };
        h.encode(bytes);
        // Safety: checked writable above.
        unsafe { store(listen_comm, into_raw(comm), "listenComm") }
    })
}

unsafe extern "C" fn listen_v11(ctx: *mut c_void, dev: c_int, handle: *mut c_void, lc: *mut *mut c_void) -> NcclResult {
    // Safety: NCCL's arguments satisfy listen_common's contract.
    unsafe { listen_common(ctx, dev, handle, lc) }
}

/// `connect` for both versions.
///
/// # Safety
/// As for [`listen_common`]; `handle` holds the peer's handle and stays the same buffer
/// across retries.
unsafe fn connect_common(ctx: *mut c_void, dev: c_int, handle: *mut c_void, send_comm: *mut *mut c_void) -> NcclResult {
    guard("connect", || {
        // Safety: per the function contract.
        unsafe { store(send_comm, std::ptr::null_mut(), "sendComm")? };
        if handle.is_null() {
            return Err(null_arg("handle"));
        }
        // Safety: per the function contract.
        let rt = unsafe { runtime_of(ctx)? };
        // Safety: NCCL_NET_HANDLE_MAXSIZE bytes, exclusively ours during the call.
        let bytes = unsafe { &mut *(handle as *mut [u8; NET_HANDLE_BYTES_MAX]) };
        if let Some(comm) = setup::connect(&rt, dev, bytes)? {
            // Safety: checked writable above.
            unsafe { store(send_comm, into_raw(comm), "sendComm")? };
        }
        Ok(())
    })
}

unsafe extern "C" fn connect_v11(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _send_dev_comm: *mut *mut c_void,
) -> NcclResult {
    // Safety: NCCL's arguments satisfy connect_common's contract.
    unsafe { connect_common(ctx, dev, handle, send_comm) }
}

unsafe extern "C" fn accept(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    _recv_dev_comm: *mut *mut c_void,
) -> NcclResult {
    guard("accept", || {
        // Safety: NCCL passes a writable pointer for the comm.
        unsafe { store(recv_comm, std::ptr::null_mut(), "recvComm")? };
        if listen_comm.is_null() {
            return Err(null_arg("listenComm"));
        }
        // Safety: a live ListenComm from listen (NCCL closes it only after accept finished).
        let lc = unsafe { &*(listen_comm as *const ListenComm) };
        if let Some(comm) = lc.accept()? {
            // Safety: checked writable above.
            unsafe { store(recv_comm, into_raw(comm), "recvComm")? };
        }
        Ok(())
    })
}

unsafe extern "C" fn reg_mr(
    _comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ptr_type: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    guard("regMr", || {
        // Safety: NCCL passes a writable pointer for the handle.
        unsafe { store(mhandle, std::ptr::null_mut(), "mhandle")? };
        let rt = runtime::current()?;
        // Safety: NCCL keeps the buffer valid until deregMr (the regMr contract).
        let region = unsafe { MemoryRegion::register(&rt, data.cast(), size, ptr_type)? };
        // Safety: checked writable above.
        unsafe { store(mhandle, into_raw(region), "mhandle") }
    })
}

unsafe extern "C" fn reg_mr_dma_buf(
    _comm: *mut c_void,
    _data: *mut c_void,
    _size: usize,
    _ptr_type: c_int,
    _offset: u64,
    _fd: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    guard("regMrDmaBuf", || {
        // Safety: NCCL passes a writable pointer for the handle.
        unsafe { store(mhandle, std::ptr::null_mut(), "mhandle")? };
        Err(PluginError::Unsupported("DMA-BUF registration (the devices do not report NCCL_PTR_DMABUF)".into()))
    })
}

unsafe extern "C" fn dereg_mr(_comm: *mut c_void, mhandle: *mut c_void) -> NcclResult {
    guard("deregMr", || {
        if mhandle.is_null() {
            return Ok(());
        }
        // Safety: a MemoryRegion box from regMr, handed back once.
        let region = unsafe { Box::from_raw(mhandle as *mut MemoryRegion) };
        let rt = runtime::current()?;
        region.deregister(&rt);
        Ok(())
    })
}

/// The registration an mhandle names, if any.
///
/// # Safety
/// `mhandle` must be null or a live MemoryRegion from regMr.
unsafe fn region_ref<'a>(mhandle: *mut c_void) -> Option<&'a MemoryRegion> {
    // Safety: per the function contract.
    unsafe { (mhandle as *const MemoryRegion).as_ref() }
}

unsafe extern "C" fn isend(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    _phandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    guard("isend", || {
        // Safety: NCCL passes a writable request pointer (its input value is only a hint).
        unsafe { store(request, std::ptr::null_mut(), "request")? };
        // Safety: a live SendComm from connect.
        let comm = unsafe { (send_comm as *const SendComm).as_ref() }.ok_or_else(|| null_arg("sendComm"))?;
        // Safety: NCCL passes the mhandle regMr returned for this buffer (or null).
        let region = unsafe { region_ref(mhandle) };
        let args = SendArgs { data: data as usize, size: size as u64, tag, region };
        if let Some(req) = comm.isend(args)? {
            // Safety: checked writable above.
            unsafe { store(request, into_raw(Request::Send(req)), "request")? };
        }
        Ok(())
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn irecv(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    _phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    guard("irecv", || {
        // Safety: NCCL passes a writable request pointer (its input value is only a hint).
        unsafe { store(request, std::ptr::null_mut(), "request")? };
        // Safety: a live RecvComm from accept.
        let comm = unsafe { (recv_comm as *const RecvComm).as_ref() }.ok_or_else(|| null_arg("recvComm"))?;
        let count = usize::try_from(n).ok().filter(|c| (1..=RECVS_MAX).contains(c)).ok_or_else(|| {
            PluginError::InvalidArgument(format!("irecv of {n} receives: 1..={RECVS_MAX} (maxRecvs)"))
        })?;
        if data.is_null() || sizes.is_null() || tags.is_null() || mhandles.is_null() {
            return Err(null_arg("an irecv array"));
        }
        let mut recvs = Vec::with_capacity(count);
        for i in 0..count {
            // Safety: NCCL passes arrays of n entries each; i < n; each mhandle from regMr or null.
            recvs.push(unsafe {
                RecvArgs {
                    data: *data.add(i) as usize,
                    size: *sizes.add(i) as u64,
                    tag: *tags.add(i),
                    region: region_ref(*mhandles.add(i)),
                }
            });
        }
        if let Some(req) = comm.irecv(&recvs)? {
            // Safety: checked writable above.
            unsafe { store(request, into_raw(Request::Recv(req)), "request")? };
        }
        Ok(())
    })
}

unsafe extern "C" fn iflush(
    _recv_comm: *mut c_void,
    _n: c_int,
    _data: *mut *mut c_void,
    _sizes: *mut c_int,
    _mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    guard("iflush", || {
        // Nothing to flush, so a null request ("nothing to wait for"): host memory needs none,
        // and a receive into GPU memory is done only once its host-to-device copy completed
        // (the copy engine's writes are then visible to later kernels).
        // Safety: NCCL passes a writable request pointer.
        unsafe { store(request, std::ptr::null_mut(), "request") }
    })
}

unsafe extern "C" fn test(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> NcclResult {
    guard("test", || {
        // Safety: NCCL passes a writable flag.
        unsafe { store(done, 0, "done")? };
        if request.is_null() {
            return Err(null_arg("request"));
        }
        // Safety: a live Request from isend/irecv, not yet reported done.
        let req = unsafe { &*(request as *const Request) };
        let completed: Option<Vec<u64>> = match req {
            Request::Send(r) => r.test()?.map(|s| vec![s]),
            Request::Recv(r) => r.test()?,
        };
        let Some(sizes_done) = completed else { return Ok(()) };
        if !sizes.is_null() {
            for (i, s) in sizes_done.iter().enumerate() {
                // Safety: NCCL passes room for one size per receive of the request (one for a send).
                unsafe { *sizes.add(i) = (*s).min(c_int::MAX as u64) as c_int };
            }
        }
        // Safety: done is writable (checked above); NCCL drops the request once told it is done,
        // so this is the one place it is freed.
        unsafe {
            *done = 1;
            drop(Box::from_raw(request as *mut Request));
        }
        Ok(())
    })
}

/// Frees a boxed object NCCL hands back.
///
/// # Safety
/// `ptr` must be null or a `Box<T>` from this plugin, handed back once.
unsafe fn close<T>(name: &'static str, ptr: *mut c_void) -> NcclResult {
    guard(name, || {
        if !ptr.is_null() {
            // Safety: per the function contract.
            drop(unsafe { Box::from_raw(ptr as *mut T) });
        }
        Ok(())
    })
}

unsafe extern "C" fn close_send(comm: *mut c_void) -> NcclResult {
    // Safety: NCCL hands back a SendComm from connect, once (null or live until freed below).
    if let Some(c) = unsafe { (comm as *const SendComm).as_ref() } {
        dump_if_in_flight("closeSend", c.engine_id(), c.index(), crate::inflight::Direction::Send);
    }
    // Safety: as above.
    unsafe { close::<SendComm>("closeSend", comm) }
}

unsafe extern "C" fn close_recv(comm: *mut c_void) -> NcclResult {
    // Safety: NCCL hands back a RecvComm from accept, once (null or live until freed below).
    if let Some(c) = unsafe { (comm as *const RecvComm).as_ref() } {
        dump_if_in_flight("closeRecv", c.engine_id(), c.index(), crate::inflight::Direction::Recv);
    }
    // Safety: as above.
    unsafe { close::<RecvComm>("closeRecv", comm) }
}

/// A comm closed with requests still in flight is NCCL aborting (a clean teardown tests every
/// request to completion first): dump what was in flight.
fn dump_if_in_flight(call: &str, engine: accord_engine::EngineId, comm: u32, direction: crate::inflight::Direction) {
    let pending = crate::inflight::count_for(comm, direction);
    if pending > 0 {
        crate::inflight::dump(engine, &format!("{call} of comm {comm} with {pending} request(s) in flight"), false);
    }
}

unsafe extern "C" fn close_listen(comm: *mut c_void) -> NcclResult {
    // Safety: NCCL hands back a ListenComm from listen, once.
    unsafe { close::<ListenComm>("closeListen", comm) }
}

unsafe extern "C" fn get_device_mr(_comm: *mut c_void, _mhandle: *mut c_void, dptr: *mut *mut c_void) -> NcclResult {
    guard("getDeviceMr", || {
        if !dptr.is_null() {
            // Safety: non-null, NCCL passes a writable pointer.
            unsafe { *dptr = std::ptr::null_mut() };
        }
        Err(PluginError::Unsupported("device-side memory handles (netDeviceType is HOST)".into()))
    })
}

unsafe extern "C" fn irecv_consumed(_recv_comm: *mut c_void, _n: c_int, _request: *mut c_void) -> NcclResult {
    // Only device-offload plugins are told of consumption; host receives need nothing.
    abi::NCCL_SUCCESS
}

unsafe extern "C" fn make_vdevice(d: *mut c_int, props: *mut VDeviceProps) -> NcclResult {
    guard("makeVDevice", || {
        // Safety: NCCL passes a readable properties struct (or null).
        let props = unsafe { props.as_ref() }.ok_or_else(|| null_arg("props"))?;
        let rt = runtime::current()?;
        if props.ndevs != 1 {
            return Err(PluginError::Unsupported(format!(
                "a virtual device of {} NICs: the engine already spreads every comm over all its NICs, so use \
                 one device per engine (ACCORD_NET_IFS)",
                props.ndevs
            )));
        }
        rt.device(props.devs[0])?;
        // Safety: NCCL passes a writable int.
        unsafe { store(d, props.devs[0], "d") }
    })
}

unsafe extern "C" fn finalize(ctx: *mut c_void) -> NcclResult {
    // A context whose init failed is null: nothing to free. The engine stays for the process.
    guard("finalize", || {
        if ctx.is_null() {
            return Ok(());
        }
        // Safety: ctx is a Context box from init, handed back once.
        let context = unsafe { Box::from_raw(ctx as *mut Context) };
        log_statistics(&context.rt);
        Ok(())
    })
}

/// Logs the engine's transport statistics (NCCL_DEBUG=INFO, subsystem NET).
fn log_statistics(rt: &Runtime) {
    if rt.gpu_buffers {
        log::info(abi::SUBSYS_NET, line!(), &crate::gpu_stats::summary());
    }
    let stats = rt.engine.stats();
    let injected_drops: u64 = stats.faults.iter().map(|f| f.dropped).sum();
    let sent: u64 = stats.lanes.iter().map(|l| l.endpoint.datagrams_sent).sum();
    log::info(
        abi::SUBSYS_NET,
        line!(),
        &format!(
            "engine statistics: datagrams sent {sent}, through shared memory {}, retransmits {}, spurious losses {}, \
             failovers {}, injected drops {injected_drops}, worker wakes {}, ring doorbells {}",
            stats.shm_datagrams_sent(),
            stats.retransmits(),
            stats.spurious_losses(),
            stats.failovers(),
            stats.wakes(),
            stats.shm_doorbells()
        ),
    );
    log::info(
        abi::SUBSYS_NET,
        line!(),
        &format!("bytes placed with streaming stores: {}", accord_engine::streaming::bytes_streamed()),
    );
    // With ACCORD_ENGINE_DEBUG: where the workers' time went, summed over lanes.
    let mut time = accord_engine::WorkerTime::default();
    stats.lanes.iter().for_each(|l| time.add(&l.time));
    if time.total_ns() > 0 {
        log::info(abi::SUBSYS_NET, line!(), &format!("engine workers' time: {}", time.shares()));
    }
}

unsafe extern "C" fn set_net_attr(_ctx: *mut c_void, attr: *mut NetAttr) -> NcclResult {
    guard("setNetAttr", || {
        // Safety: NCCL passes a readable attribute struct (or null).
        if let Some(a) = unsafe { attr.as_ref() } {
            log::trace(line!(), &format!("setNetAttr op {} algo {} proto {} (hints only)", a.op, a.algo, a.proto));
        }
        Ok(())
    })
}

/// The calls the v10 and v11 tables share.
const CALLS: NetCalls = NetCalls {
    accept,
    regMr: reg_mr,
    regMrDmaBuf: reg_mr_dma_buf,
    deregMr: dereg_mr,
    isend,
    irecv,
    iflush,
    test,
    closeSend: close_send,
    closeRecv: close_recv,
    closeListen: close_listen,
    getDeviceMr: get_device_mr,
    irecvConsumed: irecv_consumed,
    makeVDevice: make_vdevice,
};

/// The v11 table NCCL 2.28 looks up first.
#[no_mangle]
pub static ncclNetPlugin_v11: NetV11 = NetV11 {
    name: PLUGIN_NAME.as_ptr(),
    init: init_v11,
    devices,
    getProperties: get_properties_v11,
    listen: listen_v11,
    connect: connect_v11,
    calls: CALLS,
    finalize,
    setNetAttr: set_net_attr,
};

#[cfg(test)]
mod properties_tests {
    use super::properties_of;
    use crate::config::{GpuBuffers, NetConfig};
    use crate::runtime::Runtime;

    /// Devices report no PCI path (NCCL attaches them to the first CPU) and accept GPU memory
    /// only with GPU buffers on.
    #[test]
    fn devices_report_no_pci_path_and_gpu_memory_only_with_gpu_buffers() {
        let config = NetConfig { gpu_buffers: GpuBuffers::Off, ..NetConfig::default() };
        let mut rt = Runtime::new(config).expect("engine on loopback");
        let host = properties_of(&rt, 0).unwrap();
        assert!(host.pciPath.is_null());
        assert_eq!(host.ptrSupport, crate::abi::PTR_HOST);
        rt.gpu_buffers = true;
        let gpu = properties_of(&rt, 0).unwrap();
        assert!(gpu.pciPath.is_null(), "GPU buffers change no placement");
        assert_eq!(gpu.ptrSupport, crate::abi::PTR_HOST | crate::abi::PTR_CUDA);
        assert!(properties_of(&rt, 1).is_err(), "one loopback device, not two");
    }
}

#[cfg(test)]
mod hint_tests {
    use super::default_device_hint;
    use crate::config::NetConfig;

    #[test]
    fn the_hint_shows_only_when_the_devices_were_left_to_the_default() {
        let named = NetConfig::from_lookup(|n| (n == "ACCORD_NET_IFS").then(|| "127.0.0.1".to_string()), |_| None);
        assert_eq!(default_device_hint(&named.unwrap(), None), None);
        let plain = default_device_hint(&NetConfig::default(), None).unwrap();
        assert!(plain.contains("127.0.0.1") && !plain.contains("NCCL_SOCKET_IFNAME"), "{plain}");
        let with_nccl = default_device_hint(&NetConfig::default(), Some("ib0".to_string())).unwrap();
        assert!(with_nccl.contains("\"ib0\""), "{with_nccl}");
    }
}
