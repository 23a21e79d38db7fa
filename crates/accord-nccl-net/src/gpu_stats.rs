//! Process-wide counters of the GPU-buffers data path, so a device run can tell where the time
//! of a receive into GPU memory goes (issue 21: GPU buffers won nccl-tests' all_reduce 3.48x
//! but lost a DDP loop 0.73x, and the code alone cannot say which step stretched).
//!
//! A receive into GPU memory goes: `irecv` leases a bounce range (or waits: `bounce_waits`),
//! the sender's GPU copies the bytes into it and the counters say they landed (`land_ns`, from
//! `irecv` to the first `test` that sees them), then the receiver copies the range into the
//! GPU buffer (`copy_ns`, from issuing that copy to the first `test` that sees it done). A send
//! from GPU memory is timed from `isend` to the first `test` that sees every write done
//! (`send_ns`). Times are as NCCL's proxy thread observes them, so they include its polling.
//!
//! Relaxed atomics: a handful of additions per request, read once at the end. The plugin logs
//! them at `finalize` (NCCL_DEBUG=INFO, NET) and exports them to the program
//! (`accord_net_gpu_stats`, read with ctypes from the library NCCL loaded).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// The counters, in the order [`snapshot`] returns them.
pub const NAMES: [&str; 12] = [
    "bounce_waits",
    "gpu_recvs",
    "gpu_recv_bytes",
    "land_ns_total",
    "copy_ns_total",
    "copy_ns_max",
    "gpu_sends",
    "gpu_send_bytes",
    "send_ns_total",
    "send_ns_max",
    "regmr_gpu",
    "regmr_refused",
];

/// Index of each counter in [`NAMES`].
#[derive(Copy, Clone)]
pub enum Counter {
    /// `irecv` calls that found the bounce pool too full and returned no request.
    BounceWaits = 0,
    /// Receives into GPU memory completed.
    GpuRecvs,
    /// Their bytes.
    GpuRecvBytes,
    /// Sum over them of `irecv` to landed, in nanoseconds.
    LandNsTotal,
    /// Sum of bounce-to-GPU copy times.
    CopyNsTotal,
    /// Longest bounce-to-GPU copy.
    CopyNsMax,
    /// Sends from GPU memory completed.
    GpuSends,
    /// Their bytes.
    GpuSendBytes,
    /// Sum of their `isend` to done times.
    SendNsTotal,
    /// Longest of them.
    SendNsMax,
    /// GPU memory registrations accepted.
    RegMrGpu,
    /// GPU memory registrations refused (memory a CUDA context owns).
    RegMrRefused,
}

/// The counters, on cache lines of their own: every proxy thread of the process adds to them, and
/// a neighbouring static must not share their line (as the engine's recorder guards its switches).
#[repr(align(128))]
struct Counters([AtomicU64; NAMES.len()]);

static COUNTERS: Counters = Counters([const { AtomicU64::new(0) }; NAMES.len()]);

/// Adds `n` to `counter`.
pub fn add(counter: Counter, n: u64) {
    COUNTERS.0[counter as usize].fetch_add(n, Relaxed);
}

/// Raises `counter` to `n` if below.
pub fn max(counter: Counter, n: u64) {
    COUNTERS.0[counter as usize].fetch_max(n, Relaxed);
}

/// Nanoseconds since `since`, saturated.
pub fn ns_since(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Every counter now, in [`NAMES`] order.
pub fn snapshot() -> [u64; NAMES.len()] {
    std::array::from_fn(|i| COUNTERS.0[i].load(Relaxed))
}

/// One line for the log: each counter and the mean times per request.
pub fn summary() -> String {
    let s = snapshot();
    let mean_us = |total: u64, n: u64| if n == 0 { 0.0 } else { total as f64 / n as f64 / 1e3 };
    let recvs = s[Counter::GpuRecvs as usize];
    let sends = s[Counter::GpuSends as usize];
    let fields: Vec<String> = NAMES.iter().zip(s).map(|(n, v)| format!("{n} {v}")).collect();
    format!(
        "GPU buffers: {}; mean land {:.1} us, copy {:.1} us per receive, send {:.1} us per send",
        fields.join(", "),
        mean_us(s[Counter::LandNsTotal as usize], recvs),
        mean_us(s[Counter::CopyNsTotal as usize], recvs),
        mean_us(s[Counter::SendNsTotal as usize], sends)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_add_and_keep_maxima_and_the_summary_names_them_all() {
        let before = snapshot();
        add(Counter::GpuRecvs, 2);
        add(Counter::CopyNsTotal, 4000);
        max(Counter::CopyNsMax, 7);
        max(Counter::CopyNsMax, 3);
        let after = snapshot();
        assert_eq!(after[Counter::GpuRecvs as usize] - before[Counter::GpuRecvs as usize], 2);
        assert!(after[Counter::CopyNsMax as usize] >= 7);
        let line = summary();
        assert!(NAMES.iter().all(|n| line.contains(n)), "{line}");
    }
}
