//! The plugin's typed configuration, its documented defaults, and every `ACCORD_NET_*`
//! environment variable in one place ([`NetConfig::from_lookup`]; the knobs' docs are rows of
//! `accord-knobs`' table, `Component::Plugin`). The engine's own `ACCORD_*` variables apply
//! too, after these.

use crate::error::PluginError;
use crate::gdr_level::GdrLevel;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// Whether devices accept GPU memory (`ACCORD_NET_GPU_BUFFERS`).
///
/// Off by default. On (`1`, or `auto` where the process sees a GPU), the GPUs' copy engines move
/// the bytes instead of two CPU copies through host memory: 3.48x tuned Socket against 1.50x in
/// the one-process-per-GPU nccl-tests shape (docs/results/2026-11-26-nccl-plugin-shapes.md), and
/// the plugin now sets `NCCL_NET_GDR_LEVEL` itself so NCCL takes them ([`crate::gdr_level`]). But
/// a DDP loop lost with them in two device calls (0.73x and 0.91x Socket, against the host
/// path's 1.23x and 2.21x in the same calls), and in the second the one-process-per-GPU shape
/// gained little (1.03x Socket against the host path's 0.93x): its sends from GPU memory took
/// 6.5x longer than with one process for both GPUs, for a reason not yet known (see
/// `docs/results/2026-11-26-nccl-plugin-shapes.md`, issue 21 second round). Each
/// receive comm also costs a bounce pool (`ACCORD_NET_BOUNCE_BYTES`) and each rank a context.
///
/// With GPU buffers on, the plugin issues CUDA copies from NCCL's proxy thread. In the primary
/// context those block while any application thread sits in a synchronous pageable
/// `cudaMemcpy` behind a kernel that waits for the very bytes (a deadlock at the first
/// collective followed by `.item()`, measured on H200 with the CUDA 13 driver), so the engine
/// copies in private contexts ([`accord_engine::DeviceContext::Private`]) and `regMr` refuses
/// GPU memory a context owns, whose copies would still wait. See
/// `docs/design/same-host-copy-engine-route.md`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum GpuBuffers {
    /// On when the CUDA driver sees a GPU.
    Auto,
    /// Always (registration of GPU memory fails without a driver).
    On,
    /// Never: host memory only, NCCL stages through pinned host buffers.
    Off,
}

impl std::str::FromStr for GpuBuffers {
    type Err = String;
    /// `auto`, `1` or `0` (empty: `0`), as `ACCORD_NET_GPU_BUFFERS` takes them.
    fn from_str(value: &str) -> Result<Self, String> {
        match value.trim() {
            "auto" => Ok(GpuBuffers::Auto),
            "1" => Ok(GpuBuffers::On),
            "0" | "" => Ok(GpuBuffers::Off),
            other => Err(format!("unknown GPU buffer mode {other:?}: use auto, 1 or 0")),
        }
    }
}

/// Default bytes of a receive comm's bounce pool: NCCL's receives into GPU memory are its
/// protocol steps (512 KiB with the default 4 MiB buffers, 8 in flight per connection), so
/// 16 MiB holds every step of a connection with room for larger point-to-point chunks.
pub const BOUNCE_BYTES_DEFAULT: usize = 16 << 20;
/// Smallest bounce pool accepted.
pub const BOUNCE_BYTES_MIN: usize = 1 << 20;

/// Most devices (engine NICs) the plugin exposes; the engine's NIC bound.
pub const DEVICES_MAX: usize = accord_engine::config::NICS_MAX;
/// Speed reported when neither the environment nor /sys says otherwise (100 Gb/s).
pub const SPEED_MBPS_DEFAULT: i32 = 100_000;
/// Speed reported for a loopback device (no /sys speed): its peers are on this host and the
/// bytes move through the engine's shared-memory rings, not a NIC. NCCL sizes its channel
/// count from this speed: at 100 Gb/s it ran a 2-rank ring over 2 channels and all_reduce
/// plateaued near 9.5 GB/s busbw on the 2xH200 host; at 400 Gb/s it opened more channels and
/// reached 16.6 GB/s (docs/results/2026-11-22-nccl-plugin.md, run 4).
pub const LOOPBACK_SPEED_MBPS: i32 = 400_000;
/// Default connection-setup timeout.
pub const SETUP_TIMEOUT_DEFAULT: Duration = Duration::from_secs(300);

/// One device as configured: its address and, when named so, its interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Local address the engine's NIC and the setup listener bind.
    pub ip: IpAddr,
    /// Interface name when given by name (for /sys speed lookup and logs).
    pub interface: Option<String>,
}

/// The plugin's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetConfig {
    /// Devices, in NCCL device order. Default one device on 127.0.0.1.
    pub devices: Vec<DeviceConfig>,
    /// Whether `devices` is the one-host default (`ACCORD_NET_IFS` unset or empty).
    pub default_devices: bool,
    /// Speed override in Mbps (None: per device, from /sys or [`SPEED_MBPS_DEFAULT`]).
    pub speed_mbps: Option<i32>,
    /// Connection-setup timeout. Default [`SETUP_TIMEOUT_DEFAULT`].
    pub setup_timeout: Duration,
    /// Most pieces per receive (None: the engine's lane count; 0: one engine-sharded write).
    pub pieces_max: Option<u32>,
    /// Whether devices accept GPU memory. Default [`GpuBuffers::Off`].
    pub gpu_buffers: GpuBuffers,
    /// The `NCCL_NET_GDR_LEVEL` the plugin sets when GPU buffers are on and it is unset.
    /// Default [`GdrLevel::Sys`].
    pub gdr_level: GdrLevel,
    /// Bytes of each receive comm's bounce pool. Default [`BOUNCE_BYTES_DEFAULT`].
    pub bounce_bytes: usize,
    /// Data-path events to log (`ACCORD_NET_TRACE`). Default 0.
    pub trace_events: u64,
    /// Whether NCCL's host buffers are registered as memory a device reads next, so peers'
    /// bytes land in them with streaming stores (`accord_engine::MemoryKind::HostForDevice`;
    /// `ACCORD_NET_STREAMING_STORES`). Default on: NCCL's kernels, not the CPU, read them.
    pub streaming_stores: bool,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            devices: vec![DeviceConfig { ip: IpAddr::V4(Ipv4Addr::LOCALHOST), interface: None }],
            default_devices: true,
            speed_mbps: None,
            setup_timeout: SETUP_TIMEOUT_DEFAULT,
            pieces_max: None,
            gpu_buffers: GpuBuffers::Off,
            gdr_level: GdrLevel::Sys,
            bounce_bytes: BOUNCE_BYTES_DEFAULT,
            trace_events: 0,
            streaming_stores: true,
        }
    }
}

impl NetConfig {
    /// The defaults with the plugin's knobs applied, read through `lookup`; interface names
    /// are turned into addresses by `resolve`.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
        resolve: impl Fn(&str) -> Option<IpAddr>,
    ) -> Result<Self, PluginError> {
        use accord_knobs::{choice, get};
        let env: &dyn Fn(&str) -> Option<String> = &lookup;
        let mut config = NetConfig::default();
        if let Some(ifs) = get::<String>(env, "ACCORD_NET_IFS")?.filter(|v| !v.trim().is_empty()) {
            config.devices = parse_ifs(&ifs, resolve)?;
            config.default_devices = false;
        }
        if let Some(speed) = get::<i32>(env, "ACCORD_NET_SPEED_MBPS")? {
            if speed <= 0 {
                return Err(PluginError::Config(format!("ACCORD_NET_SPEED_MBPS={speed}: expected a positive speed")));
            }
            config.speed_mbps = Some(speed);
        }
        if let Some(timeout) = get::<Duration>(env, "ACCORD_NET_SETUP_TIMEOUT_MS")? {
            config.setup_timeout = timeout.max(Duration::from_millis(1));
        }
        if let Some(pieces) = get::<u32>(env, "ACCORD_NET_PIECES")? {
            if pieces > crate::cts::PIECES_MAX {
                let max = crate::cts::PIECES_MAX;
                return Err(PluginError::Config(format!("ACCORD_NET_PIECES={pieces}: expected 0..={max}")));
            }
            config.pieces_max = Some(pieces);
        }
        if let Some(mode) = choice(env, "ACCORD_NET_GPU_BUFFERS")? {
            config.gpu_buffers = mode;
        }
        if let Some(level) = choice(env, "ACCORD_NET_GDR_LEVEL")? {
            config.gdr_level = level;
        }
        if let Some(bytes) = get::<usize>(env, "ACCORD_NET_BOUNCE_BYTES")? {
            let max = accord_engine::REGION_BYTES_MAX;
            if bytes < BOUNCE_BYTES_MIN || bytes as u64 > max {
                return Err(PluginError::Config(format!(
                    "ACCORD_NET_BOUNCE_BYTES={bytes}: expected {BOUNCE_BYTES_MIN}..={max} bytes"
                )));
            }
            config.bounce_bytes = bytes;
        }
        if let Some(events) = get(env, "ACCORD_NET_TRACE")? {
            config.trace_events = events;
        }
        if let Some(on) = get::<bool>(env, "ACCORD_NET_STREAMING_STORES")? {
            config.streaming_stores = on;
        }
        Ok(config)
    }

    /// From the process environment, resolving names with the host's interface list.
    pub fn from_env() -> Result<Self, PluginError> {
        Self::from_lookup(|n| std::env::var(n).ok(), crate::ifaddrs::interface_address)
    }
}

impl From<accord_knobs::KnobError> for PluginError {
    fn from(e: accord_knobs::KnobError) -> Self {
        PluginError::Config(e.to_string())
    }
}

fn parse_ifs(value: &str, resolve: impl Fn(&str) -> Option<IpAddr>) -> Result<Vec<DeviceConfig>, PluginError> {
    let mut devices: Vec<DeviceConfig> = vec![];
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let device = match item.parse::<IpAddr>() {
            Ok(ip) => DeviceConfig { ip, interface: None },
            Err(_) => {
                let ip = resolve(item).ok_or_else(|| {
                    PluginError::Config(format!(
                        "ACCORD_NET_IFS names {item:?}, which is neither an IP address nor an interface with an address: \
                         list addresses or interfaces of this host (ip addr)"
                    ))
                })?;
                DeviceConfig { ip, interface: Some(item.to_string()) }
            }
        };
        if devices.iter().any(|d| d.ip == device.ip) {
            return Err(PluginError::Config(format!(
                "ACCORD_NET_IFS lists {} twice: list each device once",
                device.ip
            )));
        }
        devices.push(device);
    }
    if devices.is_empty() || devices.len() > DEVICES_MAX {
        return Err(PluginError::Config(format!(
            "ACCORD_NET_IFS={value:?} gives {} devices: give 1..={DEVICES_MAX}",
            devices.len()
        )));
    }
    Ok(devices)
}

/// The speed of interface `name` from /sys in Mbps, when the kernel knows it.
pub fn sysfs_speed_mbps(name: &str) -> Option<i32> {
    let text = std::fs::read_to_string(format!("/sys/class/net/{name}/speed")).ok()?;
    text.trim().parse::<i32>().ok().filter(|s| *s > 0)
}

/// The speed a device reports without `ACCORD_NET_SPEED_MBPS`: what /sys says of its interface
/// (`sysfs` looks it up), else [`LOOPBACK_SPEED_MBPS`] on a loopback address, else
/// [`SPEED_MBPS_DEFAULT`].
pub fn default_speed_mbps(ip: IpAddr, interface: Option<&str>, sysfs: impl Fn(&str) -> Option<i32>) -> i32 {
    match interface.and_then(sysfs) {
        Some(speed) => speed,
        None if ip.is_loopback() => LOOPBACK_SPEED_MBPS,
        None => SPEED_MBPS_DEFAULT,
    }
}

#[cfg(test)]
mod tests;
