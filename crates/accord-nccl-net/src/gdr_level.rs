//! Whether NCCL hands the plugin's devices GPU memory: the plugin may set `NCCL_NET_GDR_LEVEL`.
//!
//! Why: NCCL gives a net device GPU memory (GPUDirect, `NET/Accord/0/GDRDMA` in its log) only when
//! the device reports `NCCL_PTR_CUDA` *and* the GPU-to-device path in NCCL's topology is no
//! longer than `NCCL_NET_GDR_LEVEL` (default PXB: a PCI switch shared below the CPU). The
//! plugin's devices report no `pciPath`, so NCCL attaches them to the first CPU, PHB or farther
//! from every GPU, and GPU buffers stayed off unless the user set the variable (issue 21).
//!
//! [`GdrLevel`] (`ACCORD_NET_GDR_LEVEL`, default `SYS`): when GPU buffers are on and the user left
//! `NCCL_NET_GDR_LEVEL` unset, the plugin's `init` sets it for NCCL, which first reads it when it
//! computes its topology paths, after its net plugin's `init`. Measured on the 2xH200 host with
//! NCCL 2.28.9 (`bash .carry/h21g/issue21.sh $OUT`, docs/results/2026-11-26-nccl-plugin-shapes.md):
//! with only `ACCORD_NET_GPU_BUFFERS=auto`, 16 of 16 NET channels said `/GDRDMA` in both launch
//! shapes. For this plugin's devices the level is not a NIC's PCIe distance: every byte into or
//! out of GPU memory moves through that GPU's own copy engines, wherever the "device" sits.
//!
//! Reporting a PCI path instead was tried and dropped: devices at each GPU's own sysfs path made
//! NCCL 2.28.9 crash at init (SIGSEGV, both launch shapes), and at the bridge above each GPU
//! (none on that host: the GPUs sit on the root bus) NCCL still refused GPUDirect (0 of 16
//! channels) with no gain over no path.

/// The NCCL variable [`GdrLevel`] may set.
pub const NCCL_GDR_LEVEL_VAR: &str = "NCCL_NET_GDR_LEVEL";

/// What the plugin sets `NCCL_NET_GDR_LEVEL` to when GPU buffers are on and it is unset
/// (`ACCORD_NET_GDR_LEVEL`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum GdrLevel {
    /// Leave NCCL's default (PXB) alone.
    Off,
    /// `PHB`: GPUs and the device under the same CPU.
    Phb,
    /// `SYS`: any GPU of this host.
    Sys,
}

impl std::str::FromStr for GdrLevel {
    type Err = String;
    fn from_str(value: &str) -> Result<Self, String> {
        match value.trim() {
            "off" | "" => Ok(GdrLevel::Off),
            "PHB" => Ok(GdrLevel::Phb),
            "SYS" => Ok(GdrLevel::Sys),
            other => Err(format!("unknown GPUDirect level {other:?}: use SYS, PHB or off")),
        }
    }
}

impl GdrLevel {
    /// The value NCCL reads, or None for [`GdrLevel::Off`].
    pub fn nccl_value(self) -> Option<&'static str> {
        match self {
            GdrLevel::Off => None,
            GdrLevel::Phb => Some("PHB"),
            GdrLevel::Sys => Some("SYS"),
        }
    }
}

/// The `NCCL_NET_GDR_LEVEL` value to set, if any: only when GPU buffers are on, the knob asks
/// for a level, and the user set none (an explicit user value, even empty, always wins).
pub fn gdr_level_to_set(level: GdrLevel, gpu_buffers: bool, user_value: Option<&str>) -> Option<&'static str> {
    if !gpu_buffers || user_value.is_some() {
        return None;
    }
    level.nccl_value()
}

#[cfg(test)]
mod tests;
