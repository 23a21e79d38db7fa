//! The device API end to end without a GPU: the header's own device functions (`put`,
//! `put_value`, `signal`, `wait_signal`, `flush`, `barrier`, `wait_counter`), compiled for the
//! host with `crates/accord-device/kernels/host_emulation.h` into a shared library, drive real
//! `DeviceComm`s (host placement: every table address is a host address) over engines on
//! loopback, 2 and 3 ranks in one process, on the in-process memcpy route and on UDP through the
//! fault injector (loss, duplication, reordering). Checks: every byte lands at the right peer and
//! offset, signal sums are exact and seen only after the bytes, counters count once, the device
//! barrier passes, no proxy error. This is the contract between the header and the proxy as code
//! on both sides runs it; the GPU memory model itself is only exercised by accord-device-bench.
//!
//! Skips with a printed reason without a host C++ compiler.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use accord_coll::engine::connect_in_process;
use accord_coll::{CollConfig, Communicator};
use accord_device::{DeviceComm, DeviceCommConfig};
use accord_engine::{Engine, FaultConfig, ShmConfig};

/// The C entry points the test calls, each a thin wrapper of one device function.
const WRAPPERS: &str = r#"
#include <accord/device.cuh>
using namespace accord::device;
typedef const DeviceTable* T;
extern "C" int emu_put(u64 t, u32 window, u32 peer, u64 dst, u32 src_window, u64 src, u64 bytes, u32 sig_op,
                       u32 sig_id, u64 sig_value, u32 counter, u32 ring) {
  return put((T)t, window, peer, dst, src_window, src, bytes, (u8)sig_op, sig_id, sig_value, counter, ring);
}
extern "C" int emu_put_value(u64 t, u32 window, u32 peer, u64 dst, u64 value, u32 bytes, u32 sig_op, u32 sig_id,
                             u64 sig_value, u32 ring) {
  return put_value((T)t, window, peer, dst, value, bytes, (u8)sig_op, sig_id, sig_value, NO_COUNTER, ring);
}
extern "C" int emu_signal(u64 t, u32 peer, u32 id, u32 op, u64 value) { return signal((T)t, peer, id, (u8)op, value); }
extern "C" int emu_wait_signal(u64 t, u32 id, u64 at_least, u64 timeout_ns) {
  return wait_signal((T)t, id, at_least, timeout_ns);
}
extern "C" u64 emu_read_signal(u64 t, u32 id) { return read_signal((T)t, id); }
extern "C" int emu_flush(u64 t, u64 timeout_ns) { return flush((T)t, timeout_ns); }
extern "C" int emu_barrier(u64 t, u64 timeout_ns) { return barrier((T)t, timeout_ns); }
extern "C" int emu_wait_counter(u64 t, u32 id, u64 at_least, u64 timeout_ns) {
  return wait_counter((T)t, id, at_least, timeout_ns);
}
"#;

type PutFn = unsafe extern "C" fn(u64, u32, u32, u64, u32, u64, u64, u32, u32, u64, u32, u32) -> i32;
type PutValueFn = unsafe extern "C" fn(u64, u32, u32, u64, u64, u32, u32, u32, u64, u32) -> i32;
type SignalFn = unsafe extern "C" fn(u64, u32, u32, u32, u64) -> i32;
type WaitFn = unsafe extern "C" fn(u64, u32, u64, u64) -> i32;
type ReadFn = unsafe extern "C" fn(u64, u32) -> u64;
type TimeoutFn = unsafe extern "C" fn(u64, u64) -> i32;

const SIGNAL_ADD: u32 = 1;
const SIGNAL_SET: u32 = 2;
const WAIT_NS: u64 = 20_000_000_000;
const SRC_BYTES: usize = 8192;
const SLOT: u64 = 4096;
const CHUNK: u64 = 512;
const CHUNKS: u64 = 6;
const VALUE_AT: u64 = 4000;

/// The emulated device library, built once per test process.
struct DeviceLib {
    lib: libloading::Library,
    _dir: Scratch,
}

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn compiler() -> Option<String> {
    let candidates = std::env::var("CXX").ok().into_iter().chain(["c++", "g++", "clang++"].map(String::from));
    candidates.into_iter().find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
}

fn build_lib(cxx: &str) -> DeviceLib {
    let device = Path::new(env!("CARGO_MANIFEST_DIR")).join("../accord-device");
    let shim = std::fs::read_to_string(device.join("kernels/host_emulation.h")).expect("host_emulation.h");
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("accord-device-emulated-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let scratch = Scratch(dir.clone());
    let src = dir.join("device.cpp");
    let so = dir.join("libaccord_device_emulated.so");
    std::fs::write(&src, format!("{shim}\n{WRAPPERS}")).expect("source");
    let built = Command::new(cxx)
        .args(["-std=c++17", "-O2", "-fPIC", "-shared", "-pthread", "-Wall", "-Wno-unused-parameter", "-I"])
        .arg(device.join("include"))
        .arg(&src)
        .arg("-o")
        .arg(&so)
        .output()
        .expect("run the compiler");
    assert!(built.status.success(), "{cxx} failed:\n{}", String::from_utf8_lossy(&built.stderr));
    // Safety: a library this test just built from the header and the wrappers above; loading it
    // runs no initialiser beyond the C++ runtime's.
    #[allow(unsafe_code)]
    let lib = unsafe { libloading::Library::new(&so) }.expect("load the emulated device library");
    DeviceLib { lib, _dir: scratch }
}

impl DeviceLib {
    fn f<F: Copy>(&self, name: &[u8]) -> F {
        // Safety: each name is one of the wrappers above, and F is its exact C signature.
        #[allow(unsafe_code)]
        unsafe {
            *self.lib.get::<F>(name).expect("symbol")
        }
    }
}

/// Calls into the library: every pointer it follows comes from `DeviceComm::device_table_ptr`
/// (host placement), alive until the communicator closes, which happens after these calls.
macro_rules! call {
    ($lib:expr, $ty:ty, $name:literal $(, $arg:expr)*) => {{
        let f: $ty = $lib.f($name);
        #[allow(unsafe_code)]
        let r = unsafe { f($($arg),*) };
        r
    }};
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Memcpy,
    UdpFaulty,
}

fn engine(route: Route, seed: u64) -> Arc<Engine> {
    let b = Engine::builder().ignore_env().idle_timeout(Duration::from_secs(5));
    let b = match route {
        Route::Memcpy => b,
        Route::UdpFaulty => {
            let faults = FaultConfig {
                drop: 0.05,
                duplicate: 0.05,
                reorder: 0.1,
                reorder_delay_packets: 3,
                ..FaultConfig::default()
            };
            b.force_network(true)
                .shm(ShmConfig { enabled: false, ..ShmConfig::default() })
                .fault_injection(faults, seed)
        }
    };
    Arc::new(b.build().expect("engine on loopback"))
}

fn pattern(rank: usize, i: usize) -> u8 {
    (i.wrapping_mul(31) ^ (rank * 101 + 7)) as u8
}

fn src_offset(peer: usize, k: u64) -> u64 {
    (k * CHUNK + peer as u64 * 13) % (SRC_BYTES as u64 - CHUNK)
}

/// One rank: two producer threads put chunks to every rank through two rings with signals and
/// counters, one put_value with a SET signal per peer; then waits and checks what landed.
fn rank_body(lib: &DeviceLib, rank: usize, n: usize, dc: &mut DeviceComm) -> Result<(), String> {
    let src = dc.alloc_window(SRC_BYTES).map_err(|e| e.to_string())?;
    let dst = dc.alloc_window(n * SLOT as usize).map_err(|e| e.to_string())?;
    let data: Vec<u8> = (0..SRC_BYTES).map(|i| pattern(rank, i)).collect();
    dc.write_window(src, 0, &data).map_err(|e| e.to_string())?;
    let table = dc.device_table_ptr().map_err(|e| e.to_string())?;
    dc.communicator().barrier().map_err(|e| e.to_string())?;
    let statuses: Vec<i32> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2u32)
            .map(|ring| {
                s.spawn(move || {
                    let mut worst = 0;
                    for peer in 0..n {
                        for k in (u64::from(ring)..CHUNKS).step_by(2) {
                            let dst_offset = rank as u64 * SLOT + k * CHUNK;
                            let st = call!(
                                lib,
                                PutFn,
                                b"emu_put",
                                table,
                                dst,
                                peer as u32,
                                dst_offset,
                                src,
                                src_offset(peer, k),
                                CHUNK,
                                SIGNAL_ADD,
                                0,
                                1,
                                0,
                                ring
                            );
                            worst = worst.max(st);
                        }
                        if ring == 1 {
                            let value = 0x1122_3344_5566_7788u64 ^ rank as u64;
                            let st = call!(
                                lib,
                                PutValueFn,
                                b"emu_put_value",
                                table,
                                dst,
                                peer as u32,
                                rank as u64 * SLOT + VALUE_AT,
                                value,
                                8,
                                SIGNAL_SET,
                                1,
                                100 + rank as u64,
                                ring
                            );
                            worst = worst.max(st);
                        }
                    }
                    worst
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("producer")).collect()
    });
    if statuses.iter().any(|s| *s != 0) {
        return Err(format!("rank {rank}: a put returned status {statuses:?}"));
    }
    let arrivals = CHUNKS * n as u64;
    let w = call!(lib, WaitFn, b"emu_wait_signal", table, 0, arrivals, WAIT_NS);
    if w != 0 {
        // Everything that says where the missing arrivals went: how far the signal got, the
        // proxies' counters and the errors they recorded.
        let reached = call!(lib, ReadFn, b"emu_read_signal", table, 0);
        return Err(format!(
            "rank {rank}: wait_signal(0, {arrivals}) returned {w} at {reached}; proxy stats {:?}; errors {:?}",
            dc.stats(),
            dc.errors()
        ));
    }
    // SET values from every rank: wait for their sum on signal 1.
    let set_sum: u64 = (0..n as u64).map(|r| 100 + r).sum();
    let w = call!(lib, WaitFn, b"emu_wait_signal", table, 1, set_sum, WAIT_NS);
    let read = call!(lib, ReadFn, b"emu_read_signal", table, 1);
    if w != 0 || read != set_sum {
        return Err(format!("rank {rank}: signal 1 reached {read}, expected {set_sum} (status {w})"));
    }
    for sender in 0..n {
        let mut got = vec![0u8; SLOT as usize];
        dc.read_window(dst, sender * SLOT as usize, &mut got).map_err(|e| e.to_string())?;
        for k in 0..CHUNKS {
            let from = src_offset(rank, k) as usize;
            let want: Vec<u8> = (from..from + CHUNK as usize).map(|i| pattern(sender, i)).collect();
            if got[(k * CHUNK) as usize..((k + 1) * CHUNK) as usize] != want[..] {
                return Err(format!("rank {rank}: chunk {k} from rank {sender} differs"));
            }
        }
        let value = u64::from_le_bytes(got[VALUE_AT as usize..VALUE_AT as usize + 8].try_into().expect("8 bytes"));
        if value != 0x1122_3344_5566_7788u64 ^ sender as u64 {
            return Err(format!("rank {rank}: put_value from rank {sender} wrote {value:#x}"));
        }
    }
    let f = call!(lib, TimeoutFn, b"emu_flush", table, WAIT_NS);
    let c = call!(lib, WaitFn, b"emu_wait_counter", table, 0, arrivals, WAIT_NS);
    if f != 0 || c != 0 || dc.counter(0).map_err(|e| e.to_string())? != arrivals {
        return Err(format!("rank {rank}: flush {f}, counter wait {c}, counter {:?}", dc.counter(0)));
    }
    for round in 0..2 {
        let b = call!(lib, TimeoutFn, b"emu_barrier", table, WAIT_NS);
        if b != 0 {
            return Err(format!("rank {rank}: barrier round {round} returned {b}"));
        }
    }
    let errors = dc.errors();
    if !errors.is_empty() {
        return Err(format!("rank {rank}: proxy errors {errors:?}"));
    }
    // A signal nobody sends: a bounded TIMEOUT (1).
    let never = call!(lib, WaitFn, b"emu_wait_signal", table, 2, 1, 20_000_000);
    if never != 1 {
        return Err(format!("rank {rank}: an unsent signal gave status {never}, not TIMEOUT"));
    }
    let _ = call!(lib, SignalFn, b"emu_signal", table, rank as u32, 3, SIGNAL_ADD, 1);
    Ok(())
}

fn run(route: Route, n: usize) {
    let Some(cxx) = compiler() else {
        println!("skipped: no host C++ compiler ($CXX, c++, g++, clang++) to build the emulated device code");
        return;
    };
    let lib = build_lib(&cxx);
    let config =
        DeviceCommConfig { rings: 2, slot_count: 8, user_signals: 4, counters: 2, ..DeviceCommConfig::default() };
    let engines = (0..n).map(|r| engine(route, 300 + r as u64)).collect();
    let transports = connect_in_process(engines).expect("the ranks' engines prepare and connect");
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = transports
            .into_iter()
            .enumerate()
            .map(|(rank, t)| {
                let (config, lib) = (config.clone(), &lib);
                s.spawn(move || {
                    let coll = CollConfig { timeout: Duration::from_secs(30), ..CollConfig::default() };
                    let comm = Communicator::new(t, coll).map_err(|e| e.to_string())?;
                    let mut dc = DeviceComm::new(comm, config).map_err(|e| e.to_string())?;
                    let out = rank_body(lib, rank, n, &mut dc);
                    dc.communicator().barrier().map_err(|e| e.to_string())?;
                    dc.close().map_err(|e| e.to_string())?;
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    for r in results {
        r.unwrap_or_else(|e| panic!("{route:?}, {n} ranks: {e}"));
    }
}

#[test]
fn device_code_drives_the_proxy_on_the_memcpy_route() {
    run(Route::Memcpy, 2);
    run(Route::Memcpy, 3);
}

#[test]
fn device_code_drives_the_proxy_over_udp_under_faults() {
    run(Route::UdpFaulty, 2);
}
