//! Ranks in one process: each a thread with its own engine on loopback, a communicator over
//! the engine transport, and a device communicator on host placement.
#![allow(dead_code)]

use accord_coll::engine::{EngineTransport, PreparedEngine};
use accord_coll::{CollConfig, Communicator};
use accord_device::layout::{Descriptor, Op, SignalOp, FLAG_COUNTER};
use accord_device::{DeviceComm, DeviceCommConfig};
use accord_engine::{Engine, EngineAddress, EngineConfig, FaultConfig, ShmConfig};
use std::sync::Arc;
use std::time::Duration;

/// Which engine route the ranks' writes take.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// Peers in this process: the submitting thread copies.
    Memcpy,
    /// Forced onto the transport, over same-host shared-memory rings.
    Shm,
    /// Forced onto the transport over UDP loopback.
    Udp,
    /// UDP loopback through the fault injector: loss, reordering, duplication.
    UdpFaulty,
    /// UDP loopback through a fault injector that injects nothing until a NIC is cut.
    UdpCuttable,
}

pub fn faults() -> FaultConfig {
    FaultConfig { drop: 0.05, duplicate: 0.05, reorder: 0.1, reorder_delay_packets: 3, ..FaultConfig::default() }
}

pub fn engine(route: Route, seed: u64) -> Arc<Engine> {
    let mut b = Engine::builder().ignore_env().idle_timeout(Duration::from_secs(5));
    let no_shm = ShmConfig { enabled: false, ..ShmConfig::default() };
    b = match route {
        Route::Memcpy => b,
        Route::Shm => b.force_network(true),
        Route::Udp => b.force_network(true).shm(no_shm),
        Route::UdpFaulty => b.force_network(true).shm(no_shm).fault_injection(faults(), seed),
        // A cut link must fail its put soon: a connection silent 300 ms is lost, and its parts
        // fail once the peer stayed silent for 1 s more (the engine's outage rule).
        Route::UdpCuttable => b
            .config(EngineConfig {
                idle_timeout: Duration::from_millis(300),
                peer_dead_after: Duration::from_secs(1),
                ..EngineConfig::default()
            })
            .force_network(true)
            .shm(no_shm)
            .fault_injection(FaultConfig::default(), seed),
    };
    Arc::new(b.build().expect("engine on loopback"))
}

pub fn coll_config() -> CollConfig {
    CollConfig { timeout: Duration::from_secs(20), ..CollConfig::default() }
}

/// Runs `f(rank, device communicator)` on `n` ranks, each in its own thread; then a barrier
/// (so no rank closes while others still write into it) and close.
pub fn on_ranks<R: Send>(
    n: usize,
    route: Route,
    config: DeviceCommConfig,
    f: impl Fn(usize, &mut DeviceComm) -> R + Sync,
) -> Vec<R> {
    on_ranks_then(n, route, config, true, f)
}

/// As [`on_ranks`]; without the final barrier when `barrier` is false (the ranks can no longer
/// reach each other).
pub fn on_ranks_then<R: Send>(
    n: usize,
    route: Route,
    config: DeviceCommConfig,
    barrier: bool,
    f: impl Fn(usize, &mut DeviceComm) -> R + Sync,
) -> Vec<R> {
    let prepared: Vec<PreparedEngine> =
        (0..n).map(|r| EngineTransport::prepare(engine(route, 100 + r as u64), n).unwrap()).collect();
    let addresses: Vec<EngineAddress> = prepared.iter().map(PreparedEngine::address).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = prepared
            .into_iter()
            .enumerate()
            .map(|(rank, p)| {
                let (addresses, config, f) = (addresses.clone(), config.clone(), &f);
                s.spawn(move || {
                    let t = p.connect(rank, addresses).unwrap();
                    let comm = Communicator::new(t, coll_config()).unwrap();
                    let mut dc = DeviceComm::new(comm, config).unwrap();
                    let out = f(rank, &mut dc);
                    if barrier {
                        dc.communicator().barrier().unwrap();
                    }
                    dc.close().unwrap();
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// A put of `bytes` from `src_window` at `src_offset` to `peer`'s `window` at `dst_offset`.
pub fn put(peer: usize, window: u32, dst_offset: u64, src_window: u32, src_offset: u64, bytes: u64) -> Descriptor {
    Descriptor {
        op: Op::Put as u8,
        peer: peer as u32,
        window,
        src_window,
        dst_offset,
        src_offset,
        bytes,
        ..Descriptor::default()
    }
}

/// `d` with a signal action.
pub fn with_signal(d: Descriptor, op: SignalOp, signal_id: u32, value: u64) -> Descriptor {
    Descriptor { signal_op: op as u8, signal_id, signal_value: value, ..d }
}

/// `d` bumping counter `id` here once complete.
pub fn with_counter(d: Descriptor, id: u32) -> Descriptor {
    Descriptor { flags: d.flags | FLAG_COUNTER, counter_id: id, ..d }
}

/// A signal-only descriptor.
pub fn signal(peer: usize, op: SignalOp, signal_id: u32, value: u64) -> Descriptor {
    with_signal(Descriptor { op: Op::Signal as u8, peer: peer as u32, ..Descriptor::default() }, op, signal_id, value)
}

/// The byte rank `rank` puts at `index` of its source window.
pub fn pattern(rank: usize, index: usize) -> u8 {
    ((rank * 131 + index * 7 + index / 251) % 256) as u8
}

pub fn read(dc: &DeviceComm, window: u32, offset: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    dc.read_window(window, offset, &mut out).unwrap();
    out
}

pub const WAIT: Duration = Duration::from_secs(30);
