//! Where the plugin's devices sit in NCCL's topology, and whether NCCL will hand them GPU memory.
//!
//! Why: NCCL gives a net device GPU memory (GPUDirect, `NET/Accord/0/GDRDMA` in its log) only when
//! the device reports `NCCL_PTR_CUDA` *and* the GPU-to-device path in NCCL's topology is no
//! longer than `NCCL_NET_GDR_LEVEL` (default PXB: a PCI switch shared below the CPU). A device
//! with no `pciPath` is attached to the first CPU, which is PHB or farther from every GPU, so
//! GPU buffers stayed off unless the user set `NCCL_NET_GDR_LEVEL` (issue 21).
//!
//! Two ways are offered, each behind a knob, so one device run compares them:
//! - [`PciPlacement`] (`ACCORD_NET_PCI_PATH`): one device per GPU of this host, reported at that
//!   GPU's sysfs path (`gpu`) or at the bridge above it (`bridge`); `none` is the one host device.
//!   NCCL 2.28's `ncclTopoFillNet` takes the device's bus id from the path's last component and
//!   attaches its NIC to the XML PCI node of that bus id, and `ncclTopoAddPci` connects a PCI
//!   node that has a NIC as that NIC alone (its GPU or sub-tree is then left without a PCI link).
//!   So both placements are expected to cost the GPU its place in NCCL's tree; they stay opt-in
//!   until a device run shows otherwise (`scripts/device/issue21.sh` step a).
//! - [`GdrLevel`] (`ACCORD_NET_GDR_LEVEL`, default `SYS`): when GPU buffers are on and the user
//!   left `NCCL_NET_GDR_LEVEL` unset, the plugin's `init` sets it for NCCL. NCCL reads it for
//!   the first time when it computes its topology paths, after its net plugin's `init`. For this
//!   plugin's devices the level is not a NIC's PCIe distance: every byte into or out of GPU
//!   memory moves through that GPU's own copy engines, wherever the "device" is placed.
//!
//! GPU discovery reads `/proc/driver/nvidia/gpus` (one directory per GPU, named by its bus id)
//! and sysfs under a root path, so both are testable on a GPU-less host with a fake tree.

use std::path::{Path, PathBuf};

/// Where NVIDIA's driver lists this host's GPUs, one directory per PCI bus id.
pub const NVIDIA_GPUS_DIR: &str = "/proc/driver/nvidia/gpus";
/// The sysfs root the PCI paths are read under.
pub const SYSFS_ROOT: &str = "/sys";
/// The NCCL variable [`GdrLevel`] may set.
pub const NCCL_GDR_LEVEL_VAR: &str = "NCCL_NET_GDR_LEVEL";

/// Where devices report their PCI path (`ACCORD_NET_PCI_PATH`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PciPlacement {
    /// One device per GPU at the GPU's own sysfs path.
    Gpu,
    /// One device per GPU at the PCI bridge above it (none on a GPU of the root bus: null path).
    Bridge,
    /// The configured devices, with no PCI path (attached to the first CPU by NCCL).
    None,
}

impl std::str::FromStr for PciPlacement {
    type Err = String;
    fn from_str(value: &str) -> Result<Self, String> {
        match value.trim() {
            "gpu" => Ok(PciPlacement::Gpu),
            "bridge" => Ok(PciPlacement::Bridge),
            "none" | "" => Ok(PciPlacement::None),
            other => Err(format!("unknown PCI placement {other:?}: use gpu, bridge or none")),
        }
    }
}

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

/// Whether `name` is a PCI address `DDDD:BB:DD.F` (hex digits), as sysfs and NVIDIA's driver
/// name devices.
pub fn is_bus_id(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter().enumerate().all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// The bus ids of this host's NVIDIA GPUs, sorted (lower case), from the driver's directory
/// `gpus_dir`; empty when it is absent (no driver, no GPU).
pub fn gpu_bus_ids(gpus_dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(gpus_dir) else { return vec![] };
    let mut ids: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .map(|n| n.to_ascii_lowercase())
        .filter(|n| is_bus_id(n))
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// The sysfs path to report for the GPU at `bus_id` under `placement`: the real path of
/// `<sys_root>/bus/pci/devices/<bus_id>` (`gpu`), or its parent when that parent is itself a
/// PCI device (`bridge`; a GPU on the root bus has none). None when sysfs does not know the GPU.
pub fn pci_path(sys_root: &Path, bus_id: &str, placement: PciPlacement) -> Option<PathBuf> {
    if placement == PciPlacement::None || !is_bus_id(bus_id) {
        return None;
    }
    let device = std::fs::canonicalize(sys_root.join("bus/pci/devices").join(bus_id)).ok()?;
    match placement {
        PciPlacement::Gpu => Some(device),
        PciPlacement::Bridge => {
            let parent = device.parent()?;
            let name = parent.file_name()?.to_str()?;
            is_bus_id(name).then(|| parent.to_path_buf())
        }
        PciPlacement::None => None,
    }
}

/// One device the plugin reports for a GPU: the GPU's bus id and the path NCCL is given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuDevice {
    /// The GPU's bus id (for the device's name).
    pub bus_id: String,
    /// The path reported as `pciPath` (None: the GPU has no such path, NCCL attaches the
    /// device to the first CPU).
    pub pci_path: Option<PathBuf>,
}

/// The per-GPU devices to report: one per GPU listed in `gpus_dir`, in bus-id order, when
/// GPU buffers are on and `placement` is not `none`; empty otherwise (the configured devices
/// are reported as before). Device `i` is the `i`-th GPU by bus id, whatever
/// `CUDA_VISIBLE_DEVICES` says: NCCL pairs GPUs and devices by their paths, not their indices.
pub fn gpu_devices(placement: PciPlacement, gpu_buffers: bool, gpus_dir: &Path, sys_root: &Path) -> Vec<GpuDevice> {
    if placement == PciPlacement::None || !gpu_buffers {
        return vec![];
    }
    gpu_bus_ids(gpus_dir)
        .into_iter()
        .map(|bus_id| GpuDevice { pci_path: pci_path(sys_root, &bus_id, placement), bus_id })
        .collect()
}

#[cfg(test)]
mod tests;
