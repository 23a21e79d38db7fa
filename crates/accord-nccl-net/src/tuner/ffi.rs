//! The exported tuner tables (`ncclTunerPlugin_v5` for NCCL 2.28, `ncclTunerPlugin_v4` for
//! 2.23-2.27), per NCCL's `tuner_v5.h`/`tuner_v4.h`: `{ name, init, getCollInfo, finalize }`;
//! v5's `init(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, logger,
//! ncclNvlDomainInfo_v5_t*, ncclTunerConstants_v5_t*)`, v4's `init(size_t nRanks, size_t
//! nNodes, logger, void** ctx)`; `getCollInfo(ctx, ncclFunc_t, size_t nBytes, int numPipeOps,
//! float** costTable, int numAlgo, int numProto, int regBuff, int* nChannels)`, where the cost
//! table is NCCL's contiguous `float[numAlgo][numProto]` passed as `float**`. Every entry
//! point is null-safe and catches panics; a failing `getCollInfo` makes NCCL use its own
//! tuning for that collective.
#![allow(unsafe_code)]

use super::{TunerPolicy, COST_TABLE_ENTRIES_MAX};
use crate::abi::{self, DebugLogger, NcclResult};
use crate::log;
use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

/// Name NCCL prints for the tuner.
pub const TUNER_NAME: &std::ffi::CStr = c"Accord";

/// Most (collective, size class) decisions logged per communicator.
const LOGGED_MAX: usize = 256;

/// One communicator's tuner state (what `init` hands NCCL as the context).
struct TunerContext {
    nodes: usize,
    policy: TunerPolicy,
    logged: Mutex<HashSet<(c_int, u32)>>,
}

/// `ncclTuner_v5_t`.
#[repr(C)]
pub struct TunerV5 {
    /// Tuner name.
    pub name: *const c_char,
    /// `init(void** ctx, commId, nRanks, nNodes, logger, nvlDomainInfo*, constants*)`.
    pub init:
        unsafe extern "C" fn(*mut *mut c_void, u64, usize, usize, DebugLogger, *mut c_void, *mut c_void) -> NcclResult,
    /// `getCollInfo`.
    pub get_coll_info: GetCollInfo,
    /// `finalize(ctx)`.
    pub finalize: unsafe extern "C" fn(*mut c_void) -> NcclResult,
}

/// `ncclTuner_v4_t`.
#[repr(C)]
pub struct TunerV4 {
    /// Tuner name.
    pub name: *const c_char,
    /// `init(nRanks, nNodes, logger, void** ctx)`.
    pub init: unsafe extern "C" fn(usize, usize, DebugLogger, *mut *mut c_void) -> NcclResult,
    /// `getCollInfo`.
    pub get_coll_info: GetCollInfo,
    /// `destroy(ctx)`.
    pub destroy: unsafe extern "C" fn(*mut c_void) -> NcclResult,
}

/// `getCollInfo(ctx, collType, nBytes, numPipeOps, costTable, numAlgo, numProto, regBuff, nChannels*)`.
pub type GetCollInfo = unsafe extern "C" fn(
    *mut c_void,
    c_int,
    usize,
    c_int,
    *mut *mut f32,
    c_int,
    c_int,
    c_int,
    *mut c_int,
) -> NcclResult;

// Safety: the tables hold a pointer to a static C string and function pointers only.
unsafe impl Sync for TunerV5 {}
unsafe impl Sync for TunerV4 {}

/// The table NCCL 2.28 looks up (`dlsym(lib, "ncclTunerPlugin_v5")`).
#[no_mangle]
pub static ncclTunerPlugin_v5: TunerV5 =
    TunerV5 { name: TUNER_NAME.as_ptr(), init: init_v5, get_coll_info, finalize: finalize_context };

/// The table NCCL 2.23-2.27 look up.
#[no_mangle]
pub static ncclTunerPlugin_v4: TunerV4 =
    TunerV4 { name: TUNER_NAME.as_ptr(), init: init_v4, get_coll_info, destroy: finalize_context };

fn guarded(name: &str, body: impl FnOnce() -> Result<(), String>) -> NcclResult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => abi::NCCL_SUCCESS,
        Ok(Err(e)) => {
            log::warn(line!(), &format!("tuner {name}: {e}"));
            abi::NCCL_INVALID_ARGUMENT
        }
        Err(_) => {
            log::warn(line!(), &format!("tuner {name}: internal error (panic caught)"));
            abi::NCCL_INTERNAL_ERROR
        }
    }
}

/// Makes a context and stores it at `ctx`.
///
/// # Safety
/// `ctx` must be null or valid for a pointer write.
unsafe fn make_context(ctx: *mut *mut c_void, ranks: usize, nodes: usize, logger: DebugLogger) -> NcclResult {
    guarded("init", || {
        if ctx.is_null() {
            return Err("context pointer is null".into());
        }
        crate::engine_log::use_nccl_logger(logger);
        let policy = TunerPolicy::from_lookup(|name| std::env::var(name).ok())?;
        log::info(
            abi::SUBSYS_INIT,
            line!(),
            &format!(
                "tuner for {ranks} ranks on {nodes} nodes: {}",
                if !policy.enabled {
                    "off (ACCORD_TUNER=0)".to_string()
                } else if nodes < 2 {
                    "single node, NCCL's own choices".to_string()
                } else {
                    format!(
                        "Simple from {} B, one channel per {} B below 4 channels",
                        policy.min_bytes, policy.channel_bytes
                    )
                }
            ),
        );
        let context = Box::new(TunerContext { nodes, policy, logged: Mutex::new(HashSet::new()) });
        // Safety: checked non-null above; NCCL passes a writable slot for the context.
        unsafe { *ctx = Box::into_raw(context).cast() };
        Ok(())
    })
}

unsafe extern "C" fn init_v5(
    ctx: *mut *mut c_void,
    _comm_id: u64,
    ranks: usize,
    nodes: usize,
    logger: DebugLogger,
    _nvl_domain_info: *mut c_void,
    _constants: *mut c_void,
) -> NcclResult {
    // Safety: forwarded from NCCL's call (see make_context).
    unsafe { make_context(ctx, ranks, nodes, logger) }
}

unsafe extern "C" fn init_v4(ranks: usize, nodes: usize, logger: DebugLogger, ctx: *mut *mut c_void) -> NcclResult {
    // Safety: forwarded from NCCL's call (see make_context).
    unsafe { make_context(ctx, ranks, nodes, logger) }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn get_coll_info(
    ctx: *mut c_void,
    coll: c_int,
    bytes: usize,
    _pipe_ops: c_int,
    table: *mut *mut f32,
    algorithms: c_int,
    protocols: c_int,
    _reg_buff: c_int,
    channels: *mut c_int,
) -> NcclResult {
    guarded("getCollInfo", || {
        // Safety: `ctx` is null or what make_context boxed (NCCL hands it back unchanged).
        let context = unsafe { ctx.cast::<TunerContext>().as_ref() }.ok_or("context is null")?;
        let (algorithms, protocols) = (usize::try_from(algorithms), usize::try_from(protocols));
        let (Ok(algorithms), Ok(protocols)) = (algorithms, protocols) else {
            return Err("negative table dimensions".into());
        };
        let entries = algorithms.checked_mul(protocols).filter(|&n| n > 0 && n <= COST_TABLE_ENTRIES_MAX);
        let Some(entries) = entries else { return Err(format!("cost table of {algorithms} x {protocols}")) };
        if table.is_null() || channels.is_null() {
            return Err("cost table or channel count is null".into());
        }
        // Safety: NCCL passes its contiguous float[numAlgo][numProto] table cast to float**, valid
        // for reads and writes of `entries` floats during this call.
        let costs = unsafe { std::slice::from_raw_parts_mut(table.cast::<f32>(), entries) };
        let decision = context.policy.decide(context.nodes, bytes as u64, costs, protocols);
        if let Some(n) = decision.channels {
            // Safety: checked non-null; NCCL passes a writable int.
            unsafe { *channels = n as c_int };
        }
        if context.policy.log && (decision.simple_only || decision.channels.is_some()) {
            let class = usize::BITS - bytes.leading_zeros();
            let mut logged = context.logged.lock().unwrap_or_else(|e| e.into_inner());
            if logged.len() < LOGGED_MAX && logged.insert((coll, class)) {
                log::info(
                    abi::SUBSYS_TUNING,
                    line!(),
                    &format!(
                        "tuner: coll {coll} {bytes} B -> Simple only {}, channels {:?}",
                        decision.simple_only, decision.channels
                    ),
                );
            }
        }
        Ok(())
    })
}

unsafe extern "C" fn finalize_context(ctx: *mut c_void) -> NcclResult {
    guarded("finalize", || {
        if !ctx.is_null() {
            // Safety: `ctx` came from make_context's Box::into_raw and NCCL finalizes it once.
            drop(unsafe { Box::from_raw(ctx.cast::<TunerContext>()) });
        }
        Ok(())
    })
}
