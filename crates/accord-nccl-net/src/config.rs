//! The plugin's typed configuration, its documented defaults, and every `ACCORD_NET_*`
//! environment variable in one place ([`NET_ENV_OVERRIDES`]). The engine's own `ACCORD_*`
//! variables ([`accord_engine::ENGINE_ENV_OVERRIDES`]) apply too, after these.

use crate::error::PluginError;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// Environment variables of the plugin and what each sets.
pub const NET_ENV_OVERRIDES: &[(&str, &str)] = &[
    (
        "ACCORD_NET_IFS",
        "devices: comma-separated local IPs or interface names, one NCCL device (engine NIC) each; default 127.0.0.1",
    ),
    (
        "ACCORD_NET_SPEED_MBPS",
        "speed each device reports to NCCL, in Mbps; default the interface's /sys speed, else 400000 on a \
         loopback address (same-host peers, shared memory), else 100000",
    ),
    ("ACCORD_NET_SETUP_TIMEOUT_MS", "connect/accept give up after this long without progress; default 300000"),
    (
        "ACCORD_NET_PIECES",
        "most pieces a receive's bytes are written in, each on the next engine lane with its own immediate \
         (default: the engine's lane count, at most 16); 0 or 1: one write per receive, which the engine shards itself (its immediate sent after every shard)",
    ),
    (
        "ACCORD_NET_GPU_BUFFERS",
        "auto, 1 or 0: whether devices report NCCL_PTR_CUDA, so NCCL may keep its buffers in GPU memory (GPUDirect) \
         and the GPUs' copy engines move the bytes, in CUDA contexts of the plugin's own; NCCL uses it where its \
         GPUDirect level allows (NCCL_NET_GDR_LEVEL=SYS, NCCL_NET_GDR_READ=1 on a flat PCI topology) and its buffers \
         come from cuMemCreate (NCCL_CUMEM_ENABLE=1, its default) (default 0; auto: on when a GPU is visible)",
    ),
    (
        "ACCORD_NET_BOUNCE_BYTES",
        "bytes of each receive comm's shared host bounce pool, through which receives into GPU memory land \
         (default 16777216); a receive larger than the pool fails",
    ),
    (
        "ACCORD_NET_TRACE",
        "log the first N data-path events (irecv/isend posted, receives copied, requests done) as INFO lines \
         (NCCL_DEBUG=INFO, subsystem NET), to see where a stalled job stops; default 0",
    ),
];

/// Whether devices accept GPU memory (`ACCORD_NET_GPU_BUFFERS`).
///
/// Off by default: it costs every receive comm a bounce pool (`ACCORD_NET_BOUNCE_BYTES`) and
/// every rank a private CUDA context, and NCCL only hands GPU memory to a device its GPUDirect
/// level allows (`NCCL_NET_GDR_LEVEL`), which on the 2xH200 host needs the user's say anyway.
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
    /// Bytes of each receive comm's bounce pool. Default [`BOUNCE_BYTES_DEFAULT`].
    pub bounce_bytes: usize,
    /// Data-path events to log (`ACCORD_NET_TRACE`). Default 0.
    pub trace_events: u64,
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
            bounce_bytes: BOUNCE_BYTES_DEFAULT,
            trace_events: 0,
        }
    }
}

impl NetConfig {
    /// The defaults with [`NET_ENV_OVERRIDES`] applied, read through `lookup`; interface names
    /// are turned into addresses by `resolve`.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
        resolve: impl Fn(&str) -> Option<IpAddr>,
    ) -> Result<Self, PluginError> {
        let mut config = NetConfig::default();
        if let Some(ifs) = lookup("ACCORD_NET_IFS").filter(|v| !v.trim().is_empty()) {
            config.devices = parse_ifs(&ifs, resolve)?;
            config.default_devices = false;
        }
        if let Some(v) = lookup("ACCORD_NET_SPEED_MBPS") {
            let speed: i32 = v.trim().parse().map_err(|_| bad("ACCORD_NET_SPEED_MBPS", &v))?;
            if speed <= 0 {
                return Err(bad("ACCORD_NET_SPEED_MBPS", &v));
            }
            config.speed_mbps = Some(speed);
        }
        if let Some(v) = lookup("ACCORD_NET_SETUP_TIMEOUT_MS") {
            let ms: u64 = v.trim().parse().map_err(|_| bad("ACCORD_NET_SETUP_TIMEOUT_MS", &v))?;
            config.setup_timeout = Duration::from_millis(ms.max(1));
        }
        if let Some(v) = lookup("ACCORD_NET_PIECES") {
            let pieces: u32 = v.trim().parse().map_err(|_| bad("ACCORD_NET_PIECES", &v))?;
            if pieces > crate::cts::PIECES_MAX {
                return Err(bad("ACCORD_NET_PIECES", &v));
            }
            config.pieces_max = Some(pieces);
        }
        if let Some(v) = lookup("ACCORD_NET_GPU_BUFFERS") {
            config.gpu_buffers = match v.trim() {
                "auto" => GpuBuffers::Auto,
                "1" => GpuBuffers::On,
                "0" | "" => GpuBuffers::Off,
                _ => return Err(bad("ACCORD_NET_GPU_BUFFERS", &v)),
            };
        }
        if let Some(v) = lookup("ACCORD_NET_BOUNCE_BYTES") {
            let bytes: usize = v.trim().parse().map_err(|_| bad("ACCORD_NET_BOUNCE_BYTES", &v))?;
            if bytes < BOUNCE_BYTES_MIN || bytes as u64 > accord_engine::REGION_BYTES_MAX {
                return Err(bad("ACCORD_NET_BOUNCE_BYTES", &v));
            }
            config.bounce_bytes = bytes;
        }
        if let Some(v) = lookup("ACCORD_NET_TRACE") {
            config.trace_events = v.trim().parse().map_err(|_| bad("ACCORD_NET_TRACE", &v))?;
        }
        Ok(config)
    }

    /// From the process environment, resolving names with the host's interface list.
    pub fn from_env() -> Result<Self, PluginError> {
        Self::from_lookup(|n| std::env::var(n).ok(), crate::ifaddrs::interface_address)
    }
}

fn bad(name: &str, value: &str) -> PluginError {
    PluginError::Config(format!("{name}={value:?} is not valid: see the plugin's NET_ENV_OVERRIDES for the format"))
}

/// Parses `ACCORD_NET_IFS`: IPs or interface names, comma-separated, no duplicates.
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
