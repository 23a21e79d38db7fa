//! The NCCL net plugin ABI, versions 11 and 10: result codes, constants, the properties
//! structs and the function tables, written from the facts of NCCL's public headers
//! (`src/include/plugin/nccl_net.h`, `net/net_v11.h`, `net/net_v10.h`, NCCL 2.28).
//!
//! Only types live here; the functions that fill the tables are in [`crate::ffi`].
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_float, c_int, c_ulong, c_void};

/// `ncclResult_t`.
pub type NcclResult = c_int;
/// `ncclSuccess`.
pub const NCCL_SUCCESS: NcclResult = 0;
/// `ncclSystemError`: an operating-system call failed.
pub const NCCL_SYSTEM_ERROR: NcclResult = 2;
/// `ncclInternalError`: a bug or an unsupported request.
pub const NCCL_INTERNAL_ERROR: NcclResult = 3;
/// `ncclInvalidArgument`.
pub const NCCL_INVALID_ARGUMENT: NcclResult = 4;
/// `ncclInvalidUsage`.
pub const NCCL_INVALID_USAGE: NcclResult = 5;
/// `ncclRemoteError`: the peer failed or went away.
pub const NCCL_REMOTE_ERROR: NcclResult = 6;

/// `NCCL_NET_HANDLE_MAXSIZE`: bytes of a listen handle.
pub const NET_HANDLE_BYTES_MAX: usize = 128;
/// `NCCL_NET_MAX_REQUESTS`: requests NCCL keeps outstanding per comm (per grouped receive).
pub const NET_REQUESTS_MAX: usize = 32;
/// `NCCL_NET_MAX_DEVS_PER_NIC`: length of `ncclNetVDeviceProps_t::devs`.
pub const NET_DEVS_PER_NIC_MAX: usize = 4;
/// `NCCL_PTR_HOST`.
pub const PTR_HOST: c_int = 0x1;
/// `NCCL_PTR_CUDA`.
pub const PTR_CUDA: c_int = 0x2;
/// `NCCL_NET_DEVICE_HOST` (an `ncclNetDeviceType` enumerator).
pub const NET_DEVICE_HOST: c_int = 0;
/// `NCCL_NET_DEVICE_INVALID_VERSION`.
pub const NET_DEVICE_INVALID_VERSION: c_int = 0;
/// `MAX_NET_SIZE`: a power of two below `INT_MAX`, since `test` reports sizes as `int`.
pub const NET_SIZE_BYTES_MAX: usize = 1 << 30;

/// `ncclDebugLogLevel`: `NCCL_LOG_WARN`.
pub const LOG_WARN: c_int = 2;
/// `NCCL_LOG_INFO`.
pub const LOG_INFO: c_int = 3;
/// `NCCL_LOG_TRACE`.
pub const LOG_TRACE: c_int = 5;
/// `ncclDebugLogSubSys`: `NCCL_INIT`.
pub const SUBSYS_INIT: c_ulong = 1;
/// `NCCL_NET`.
pub const SUBSYS_NET: c_ulong = 16;
/// `NCCL_TUNING`.
pub const SUBSYS_TUNING: c_ulong = 0x40;

/// `ncclDebugLogger_t`: `void (*)(level, flags, file, line, fmt, ...)`.
pub type DebugLogger = Option<
    unsafe extern "C" fn(level: c_int, flags: c_ulong, file: *const c_char, line: c_int, fmt: *const c_char, ...),
>;
/// `ncclProfilerCallback_t`; never called by this plugin.
pub type ProfilerCallback = *mut c_void;

/// `ncclNetVDeviceProps_v11_t` (identical in v10).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct VDeviceProps {
    /// Physical devices merged into this virtual one.
    pub ndevs: c_int,
    /// Their indices.
    pub devs: [c_int; NET_DEVS_PER_NIC_MAX],
}

/// `ncclNetCommConfig_v11_t` (identical in v10).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CommConfig {
    /// Plugin-specific traffic class, `NCCL_NET_TRAFFIC_CLASS_UNDEF` (-1) when unset.
    pub trafficClass: c_int,
}

/// `ncclNetProperties_v10_t`.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct PropertiesV10 {
    /// Device name, for logs.
    pub name: *mut c_char,
    /// PCI path in /sys, or null (virtual device).
    pub pciPath: *mut c_char,
    /// Unique per NIC.
    pub guid: u64,
    /// `NCCL_PTR_*` bits.
    pub ptrSupport: c_int,
    /// Whether `regMr` is independent of the comm.
    pub regIsGlobal: c_int,
    /// Whether receives need a flush.
    pub forceFlush: c_int,
    /// Port speed in Mbps.
    pub speed: c_int,
    /// Port number.
    pub port: c_int,
    /// Latency in microseconds.
    pub latency: c_float,
    /// Comms the device supports.
    pub maxComms: c_int,
    /// Most receives in one grouped `irecv`.
    pub maxRecvs: c_int,
    /// `ncclNetDeviceType`.
    pub netDeviceType: c_int,
    /// Offload version.
    pub netDeviceVersion: c_int,
    /// Virtual device composition.
    pub vProps: VDeviceProps,
    /// Largest point-to-point transfer.
    pub maxP2pBytes: usize,
    /// Largest collective transfer.
    pub maxCollBytes: usize,
}

/// `ncclNetProperties_v11_t`: v10's fields plus `maxMultiRequestSize`.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct PropertiesV11 {
    /// The v10 prefix (same layout, same order).
    pub base: PropertiesV10,
    /// Requests one multi-request may hold (1: no multi-request support).
    pub maxMultiRequestSize: c_int,
}

/// `ncclNetAttr_v11_t`'s per-direction part.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CommAttr {
    /// Hints, -1 when undefined.
    pub maxConcurrentPeers: i32,
    /// See above.
    pub minConcurrentPeers: i32,
    /// See above.
    pub maxFlowsPerPeer: i32,
    /// See above.
    pub minFlowsPerPeer: i32,
}

/// `ncclNetAttr_v11_t`: application hints passed to `setNetAttr`.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct NetAttr {
    /// Send side hints.
    pub sendCommAttr: CommAttr,
    /// Receive side hints.
    pub recvCommAttr: CommAttr,
    /// Collective operation.
    pub op: u32,
    /// Algorithm.
    pub algo: u32,
    /// Protocol.
    pub proto: u32,
}

type Ptr = *mut c_void;
type PtrOut = *mut *mut c_void;

/// The fourteen calls `ncclNet_v10_t` and `ncclNet_v11_t` share, `accept` to `makeVDevice`,
/// with the same signatures in the same order. Both tables embed it: a `repr(C)` struct of
/// pointers lays out exactly as the same pointers inline, so the C layout is unchanged.
#[repr(C)]
pub struct NetCalls {
    /// `accept(listenComm, recvComm, recvDevComm)`.
    pub accept: unsafe extern "C" fn(Ptr, PtrOut, PtrOut) -> NcclResult,
    /// `regMr(comm, data, size, type, mhandle)`.
    pub regMr: unsafe extern "C" fn(Ptr, Ptr, usize, c_int, PtrOut) -> NcclResult,
    /// `regMrDmaBuf(comm, data, size, type, offset, fd, mhandle)`.
    pub regMrDmaBuf: unsafe extern "C" fn(Ptr, Ptr, usize, c_int, u64, c_int, PtrOut) -> NcclResult,
    /// `deregMr(comm, mhandle)`.
    pub deregMr: unsafe extern "C" fn(Ptr, Ptr) -> NcclResult,
    /// `isend(sendComm, data, size, tag, mhandle, phandle, request)`.
    pub isend: unsafe extern "C" fn(Ptr, Ptr, usize, c_int, Ptr, Ptr, PtrOut) -> NcclResult,
    /// `irecv(recvComm, n, data, sizes, tags, mhandles, phandles, request)`.
    pub irecv: unsafe extern "C" fn(Ptr, c_int, PtrOut, *mut usize, *mut c_int, PtrOut, PtrOut, PtrOut) -> NcclResult,
    /// `iflush(recvComm, n, data, sizes, mhandles, request)`.
    pub iflush: unsafe extern "C" fn(Ptr, c_int, PtrOut, *mut c_int, PtrOut, PtrOut) -> NcclResult,
    /// `test(request, done, sizes)`.
    pub test: unsafe extern "C" fn(Ptr, *mut c_int, *mut c_int) -> NcclResult,
    /// `closeSend(sendComm)`.
    pub closeSend: unsafe extern "C" fn(Ptr) -> NcclResult,
    /// `closeRecv(recvComm)`.
    pub closeRecv: unsafe extern "C" fn(Ptr) -> NcclResult,
    /// `closeListen(listenComm)`.
    pub closeListen: unsafe extern "C" fn(Ptr) -> NcclResult,
    /// `getDeviceMr(comm, mhandle, dptr_mhandle)`.
    pub getDeviceMr: unsafe extern "C" fn(Ptr, Ptr, PtrOut) -> NcclResult,
    /// `irecvConsumed(recvComm, n, request)`.
    pub irecvConsumed: unsafe extern "C" fn(Ptr, c_int, Ptr) -> NcclResult,
    /// `makeVDevice(d, props)`.
    pub makeVDevice: unsafe extern "C" fn(*mut c_int, *mut VDeviceProps) -> NcclResult,
}

/// `ncclNet_v11_t`, field for field.
#[repr(C)]
pub struct NetV11 {
    /// Network name, matched against `NCCL_NET`.
    pub name: *const c_char,
    /// `init(ctx, commId, config, logFunction, profFunction)`.
    pub init: unsafe extern "C" fn(PtrOut, u64, *mut CommConfig, DebugLogger, ProfilerCallback) -> NcclResult,
    /// `devices(ndev)`.
    pub devices: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    /// `getProperties(dev, props)`.
    pub getProperties: unsafe extern "C" fn(c_int, *mut PropertiesV11) -> NcclResult,
    /// `listen(ctx, dev, handle, listenComm)`.
    pub listen: unsafe extern "C" fn(Ptr, c_int, Ptr, PtrOut) -> NcclResult,
    /// `connect(ctx, dev, handle, sendComm, sendDevComm)`.
    pub connect: unsafe extern "C" fn(Ptr, c_int, Ptr, PtrOut, PtrOut) -> NcclResult,
    /// The calls v10 and v11 share, `accept` to `makeVDevice`, in their order.
    pub calls: NetCalls,
    /// `finalize(ctx)`.
    pub finalize: unsafe extern "C" fn(Ptr) -> NcclResult,
    /// `setNetAttr(ctx, netAttr)`.
    pub setNetAttr: unsafe extern "C" fn(Ptr, *mut NetAttr) -> NcclResult,
}

/// `ncclNet_v10_t`, field for field (no contexts, no `finalize`, no `setNetAttr`).
#[repr(C)]
pub struct NetV10 {
    /// Network name.
    pub name: *const c_char,
    /// `init(logFunction, profFunction)`.
    pub init: unsafe extern "C" fn(DebugLogger, ProfilerCallback) -> NcclResult,
    /// `devices(ndev)`.
    pub devices: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    /// `getProperties(dev, props)`.
    pub getProperties: unsafe extern "C" fn(c_int, *mut PropertiesV10) -> NcclResult,
    /// `listen(dev, handle, listenComm)`.
    pub listen: unsafe extern "C" fn(c_int, Ptr, PtrOut) -> NcclResult,
    /// `connect(dev, config, handle, sendComm, sendDevComm)`.
    pub connect: unsafe extern "C" fn(c_int, *mut CommConfig, Ptr, PtrOut, PtrOut) -> NcclResult,
    /// The calls v10 and v11 share, `accept` to `makeVDevice`, in their order.
    pub calls: NetCalls,
}

// Safety: the tables are immutable after construction: function pointers and a pointer to a
// static C string, both valid for the whole program and safe to read from any thread.
#[allow(unsafe_code)]
unsafe impl Sync for NetV11 {}
// Safety: as for `NetV11`.
#[allow(unsafe_code)]
unsafe impl Sync for NetV10 {}
