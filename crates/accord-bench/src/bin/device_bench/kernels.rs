//! The device API's harness kernels (`crates/accord-device/kernels/*.cu`), compiled with NVRTC
//! into one module, and one typed launch per kernel. The header and the kernels are built into
//! this binary and written to a scratch folder for NVRTC's include path, so a carried binary
//! needs no source tree.

use std::path::PathBuf;
use std::sync::Arc;

use accord_cuda::kernels::{Kernel, Module};
use accord_cuda::{launch_u64_args, DevicePtr, Gpu, LaunchConfig, Stream};

const HEADER: &str = include_str!("../../../../accord-device/include/accord/device.cuh");
const COMMON: &str = include_str!("../../../../accord-device/kernels/common.cuh");
const SOURCES: [(&str, &str); 6] = [
    ("pingpong.cu", include_str!("../../../../accord-device/kernels/pingpong.cu")),
    ("many_peer.cu", include_str!("../../../../accord-device/kernels/many_peer.cu")),
    ("fill_check.cu", include_str!("../../../../accord-device/kernels/fill_check.cu")),
    ("rate.cu", include_str!("../../../../accord-device/kernels/rate.cu")),
    ("bandwidth.cu", include_str!("../../../../accord-device/kernels/bandwidth.cu")),
    ("util.cu", include_str!("../../../../accord-device/kernels/util.cu")),
];

const PROGRAM_NAME: &str = "accord_device_kernels.cu";

/// Every kernel file, one after the other: one module (each includes common.cuh once), after
/// a `#define` line for each of `defines` (`NAME` or `NAME=VALUE`, the header's switches such as
/// ACCORD_DEVICE_PUT_INLINE=0, for a before/after in one call).
fn program(defines: &[String]) -> String {
    let mut text: String = defines.iter().map(|d| format!("#define {}\n", d.replacen('=', " ", 1))).collect();
    text.push_str(&SOURCES.iter().map(|(_, text)| *text).collect::<Vec<_>>().join("\n"));
    text
}

/// Whether `define` is `NAME` or `NAME=VALUE` with NAME an identifier and VALUE free of line
/// breaks (what `--define` accepts).
pub fn valid_define(define: &str) -> bool {
    let (name, value) = define.split_once('=').unwrap_or((define, ""));
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !value.contains(['\n', '\r'])
}

/// Status values of the header's `accord::device::Status`.
pub const STATUS_NAMES: [&str; 5] = ["OK", "TIMEOUT", "PROXY_ERROR", "BAD_ARGUMENT", "NOT_DIRECT"];

/// The name of a status word.
pub fn status_name(status: u64) -> String {
    STATUS_NAMES.get(status as usize).map_or_else(|| format!("status {status}"), |s| s.to_string())
}

/// Ping-pong variants (`mode` of `accord_dev_pingpong`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PingMode {
    /// put through the proxy.
    Proxy,
    /// put_direct: the calling thread stores into the peer's mapped window.
    Direct,
    /// put_value: the value travels in the descriptor.
    Value,
    /// The floor under put_direct: raw stores, a system fence and a flag, no API.
    Floor,
    /// put_direct's sender, the floor's receiver.
    DirectToRawWait,
    /// The floor's sender, wait_signal as receiver.
    RawToWaitSignal,
    /// The floor, its receiver reading the clock every 64 polls.
    FloorClock64,
    /// The floor, its receiver summing every rank's slot (read_signal's loads).
    FloorSum,
    /// The floor, a system-scope acquire fence after each wait.
    FloorFence,
    /// The floor, one system-scope acquire load after each wait.
    FloorAcquireLoad,
    /// put_direct through a `DirectPeer` resolved once before the loop (no table read a put).
    DirectPeer,
    /// The floor with its sender's targets resolved once before the loop.
    FloorHoisted,
}

impl PingMode {
    pub fn name(self) -> &'static str {
        match self {
            PingMode::Proxy => "put",
            PingMode::Direct => "put_direct",
            PingMode::Value => "put_value",
            PingMode::Floor => "floor",
            PingMode::DirectToRawWait => "direct>raw",
            PingMode::RawToWaitSignal => "raw>wait",
            PingMode::FloorClock64 => "floor+clk",
            PingMode::FloorSum => "floor+sum",
            PingMode::FloorFence => "floor+fence",
            PingMode::FloorAcquireLoad => "floor+acq",
            PingMode::DirectPeer => "direct_peer",
            PingMode::FloorHoisted => "floor_hoist",
        }
    }

    fn code(self) -> u64 {
        match self {
            PingMode::Proxy => 0,
            PingMode::Direct => 1,
            PingMode::Value => 2,
            PingMode::Floor => 3,
            PingMode::DirectToRawWait => 4,
            PingMode::RawToWaitSignal => 5,
            PingMode::FloorClock64 => 6,
            PingMode::FloorSum => 7,
            PingMode::FloorFence => 8,
            PingMode::FloorAcquireLoad => 9,
            PingMode::DirectPeer => 10,
            PingMode::FloorHoisted => 11,
        }
    }
}

/// The compiled kernels of one GPU.
pub struct Kernels {
    pingpong: Kernel,
    many_peer: Kernel,
    fill: Kernel,
    check: Kernel,
    rate: Kernel,
    bandwidth: Kernel,
    wait: Kernel,
    flush: Kernel,
    barrier: Kernel,
    refusals: Kernel,
    probe_direct: Kernel,
    warm: Kernel,
    _module: Arc<Module>,
}

/// A scratch folder holding the header and common.cuh, removed on drop.
struct IncludeTree(PathBuf);

impl IncludeTree {
    fn write() -> Result<IncludeTree, String> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let root = std::env::temp_dir().join(format!("accord-device-bench-{}-{nanos}", std::process::id()));
        let put = |path: PathBuf, text: &str| -> Result<(), String> {
            std::fs::create_dir_all(path.parent().expect("has a parent")).map_err(|e| format!("{path:?}: {e}"))?;
            std::fs::write(&path, text).map_err(|e| format!("{path:?}: {e}"))
        };
        put(root.join("include/accord/device.cuh"), HEADER)?;
        put(root.join("kernels/common.cuh"), COMMON)?;
        Ok(IncludeTree(root))
    }

    fn dirs(&self) -> Vec<PathBuf> {
        vec![self.0.join("include"), self.0.join("kernels")]
    }
}

impl Drop for IncludeTree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Each kernel's parameters are 8-byte values (pointers or `unsigned long long`), in the order
/// the typed launches below pass them; every pointer is a device table from the proxy or a
/// device buffer the caller owns and keeps alive until the stream is synchronised.
fn launch(kernel: &Kernel, config: LaunchConfig, stream: &Stream, args: &[u64]) -> Result<(), String> {
    // Safety: see above; each caller below passes exactly its kernel's parameter list.
    #[allow(unsafe_code)]
    let launched = unsafe { launch_u64_args(kernel, config, stream, args) };
    launched.map_err(|e| format!("launch of {}: {e}", kernel.name()))
}

const ONE: LaunchConfig = LaunchConfig { grid: [1, 1, 1], block: [1, 1, 1], shared_bytes: 0 };

impl Kernels {
    /// Compiles every kernel (one module) for `gpu`.
    pub fn load(gpu: &Gpu, defines: &[String]) -> Result<Kernels, String> {
        let tree = IncludeTree::write()?;
        let module = Module::compile_and_load_with_includes(gpu, &program(defines), PROGRAM_NAME, &tree.dirs())
            .map_err(|e| format!("compiling the device API kernels: {e}"))?;
        let k = |name: &str| module.kernel(name).map_err(|e| format!("kernel {name}: {e}"));
        Ok(Kernels {
            pingpong: k("accord_dev_pingpong")?,
            many_peer: k("accord_dev_many_peer")?,
            fill: k("accord_dev_fill")?,
            check: k("accord_dev_check")?,
            rate: k("accord_dev_rate")?,
            bandwidth: k("accord_dev_bandwidth")?,
            wait: k("accord_dev_wait")?,
            flush: k("accord_dev_flush")?,
            barrier: k("accord_dev_barrier")?,
            refusals: k("accord_dev_refusals")?,
            probe_direct: k("accord_dev_probe_direct")?,
            warm: k("accord_dev_warm")?,
            _module: module,
        })
    }

    /// `iters` round trips between ranks 0 and 1 on signal `signal` (see pingpong.cu).
    #[allow(clippy::too_many_arguments)]
    pub fn pingpong(
        &self,
        stream: &Stream,
        table: u64,
        iters: u64,
        bytes: u64,
        mode: PingMode,
        signal: u32,
        timeout_ns: u64,
        out: DevicePtr,
    ) -> Result<(), String> {
        let args = [table, iters, bytes, mode.code(), u64::from(signal), timeout_ns, out.0];
        launch(&self.pingpong, ONE, stream, &args)
    }

    /// One round of the many-peer exchange, one block of `threads`.
    #[allow(clippy::too_many_arguments)]
    pub fn many_peer(
        &self,
        stream: &Stream,
        table: u64,
        threads: u32,
        bytes_per_peer: u64,
        round: u64,
        signal: u32,
        timeout_ns: u64,
        out: DevicePtr,
    ) -> Result<(), String> {
        let args = [table, bytes_per_peer, round, u64::from(signal), timeout_ns, out.0];
        launch(&self.many_peer, LaunchConfig::linear(1, threads), stream, &args)
    }

    /// Fills `bytes` at `ptr` with the pattern of (src, dst, round).
    pub fn fill(&self, stream: &Stream, ptr: DevicePtr, bytes: u64, who: (u64, u64), round: u64) -> Result<(), String> {
        launch(&self.fill, LaunchConfig::linear(264, 256), stream, &[ptr.0, bytes, who.0, who.1, round])
    }

    /// Adds to out[1] the bytes at `ptr` that differ from the pattern of (src, dst, round).
    #[allow(clippy::too_many_arguments)]
    pub fn check(
        &self,
        stream: &Stream,
        ptr: DevicePtr,
        bytes: u64,
        who: (u64, u64),
        round: u64,
        out: DevicePtr,
    ) -> Result<(), String> {
        launch(&self.check, LaunchConfig::linear(264, 256), stream, &[ptr.0, bytes, who.0, who.1, round, out.0])
    }

    /// `blocks` x `threads` threads each issue `puts` puts of `bytes` to `peer`.
    #[allow(clippy::too_many_arguments)]
    pub fn rate(
        &self,
        stream: &Stream,
        table: u64,
        grid: (u32, u32),
        peer: u32,
        puts: u64,
        bytes: u64,
        stride: u64,
        out: DevicePtr,
    ) -> Result<(), String> {
        launch(
            &self.rate,
            LaunchConfig::linear(grid.0, grid.1),
            stream,
            &[table, u64::from(peer), puts, bytes, stride, out.0],
        )
    }

    /// One thread issues `count` puts of `bytes` to `peer` (the last signalled), then flushes.
    #[allow(clippy::too_many_arguments)]
    pub fn bandwidth(
        &self,
        stream: &Stream,
        table: u64,
        peer: u32,
        bytes: u64,
        count: u64,
        signal: u32,
        timeout_ns: u64,
        out: DevicePtr,
    ) -> Result<(), String> {
        let args = [table, u64::from(peer), bytes, count, u64::from(signal), timeout_ns, out.0];
        launch(&self.bandwidth, ONE, stream, &args)
    }

    /// Waits for signal `signal` to reach `at_least` (out[2]: the value reached).
    pub fn wait(
        &self,
        stream: &Stream,
        table: u64,
        signal: u32,
        at_least: u64,
        timeout_ns: u64,
        out: DevicePtr,
    ) -> Result<(), String> {
        launch(&self.wait, ONE, stream, &[table, u64::from(signal), at_least, timeout_ns, out.0])
    }

    /// Flushes every ring.
    pub fn flush(&self, stream: &Stream, table: u64, timeout_ns: u64, out: DevicePtr) -> Result<(), String> {
        launch(&self.flush, ONE, stream, &[table, timeout_ns, out.0])
    }

    /// `rounds` device barriers (out[2] += rounds).
    pub fn barrier(
        &self,
        stream: &Stream,
        table: u64,
        rounds: u64,
        timeout_ns: u64,
        out: DevicePtr,
    ) -> Result<(), String> {
        launch(&self.barrier, ONE, stream, &[table, rounds, timeout_ns, out.0])
    }

    /// Calls the API with bad arguments (out[2]: how many were not refused).
    pub fn refusals(&self, stream: &Stream, table: u64, out: DevicePtr) -> Result<(), String> {
        launch(&self.refusals, ONE, stream, &[table, out.0])
    }

    /// One 64-byte put with a signal to every rank, without waiting for them.
    pub fn warm(&self, stream: &Stream, table: u64, signal: u32, out: DevicePtr) -> Result<(), String> {
        launch(&self.warm, ONE, stream, &[table, u64::from(signal), out.0])
    }

    /// out[2] = 1 when window 0 and the signal slots of `peer` are mapped for direct stores.
    pub fn probe_direct(&self, stream: &Stream, table: u64, peer: u32, out: DevicePtr) -> Result<(), String> {
        launch(&self.probe_direct, ONE, stream, &[table, u64::from(peer), out.0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The module this binary builds on the GPU host (every kernel file in one program, the
    /// header and common.cuh from the scratch include tree) compiles with NVRTC, which needs no
    /// GPU, and defines every kernel `Kernels::load` looks up. Skips without NVRTC.
    #[test]
    fn the_bench_program_compiles_and_defines_every_kernel() {
        let program = program(&[]);
        for name in [
            "accord_dev_pingpong",
            "accord_dev_many_peer",
            "accord_dev_fill",
            "accord_dev_check",
            "accord_dev_rate",
            "accord_dev_bandwidth",
            "accord_dev_wait",
            "accord_dev_flush",
            "accord_dev_barrier",
            "accord_dev_refusals",
            "accord_dev_probe_direct",
            "accord_dev_warm",
        ] {
            assert!(program.contains(&format!("void {name}(")), "{name} is not defined");
        }
        if !accord_cuda::probe().nvrtc {
            println!("skipped: no NVRTC to compile the program with");
            return;
        }
        let tree = IncludeTree::write().expect("include tree");
        let built = accord_cuda::kernels::compile_cached_with_includes(&program, PROGRAM_NAME, "sm_90", &tree.dirs());
        assert!(built.is_ok_and(|cubin| !cubin.is_empty()));
        // The header's switches the bench flips for its before/after rows compile too.
        let switched = super::program(&["ACCORD_DEVICE_PUT_INLINE=0".into(), "ACCORD_DEVICE_TABLE_PLAIN_LOADS".into()]);
        let built = accord_cuda::kernels::compile_cached_with_includes(&switched, PROGRAM_NAME, "sm_90", &tree.dirs());
        assert!(built.is_ok_and(|cubin| !cubin.is_empty()));
    }

    #[test]
    fn defines_are_identifiers_with_an_optional_one_line_value() {
        assert!(valid_define("ACCORD_DEVICE_PUT_INLINE=0"));
        assert!(valid_define("ACCORD_DEVICE_TABLE_PLAIN_LOADS"));
        for bad in ["", "=1", "9X", "A B", "X=1\n#include <x>", "X;Y"] {
            assert!(!valid_define(bad), "{bad:?} must be refused");
        }
        assert_eq!(
            program(&["A=1".into(), "B".into()]).lines().take(2).collect::<Vec<_>>(),
            ["#define A 1", "#define B"]
        );
    }
}
