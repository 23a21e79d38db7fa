//! What this host offers: driver, NVRTC, GPUs. Never panics, never fails.

use serde::Serialize;

use crate::error::{CudaError, Result};
use crate::ffi::{driver, nvrtc};

/// One GPU as the driver reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceInfo {
    /// Ordinal under `CUDA_VISIBLE_DEVICES`.
    pub ordinal: usize,
    /// Marketing name.
    pub name: String,
    /// Total device memory.
    pub memory_bytes: u64,
    /// `(major, minor)`.
    pub compute_capability: (i32, i32),
    /// PCI bus id, for example `0000:19:00.0`.
    pub pci_bus_id: String,
}

/// Result of [`probe`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Availability {
    /// libcuda loaded and `cuInit` succeeded.
    pub driver: bool,
    /// libnvrtc loaded.
    pub nvrtc: bool,
    /// Visible GPUs (0 without a driver).
    pub device_count: usize,
    /// One entry per visible GPU.
    pub devices: Vec<DeviceInfo>,
    /// Driver version as `1000 * major + 10 * minor`, 0 when unknown.
    pub driver_version: i32,
    /// NVRTC `(major, minor)`, `(0, 0)` when unknown.
    pub nvrtc_version: (i32, i32),
    /// Why the driver is unusable, when it is.
    pub driver_problem: Option<String>,
    /// Why NVRTC is unusable, when it is.
    pub nvrtc_problem: Option<String>,
}

impl Availability {
    /// Why `count` GPUs (and NVRTC, when `need_nvrtc`) cannot be used here, or
    /// `None` when they can. The text starts with `no CUDA driver` when the
    /// driver is missing.
    pub fn skip_reason(&self, count: usize, need_nvrtc: bool) -> Option<String> {
        if !self.driver {
            let why = self.driver_problem.clone().unwrap_or_default();
            return Some(format!("no CUDA driver ({why})"));
        }
        if self.device_count < count {
            return Some(format!("needs {count} GPU(s), found {}", self.device_count));
        }
        if need_nvrtc && !self.nvrtc {
            let why = self.nvrtc_problem.clone().unwrap_or_default();
            return Some(format!("no NVRTC ({why})"));
        }
        None
    }

    /// `Ok` when `count` GPUs are usable, else [`CudaError::NotAvailable`].
    pub fn require_gpus(&self, count: usize) -> Result<()> {
        match self.skip_reason(count, false) {
            None => Ok(()),
            Some(reason) => Err(CudaError::NotAvailable { reason }),
        }
    }
}

/// Looks at the host: loads the driver and NVRTC if present (never panics).
pub fn probe() -> Availability {
    let mut availability = Availability {
        driver: false,
        nvrtc: false,
        device_count: 0,
        devices: Vec::new(),
        driver_version: 0,
        nvrtc_version: (0, 0),
        driver_problem: None,
        nvrtc_problem: None,
    };
    match nvrtc::ensure_nvrtc() {
        Ok(()) => {
            availability.nvrtc = true;
            availability.nvrtc_version = nvrtc::version().unwrap_or((0, 0));
        }
        Err(e) => availability.nvrtc_problem = Some(problem_text(e)),
    }
    if let Err(e) = driver::ensure_driver() {
        availability.driver_problem = Some(problem_text(e));
        return availability;
    }
    availability.driver = true;
    availability.driver_version = driver::driver_version().unwrap_or(0);
    match list_devices() {
        Ok(devices) => {
            availability.device_count = devices.len();
            availability.devices = devices;
        }
        Err(e) => availability.driver_problem = Some(problem_text(e)),
    }
    availability
}

fn problem_text(error: CudaError) -> String {
    match error {
        CudaError::NotAvailable { reason } => reason,
        other => other.to_string(),
    }
}

fn list_devices() -> Result<Vec<DeviceInfo>> {
    let count = driver::device_count()?.max(0) as usize;
    let mut devices = Vec::with_capacity(count);
    for ordinal in 0..count {
        let device = driver::device_get(ordinal as i32)?;
        devices.push(DeviceInfo {
            ordinal,
            name: driver::device_name(device)?,
            memory_bytes: driver::device_total_mem(device)? as u64,
            compute_capability: driver::compute_capability(device)?,
            pci_bus_id: driver::device_pci_bus_id(device)?,
        });
    }
    Ok(devices)
}

/// Returns early from the enclosing test (or any `()` function) after
/// printing `skipped: <reason>` when the GPUs it needs are not here.
///
/// `require_gpu!()` needs one GPU, `require_gpu!(2)` two, and
/// `require_gpu!(1, nvrtc)` one GPU and NVRTC.
#[macro_export]
macro_rules! require_gpu {
    () => {
        $crate::require_gpu!(1)
    };
    ($count:expr) => {
        if let Some(reason) = $crate::probe().skip_reason($count, false) {
            println!("skipped: {reason}");
            return;
        }
    };
    ($count:expr, nvrtc) => {
        if let Some(reason) = $crate::probe().skip_reason($count, true) {
            println!("skipped: {reason}");
            return;
        }
    };
}
