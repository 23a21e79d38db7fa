//! Outages heal (issue 25): two engines of one process exchange writes with immediates over
//! UDP in both directions while every path between them is blackholed, then healed.
//!
//! - With the default timeouts a 5 s blackhole outlasts the idle timeout (5 s): the
//!   connections carrying writes time out, and the writes in flight are resent on fresh
//!   connections once the path is back. Every write completes, every immediate is counted
//!   exactly once, every byte is right, and no peer is called dead (a pidfd watches it).
//! - Scaled down (idle timeout 300 ms, two lanes) the same holds, and the reconnect is
//!   certain, so its counters must show it.
//! - Only the acknowledgements lost (one engine deafened): the writes land and count, the
//!   writer's connection times out and resends them on a fresh one, and the receiver
//!   acknowledges the resent copies without placing or counting them again.
//! - A path that never returns fails the writes within `idle_timeout + peer_dead_after`
//!   (plus a handshake timeout), with an error naming the peer, not calling it dead.

use accord_engine::{Engine, EngineConfig, FaultConfig, MrBuffer, Transfer, TransferError, WriteOp};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The hang guard of every wait: far above any bound the test relies on.
const WAIT: Duration = Duration::from_secs(60);
const LEN: usize = 16 * 1024;
/// Slots of the source and destination regions a flow cycles through.
const SLOTS: usize = 32;
/// Writes a flow keeps in flight (fewer than `SLOTS`, so a slot is rewritten only after its
/// previous write completed: a late duplicate of that one would show in the final bytes).
const WINDOW: usize = 8;
/// Bound on a flow's writes, whatever happens to its stop flag.
const WRITES_MAX: usize = 20_000;

fn engine(config: EngineConfig, seed: u64) -> Engine {
    let mut config = config;
    config.shm.enabled = false;
    Engine::builder()
        .ignore_env()
        .config(config)
        .force_network(true)
        .fault_injection(FaultConfig::default(), seed)
        .build()
        .unwrap()
}

/// The bytes of a flow's write number `i`.
fn pattern(flow: u8, i: usize) -> Vec<u8> {
    let seed = (i as u32).wrapping_mul(2_654_435_761) ^ u32::from(flow) << 24;
    (0..LEN).map(|k| (seed.wrapping_add(k as u32 * 7) >> 3) as u8).collect()
}

/// One direction of writes: `from` writes into `dst` (registered at the peer), slot after
/// slot, each write with immediate `imm`, keeping [`WINDOW`] in flight, until `stop`.
struct Flow<'a> {
    from: &'a Engine,
    dst: &'a MrBuffer,
    id: u8,
    imm: u32,
    done: AtomicUsize,
}

impl Flow<'_> {
    /// Runs until `stop` (or [`WRITES_MAX`]); returns how many writes it made. Every wait is
    /// bounded by [`WAIT`]; a failed write fails the test, naming it.
    fn run(&self, stop: &AtomicBool) -> usize {
        let src = self.from.alloc(SLOTS * LEN).unwrap();
        let (h, d) = (src.handle(), self.dst.descriptor());
        let mut in_flight: std::collections::VecDeque<(usize, Transfer)> = Default::default();
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) && i < WRITES_MAX {
            if in_flight.len() >= WINDOW {
                let (n, t) = in_flight.pop_front().unwrap();
                t.wait_timeout(WAIT).unwrap_or_else(|e| panic!("flow {} write {n}: {e}", self.id));
                self.done.fetch_add(1, Ordering::Relaxed);
            }
            let at = (i % SLOTS) * LEN;
            src.write_at(at, &pattern(self.id, i)).unwrap();
            let op = WriteOp {
                src: &h,
                src_offset: at as u64,
                dst: &d,
                dst_offset: at as u64,
                len: LEN as u64,
                imm: Some(self.imm),
            };
            in_flight.push_back((i, self.from.write(&op).unwrap()));
            i += 1;
            std::thread::sleep(Duration::from_millis(2));
        }
        for (n, t) in in_flight {
            t.wait_timeout(WAIT).unwrap_or_else(|e| panic!("flow {} write {n}: {e}", self.id));
            self.done.fetch_add(1, Ordering::Relaxed);
        }
        i
    }

    /// Every slot holds the last write made to it.
    fn check_bytes(&self, writes: usize) {
        let got = self.dst.to_vec();
        for slot in 0..SLOTS.min(writes) {
            let last = (writes - 1 - slot) / SLOTS * SLOTS + slot;
            let want = pattern(self.id, last);
            assert!(
                got[slot * LEN..(slot + 1) * LEN] == want[..],
                "flow {} slot {slot}: not write {last}'s bytes",
                self.id
            );
        }
    }
}

/// Waits (bounded) until `cond`, naming what it waited for.
fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "waited {WAIT:?} for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs writes both ways, blackholes both engines for `outage` once writes flow, heals, and
/// checks that every write completed exactly once with the right bytes and nobody was
/// called dead. Returns the two engines' stats.
fn writes_survive(config: EngineConfig, outage: Duration, deaf_only: bool) -> [accord_engine::EngineStats; 2] {
    let (a, b) = (engine(config.clone(), 1), engine(config, 2));
    a.add_peer(&b.address()).unwrap();
    b.add_peer(&a.address()).unwrap();
    let (dst_at_b, dst_at_a) = (b.alloc(SLOTS * LEN).unwrap(), a.alloc(SLOTS * LEN).unwrap());
    let flows = [
        Flow { from: &a, dst: &dst_at_b, id: 1, imm: 11, done: AtomicUsize::new(0) },
        Flow { from: &b, dst: &dst_at_a, id: 2, imm: 22, done: AtomicUsize::new(0) },
    ];
    // Waits that name the peer run the liveness checks that once called a live peer dead.
    let _watches = (a.watch_peer(b.id()), b.watch_peer(a.id()));
    let stop = AtomicBool::new(false);
    let writes = std::thread::scope(|s| {
        let runs: Vec<_> = flows.iter().map(|f| s.spawn(|| f.run(&stop))).collect();
        wait_until("writes flowing both ways", || flows.iter().all(|f| f.done.load(Ordering::Relaxed) >= 20));
        if deaf_only {
            assert!(a.deafen(outage));
        } else {
            assert!(a.blackhole(outage) && b.blackhole(outage));
        }
        let at_cut: Vec<usize> = flows.iter().map(|f| f.done.load(Ordering::Relaxed)).collect();
        std::thread::sleep(outage);
        wait_until("writes flowing again after the heal", || {
            flows.iter().zip(&at_cut).all(|(f, cut)| f.done.load(Ordering::Relaxed) >= cut + 2 * WINDOW + 20)
        });
        stop.store(true, Ordering::Relaxed);
        runs.into_iter().map(|r| r.join().unwrap()).collect::<Vec<_>>()
    });
    for ((flow, n), receiver) in flows.iter().zip(&writes).zip([&b, &a]) {
        let target = *n as u64;
        assert_eq!(receiver.imm_counter(flow.imm).wait(target, WAIT), target, "flow {}: every immediate", flow.id);
        flow.check_bytes(*n);
    }
    // Checked once every write completed: a resend's duplicate would have landed by then.
    for ((flow, n), receiver) in flows.iter().zip(&writes).zip([&b, &a]) {
        assert_eq!(receiver.imm_counter(flow.imm).value(), *n as u64, "flow {}: counted exactly once", flow.id);
    }
    assert_eq!(a.peer_death(b.id()), None, "a live peer is not called dead");
    assert_eq!(b.peer_death(a.id()), None, "a live peer is not called dead");
    let stats = [a.stats(), b.stats()];
    for (name, s) in ["a", "b"].iter().zip(&stats) {
        let sum = |f: fn(&accord_engine::LaneStats) -> u64| s.lanes.iter().map(f).sum::<u64>();
        eprintln!(
            "{name}: {} writes; reconnect resends {}, resent packets skipped {}, duplicates suppressed {}, failovers {}, \
             packets cut {}",
            writes[(*name == "b") as usize],
            sum(|l| l.reconnect_resends),
            sum(|l| l.resent_skipped),
            sum(|l| l.duplicates_suppressed),
            sum(|l| l.failovers),
            s.faults.iter().map(|f| f.cut).sum::<u64>()
        );
        assert_eq!(sum(|l| l.unresponsive_failures), 0);
    }
    stats
}

/// The case, with the default idle timeout (5 s) and peer-dead bound (5 s).
#[test]
fn writes_in_flight_survive_a_5_s_blackhole_with_the_default_timeouts() {
    let config = EngineConfig::default();
    assert_eq!(config.idle_timeout, Duration::from_secs(5), "the defaults the issue ran with");
    writes_survive(config, Duration::from_secs(5), false);
}

/// Scaled: the outage lasts five idle timeouts over two lanes, so every lane's connection
/// times out and its writes must go through fresh connections (handshakes time out too while
/// the path is cut, and are retried).
#[test]
fn an_outage_of_several_idle_timeouts_heals_by_reconnecting_every_lane() {
    let config =
        EngineConfig { idle_timeout: Duration::from_millis(300), workers_per_nic: 2, ..EngineConfig::default() };
    let stats = writes_survive(config, Duration::from_millis(1500), false);
    let resends: u64 = stats.iter().flat_map(|s| &s.lanes).map(|l| l.reconnect_resends).sum();
    assert!(resends > 0, "the writes in flight were resent on fresh connections");
}

/// A hears nothing for five idle timeouts while its writes still reach B: B places and counts
/// them, A's connection times out for want of acknowledgements and A resends them on a fresh
/// connection once it hears B's HelloAck. B must acknowledge the resent copies without placing
/// or counting them (the exact counts and bytes above check it; the counter shows it happened).
#[test]
fn writes_whose_acknowledgements_were_lost_are_resent_but_not_counted_twice() {
    let config = EngineConfig { idle_timeout: Duration::from_millis(300), ..EngineConfig::default() };
    let [a, b] = writes_survive(config, Duration::from_millis(1500), true);
    let resends: u64 = a.lanes.iter().map(|l| l.reconnect_resends).sum();
    let skipped: u64 = b.lanes.iter().map(|l| l.resent_skipped).sum();
    assert!(resends > 0 && skipped > 0, "A resent {resends} parts; B skipped {skipped} packets of completed ones");
}

/// A path that never comes back: the write fails within its bound, naming the peer as
/// unresponsive, and the peer is not declared dead (its process lives).
#[test]
fn a_path_that_never_returns_fails_the_write_naming_the_peer() {
    let config = EngineConfig {
        idle_timeout: Duration::from_millis(300),
        peer_dead_after: Duration::from_millis(1000),
        ..EngineConfig::default()
    };
    let (a, b) = (engine(config.clone(), 3), engine(config, 4));
    a.add_peer(&b.address()).unwrap();
    b.add_peer(&a.address()).unwrap();
    let (src, dst) = (a.alloc(LEN).unwrap(), b.alloc(LEN).unwrap());
    let (h, d) = (src.handle(), dst.descriptor());
    let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: LEN as u64, imm: Some(5) };
    a.write(&op).unwrap().wait_timeout(WAIT).unwrap();
    assert!(a.cut_nic(0), "the engine has a fault injector");
    let started = Instant::now();
    let got = a.write(&op).unwrap().wait_timeout(WAIT);
    eprintln!("the write failed {:?} after the cut: {got:?}", started.elapsed());
    match got {
        Err(e @ TransferError::PeerUnresponsive { peer, waited_ms }) => {
            assert_eq!(peer, b.id());
            assert!(waited_ms >= 1000, "resent for peer_dead_after first: {waited_ms} ms");
            assert!(e.to_string().contains(&format!("{:x}", b.id().0)), "the message names the peer: {e}");
        }
        other => panic!("expected PeerUnresponsive naming {:x}, got {other:?}", b.id().0),
    }
    assert_eq!(a.peer_death(b.id()), None, "unreachable is not dead");
    let failures: u64 = a.stats().lanes.iter().map(|l| l.unresponsive_failures).sum();
    assert_eq!(failures, 1);
}
