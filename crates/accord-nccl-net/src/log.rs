//! Logging through the logger NCCL passes to `init` (FFI). Messages go as one `%s` argument,
//! so nothing of ours is ever interpreted as a format. Without a logger, warnings go to stderr.
#![allow(unsafe_code)]

use crate::abi::{self, DebugLogger};
use std::ffi::{c_int, c_ulong, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

static LOGGER: RwLock<DebugLogger> = RwLock::new(None);
const FORMAT: &std::ffi::CStr = c"%s";
const FILE: &std::ffi::CStr = c"accord-nccl-net";

/// Remembers NCCL's logger (every `init` passes the same one; the latest wins). The plugin's
/// entry points call [`crate::engine_log::use_nccl_logger`], which also forwards the engine's
/// events to it.
pub fn set_logger(logger: DebugLogger) {
    if logger.is_some() {
        *LOGGER.write().unwrap_or_else(|e| e.into_inner()) = logger;
    }
}

/// An engine event at NCCL `level` (NET subsystem).
pub fn emit_engine(level: c_int, message: &str) {
    emit(level, abi::SUBSYS_NET, line!(), message);
}

fn emit(level: c_int, flags: c_ulong, line: u32, message: &str) {
    let logger = *LOGGER.read().unwrap_or_else(|e| e.into_inner());
    match logger {
        Some(log) => {
            let text = CString::new(message.replace('\0', "?")).unwrap_or_default();
            // Safety: NCCL's logger takes (level, flags, file, line, fmt, ...); we pass a static
            // "%s" format with exactly one NUL-terminated string argument, alive for the call.
            unsafe { log(level, flags, FILE.as_ptr(), line as c_int, FORMAT.as_ptr(), text.as_ptr()) };
        }
        None if level == abi::LOG_WARN => eprintln!("NET/Accord WARN {message}"),
        None => {}
    }
}

/// A warning (NCCL prints these by default).
pub fn warn(line: u32, message: &str) {
    emit(abi::LOG_WARN, abi::SUBSYS_NET, line, &format!("NET/Accord : {message}"));
}

/// An informational line (`NCCL_DEBUG=INFO`, subsystem NET or INIT).
pub fn info(flags: c_ulong, line: u32, message: &str) {
    emit(abi::LOG_INFO, flags, line, &format!("NET/Accord : {message}"));
}

/// A trace line (`NCCL_DEBUG=TRACE` builds only).
pub fn trace(line: u32, message: &str) {
    emit(abi::LOG_TRACE, abi::SUBSYS_NET, line, &format!("NET/Accord : {message}"));
}

/// Data-path events still to log (`ACCORD_NET_TRACE`; 0: none).
static EVENTS_LEFT: AtomicU64 = AtomicU64::new(0);

/// Logs the next `count` data-path events (requests posted, matched, done) as INFO lines, for
/// finding where a stalled job's messages stop. Set once by the runtime from the configuration.
pub fn set_event_budget(count: u64) {
    EVENTS_LEFT.store(count, Ordering::Relaxed);
}

/// One data-path event, logged only while the budget lasts (`message` is built only then, so
/// events cost one atomic load when tracing is off).
pub fn event(line: u32, message: impl FnOnce() -> String) {
    if EVENTS_LEFT.load(Ordering::Relaxed) == 0 {
        return;
    }
    let left = EVENTS_LEFT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    if left.is_ok() {
        info(abi::SUBSYS_NET, line, &message());
    }
}
