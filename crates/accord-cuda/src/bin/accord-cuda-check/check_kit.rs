//! What every check of the table is made of: a row, a check body's result, and the small
//! helpers the bodies share. The table (`checks`) and the kernel checks (`checks_gpu_work`) both
//! build on this file, so neither imports the other for them.

use std::time::Instant;

use serde::Serialize;

/// Outcome of one check.
#[derive(Serialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    Skip,
}

/// One row of the table.
#[derive(Serialize)]
pub struct Row {
    pub name: &'static str,
    pub status: Status,
    pub elapsed_ms: f64,
    pub detail: String,
}

/// Result of one check body: detail on success, the failed step on failure.
pub type CheckResult = Result<String, String>;

/// Annotates a CUDA result with the step that produced it.
pub fn step<T>(what: &str, result: accord_cuda::Result<T>) -> Result<T, String> {
    result.map_err(|e| format!("{what}: {e}"))
}

/// Fails with `message` unless `ok`.
pub fn ensure(ok: bool, message: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(message())
    }
}

/// Deterministic bytes.
pub fn pattern(len_bytes: usize, seed: u8) -> Vec<u8> {
    (0..len_bytes).map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(seed as u32 % 31) as u8 ^ seed).collect()
}

/// Index of the first differing byte.
pub fn first_mismatch(got: &[u8], want: &[u8]) -> Option<usize> {
    if got.len() != want.len() {
        return Some(got.len().min(want.len()));
    }
    got.iter().zip(want).position(|(g, w)| g != w)
}

pub fn timed(name: &'static str, body: impl FnOnce() -> CheckResult) -> Row {
    let start = Instant::now();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body))
        .unwrap_or_else(|_| Err("panicked (see stderr)".to_string()));
    let elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
    let (status, detail) = match outcome {
        Ok(detail) if detail.starts_with("skip:") => (Status::Skip, detail),
        Ok(detail) => (Status::Pass, detail),
        Err(detail) => (Status::Fail, detail),
    };
    Row { name, status, elapsed_ms, detail }
}
