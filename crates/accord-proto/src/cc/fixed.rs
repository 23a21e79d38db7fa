//! A constant window: the baseline every other policy is measured against, and the policy
//! tests use when they want the transport's behaviour without congestion control in the way.

use super::CongestionControl;

/// A window that never changes and never paces.
///
/// Useful as a baseline in benchmarks (how much does a real policy cost or gain?) and in tests
/// of reliability and multipath, where a moving window would only add noise. It ignores every
/// signal, so on a congested fabric it behaves badly by design.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FixedWindow {
    window_bytes: u64,
}

impl FixedWindow {
    /// Window used when `fixed` is chosen by name: 4 MiB covers the bandwidth-delay product of
    /// a 400 Gb/s link at an RTT of about 80 µs, so a test is not window-limited by accident.
    pub const DEFAULT_WINDOW_BYTES: u64 = 4 * 1024 * 1024;

    /// A controller that always allows `window_bytes` in flight. Zero is raised to one byte so
    /// the connection can always make progress (the caller sends at least one packet).
    pub fn new(window_bytes: u64) -> Self {
        FixedWindow { window_bytes: window_bytes.max(1) }
    }
}

impl Default for FixedWindow {
    /// The same window as choosing `fixed` by name.
    fn default() -> Self {
        FixedWindow::new(Self::DEFAULT_WINDOW_BYTES)
    }
}

impl CongestionControl for FixedWindow {
    fn name(&self) -> &'static str {
        "fixed"
    }

    fn window_bytes(&self) -> u64 {
        self.window_bytes
    }
}
