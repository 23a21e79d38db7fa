//! The `tracing` subscriber of every `accord` process (parent, ranks, the p2p benchmark's
//! second process): the engine's events go to standard error, filtered by `ACCORD_LOG` or,
//! where that is unset, `RUST_LOG` (same syntax: `debug`, `accord_engine=trace,warn`, ...).
//! Unset, only warnings and errors print, so a table on stdout stays clean either way.

use tracing_subscriber::EnvFilter;

/// The variable read first; `RUST_LOG` is the fallback.
pub const LOG_ENV: &str = "ACCORD_LOG";
/// What prints when neither variable is set.
const DEFAULT_FILTER: &str = "warn";

/// The filter the environment asks for, and a complaint when it was malformed.
fn filter_from(accord_log: Option<String>, rust_log: Option<String>) -> (EnvFilter, Option<String>) {
    let (name, spec) = match (accord_log, rust_log) {
        (Some(v), _) if !v.trim().is_empty() => (LOG_ENV, v),
        (_, Some(v)) if !v.trim().is_empty() => ("RUST_LOG", v),
        _ => return (EnvFilter::new(DEFAULT_FILTER), None),
    };
    match EnvFilter::try_new(&spec) {
        Ok(f) => (f, None),
        Err(e) => {
            (EnvFilter::new(DEFAULT_FILTER), Some(format!("ignoring {name}={spec:?} ({e}); logging warnings only")))
        }
    }
}

/// Installs the subscriber; a second call (or one after another subscriber) does nothing.
pub fn init() {
    // `env` fails only for a name or kind the table lacks (accord-knobs' tests).
    let accord_log = accord_knobs::env::<String>(LOG_ENV).ok().flatten();
    let (filter, complaint) = filter_from(accord_log, std::env::var("RUST_LOG").ok());
    let installed = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(true)
        .try_init()
        .is_ok();
    if let (true, Some(c)) = (installed, complaint) {
        tracing::warn!("{c}");
    }
}

#[cfg(test)]
mod tests {
    use super::filter_from;

    #[test]
    fn accord_log_wins_and_bad_filters_fall_back() {
        let (f, c) = filter_from(Some("debug".into()), Some("error".into()));
        assert_eq!(f.to_string(), "debug");
        assert!(c.is_none());
        let (f, c) = filter_from(None, Some("accord_engine=trace".into()));
        assert_eq!(f.to_string(), "accord_engine=trace");
        assert!(c.is_none());
        let (f, c) = filter_from(Some("[[[".into()), None);
        assert_eq!(f.to_string(), "warn");
        assert!(c.unwrap().contains("ACCORD_LOG"));
        assert_eq!(filter_from(None, None).0.to_string(), "warn");
    }
}
