//! The engine's `tracing` events, forwarded to Python's `logging` (logger `accord`).
//!
//! Engine threads never wait for the GIL here: an event at or above the threshold is
//! formatted and put on a bounded queue (dropped and counted when full), and one forwarder
//! thread takes the GIL to hand each record to `logging.getLogger("accord")`. Waiting for the
//! GIL on an engine thread could deadlock: a Python thread that holds the GIL may be waiting
//! for a lock that engine thread holds. Events below the threshold cost one atomic load.
//!
//! The threshold starts at the `accord` logger's effective level when the package is imported
//! and follows `accord.set_log_level`; Python's own filtering applies on top.

use pyo3::prelude::*;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::OnceLock;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

/// Records waiting for the forwarder; beyond, new ones are dropped and counted.
const QUEUE_MAX: usize = 4096;

/// Most verbose level forwarded: 0 none, 1 error, 2 warn, 3 info, 4 debug, 5 trace.
static THRESHOLD: AtomicU8 = AtomicU8::new(2);
/// Records dropped because the queue was full.
static DROPPED: AtomicU64 = AtomicU64::new(0);
static QUEUE: OnceLock<SyncSender<Record>> = OnceLock::new();

/// Python's numeric level for a tracing level (TRACE below DEBUG, as 5).
fn python_level(level: &Level) -> i32 {
    match *level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        Level::DEBUG => 10,
        Level::TRACE => 5,
    }
}

/// The threshold for a Python level: what `logging` would let through.
fn threshold_for(python_level: i32) -> u8 {
    match python_level {
        l if l <= 5 => 5,
        l if l <= 10 => 4,
        l if l <= 20 => 3,
        l if l <= 30 => 2,
        l if l <= 40 => 1,
        _ => 0,
    }
}

/// One event, formatted on the engine thread.
struct Record {
    level: i32,
    message: String,
}

/// Collects an event's message and fields as `message field=value ...`.
#[derive(Default)]
struct Text {
    message: String,
    fields: String,
}

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }
}

struct Bridge;

impl<S: Subscriber> Layer<S> for Bridge {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        // Decided per event (the threshold changes at run time), never cached as "never".
        tracing::subscriber::Interest::sometimes()
    }

    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        accord_engine::log_level::verbosity(metadata.level()) <= THRESHOLD.load(Ordering::Relaxed)
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let Some(queue) = QUEUE.get() else { return };
        let mut text = Text::default();
        event.record(&mut text);
        let meta = event.metadata();
        let record = Record {
            level: python_level(meta.level()),
            message: format!("{}: {}{}", meta.target(), text.message, text.fields),
        };
        if let Err(TrySendError::Full(_)) = queue.try_send(record) {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Hands queued records to `logging` until the interpreter goes away.
fn forward(records: Receiver<Record>) {
    while let Ok(r) = records.recv() {
        let alive = Python::try_attach(|py| {
            let sent = py
                .import("logging")
                .and_then(|logging| logging.call_method1("getLogger", ("accord",)))
                .and_then(|logger| logger.call_method1("log", (r.level, r.message)));
            if let Err(e) = sent {
                // A broken handler must not take the engine down; Python prints it once here.
                e.print(py);
            }
        });
        if alive.is_none() {
            return;
        }
    }
}

/// Installs the bridge as the process's `tracing` subscriber (once; later calls only set the
/// threshold). Returns false when another subscriber was installed first (e.g. by a Rust
/// program embedding Python), in which case that one gets the events.
#[pyfunction]
pub(crate) fn _install_log_bridge(python_level: i32) -> bool {
    _set_log_threshold(python_level);
    if QUEUE.get().is_some() {
        return true;
    }
    let (tx, rx) = sync_channel(QUEUE_MAX);
    if QUEUE.set(tx).is_err() {
        return true;
    }
    let started = std::thread::Builder::new().name("accord-log".into()).spawn(move || forward(rx)).is_ok();
    started && tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Bridge)).is_ok()
}

/// Forwards events at `python_level` and above from now on.
#[pyfunction]
pub(crate) fn _set_log_threshold(python_level: i32) {
    THRESHOLD.store(threshold_for(python_level), Ordering::Relaxed);
    tracing::callsite::rebuild_interest_cache();
}

/// Records dropped because Python did not take them fast enough.
#[pyfunction]
pub(crate) fn _log_records_dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}
