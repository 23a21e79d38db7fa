//! The engine's `tracing` events, forwarded to NCCL's logger at the matching level, so the
//! engine's warnings appear in an NCCL job's log (`NCCL_DEBUG=WARN`) beside the plugin's own:
//! ERROR and WARN become `NCCL_LOG_WARN`, INFO `NCCL_LOG_INFO`, DEBUG and TRACE
//! `NCCL_LOG_TRACE`, all under the NET subsystem.
//!
//! Which events are formatted at all follows `NCCL_DEBUG` (WARN unless it says INFO or TRACE),
//! raised by `ACCORD_LOG` (`info`, `debug`, `trace`); events below cost one atomic load. The
//! subscriber is installed once, at the first `init` that passes a logger, and only when the
//! host process has none of its own.

use crate::abi;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Once;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

/// Most verbose level forwarded: 1 error, 2 warn, 3 info, 4 debug, 5 trace.
static THRESHOLD: AtomicU8 = AtomicU8::new(2);
static INSTALL: Once = Once::new();

/// NCCL's level for an engine event's level.
pub fn nccl_level(level: &Level) -> std::ffi::c_int {
    match *level {
        Level::ERROR | Level::WARN => abi::LOG_WARN,
        Level::INFO => abi::LOG_INFO,
        Level::DEBUG | Level::TRACE => abi::LOG_TRACE,
    }
}

/// The threshold `NCCL_DEBUG` and `ACCORD_LOG` ask for.
fn threshold_from(nccl_debug: Option<&str>, accord_log: Option<&str>) -> u8 {
    let nccl = match nccl_debug.map(|v| v.trim().to_ascii_uppercase()) {
        Some(v) if v == "TRACE" => 5,
        Some(v) if v == "INFO" => 3,
        _ => 2,
    };
    let accord = match accord_log.map(|v| v.trim().to_ascii_lowercase()) {
        Some(v) if v == "trace" => 5,
        Some(v) if v == "debug" => 4,
        Some(v) if v == "info" => 3,
        _ => 0,
    };
    nccl.max(accord)
}

/// An event's message and fields as one line.
#[derive(Default)]
struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        let _ = match field.name() {
            "message" => write!(self.0, "{value:?}"),
            name => write!(self.0, " {name}={value:?}"),
        };
    }
}

/// The layer that hands events to NCCL's logger.
pub struct ToNccl;

impl<S: Subscriber> Layer<S> for ToNccl {
    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        accord_engine::log_level::verbosity(metadata.level()) <= THRESHOLD.load(Ordering::Relaxed)
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut line = Line::default();
        event.record(&mut line);
        let meta = event.metadata();
        crate::log::emit_engine(nccl_level(meta.level()), &format!("NET/Accord : {}: {}", meta.target(), line.0));
    }
}

/// Remembers NCCL's logger ([`crate::log::set_logger`]) and, when there is one, forwards the
/// engine's events to it from then on ([`install`]). What `init` of the net plugin and of the
/// tuner call with the logger NCCL passes.
pub fn use_nccl_logger(logger: abi::DebugLogger) {
    let given = logger.is_some();
    crate::log::set_logger(logger);
    if given {
        install();
    }
}

/// Installs the forwarding subscriber (once per process).
pub fn install() {
    INSTALL.call_once(|| {
        let accord_log = accord_knobs::env::<String>("ACCORD_LOG").ok().flatten();
        let threshold = threshold_from(std::env::var("NCCL_DEBUG").ok().as_deref(), accord_log.as_deref());
        THRESHOLD.store(threshold, Ordering::Relaxed);
        // Another subscriber (the host program's) keeps the events when there is one.
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(ToNccl));
    });
}

#[cfg(test)]
#[allow(unsafe_code)] // a stand-in for NCCL's C logger
mod tests {
    use super::*;
    use std::ffi::{c_char, c_int, c_ulong, CStr};
    use std::sync::Mutex;

    static SEEN: Mutex<Vec<(c_int, String)>> = Mutex::new(Vec::new());

    /// Stands in for NCCL's C-variadic logger: takes exactly the six arguments the plugin
    /// passes (level, flags, file, line, "%s", message), where the x86-64 and AArch64 Linux
    /// calling conventions place them for a variadic callee too.
    unsafe extern "C" fn fake_logger(
        level: c_int,
        _flags: c_ulong,
        _file: *const c_char,
        _line: c_int,
        _fmt: *const c_char,
        msg: *const c_char,
    ) {
        // Safety: the plugin passes a NUL-terminated message.
        let text = unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned();
        SEEN.lock().unwrap().push((level, text));
    }

    #[test]
    fn engine_events_reach_nccls_logger_at_the_matching_level() {
        // Safety: see `fake_logger`.
        let logger: abi::DebugLogger = unsafe {
            Some(std::mem::transmute::<
                unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, *const c_char),
                unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...),
            >(fake_logger))
        };
        crate::log::set_logger(logger);
        THRESHOLD.store(3, Ordering::Relaxed);
        tracing::subscriber::with_default(tracing_subscriber::registry().with(ToNccl), || {
            tracing::warn!(target: "accord_engine::worker", lane = 0, "connection failed");
            tracing::info!(target: "accord_engine::cma", "pull route verified");
            tracing::debug!(target: "accord_engine::worker", "path quarantined (below the threshold)");
        });
        let seen = SEEN.lock().unwrap().clone();
        let warn = seen.iter().find(|(_, t)| t.contains("connection failed")).expect("the warning");
        assert_eq!(warn.0, abi::LOG_WARN);
        assert_eq!(warn.1, "NET/Accord : accord_engine::worker: connection failed lane=0");
        let info = seen.iter().find(|(_, t)| t.contains("pull route verified")).expect("the info line");
        assert_eq!(info.0, abi::LOG_INFO);
        assert!(!seen.iter().any(|(_, t)| t.contains("below the threshold")), "{seen:?}");
    }

    #[test]
    fn levels_and_thresholds_follow_nccl_debug() {
        assert_eq!(nccl_level(&Level::ERROR), abi::LOG_WARN);
        assert_eq!(nccl_level(&Level::WARN), abi::LOG_WARN);
        assert_eq!(nccl_level(&Level::INFO), abi::LOG_INFO);
        assert_eq!(nccl_level(&Level::DEBUG), abi::LOG_TRACE);
        assert_eq!(threshold_from(None, None), 2);
        assert_eq!(threshold_from(Some("INFO"), None), 3);
        assert_eq!(threshold_from(Some("WARN"), Some("debug")), 4);
        assert_eq!(threshold_from(Some("TRACE"), Some("info")), 5);
    }
}
