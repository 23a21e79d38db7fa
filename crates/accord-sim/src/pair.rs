//! Two hosts, one connection, every path between them: the harness for protocol tests and
//! the loss/path-cut experiments.
//!
//! The driver loop is the one `accord_proto::api` documents, run on a virtual clock: after each
//! event the host places what arrived, hands datagrams to its NIC while the NIC queue has room,
//! collects events, and re-arms its timer.

use crate::events::EventQueue;
use crate::link::{Fate, FaultConfig, LinkConfig, Nic};
use crate::memory::SimMemory;
use accord_proto::wire::MAX_ACK_LEN;
use accord_proto::{
    ConnectionHandle, ConnectionStats, Endpoint, EndpointConfig, Event, Instant, OpError, OpId, PathId, RecvBufferId,
    RegionId, RegionKey, RxMeta, SendRequest, SubmitError, WriteRequest,
};
use core::time::Duration;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

/// One of the two hosts.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Side {
    A,
    B,
}

impl Side {
    fn index(self) -> usize {
        self as usize
    }
    fn other(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
}

/// Everything a run depends on.
#[derive(Clone, Debug)]
pub struct PairConfig {
    /// Every random stream of the run derives from this; printed on every failure.
    pub seed: u64,
    pub link: LinkConfig,
    pub faults: FaultConfig,
    pub endpoint: EndpointConfig,
    /// Count placements per byte (tests); off for large transfers.
    pub track_placements: bool,
    /// Check the endpoints' invariants after every event.
    pub check_invariants: bool,
    /// Virtual time after which a run that has not finished fails.
    pub time_limit: Duration,
}

impl PairConfig {
    /// The reference pair (100 Gbit/s, 10 µs RTT) with simulation-scale timers.
    pub fn datacenter(seed: u64) -> Self {
        let mut endpoint = EndpointConfig::default();
        let c = &mut endpoint.connection;
        c.rto_min = Duration::from_micros(50);
        c.rto_max = Duration::from_millis(5);
        c.initial_rtt = Duration::from_micros(12);
        c.probe_interval = Duration::from_micros(200);
        c.idle_timeout = Duration::from_millis(50);
        PairConfig {
            seed,
            link: LinkConfig::datacenter_100g(),
            faults: FaultConfig::default(),
            endpoint,
            track_placements: false,
            check_invariants: true,
            time_limit: Duration::from_secs(10),
        }
    }
}

/// Why a run failed. Each names the seed that reproduces it.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("seed {seed}: invariant broken at {at_ns} ns: {what}")]
    Invariant { seed: u64, at_ns: u64, what: String },
    #[error("seed {seed}: not finished at the virtual time limit {limit:?} ({pending} operations pending)")]
    TimeLimit { seed: u64, limit: Duration, pending: usize },
    #[error("seed {seed}: no connection between the hosts: {0}", seed = .1)]
    NoConnection(String, u64),
    #[error("seed {seed}: conservation broken: sent {sent}, delivered {delivered}, dropped {dropped}, in flight {in_flight}")]
    Conservation { seed: u64, sent: u64, delivered: u64, dropped: u64, in_flight: u64 },
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// Outcome of one operation as the submitting side saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub op: OpId,
    pub at: Instant,
    pub result: Result<(), OpError>,
}

/// A receive the far side delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    pub op: OpId,
    pub buffer: RecvBufferId,
    pub len: u64,
    pub imm: Option<u32>,
}

/// Datagram counters of the run (both directions), for the conservation check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WireCounters {
    pub sent: u64,
    pub delivered: u64,
    pub lost: u64,
    pub corrupted: u64,
    pub cut: u64,
    /// Extra copies delivered (network duplicates and replays).
    pub duplicated: u64,
    /// Of those, late verbatim replays (`FaultConfig::replay`).
    pub replayed: u64,
    /// Delivered with a bit flipped past the frame check (`FaultConfig::corrupt_undetected`).
    pub flipped: u64,
    /// Host stalls before a send (`FaultConfig::stall`).
    pub stalls: u64,
}

/// The stale-frame rule of `accord_proto` (crate doc), checked around every replayed
/// datagram: if the receiver counted it stale, nothing else it reports may have moved.
/// `ACCORD_SIM_DIAGNOSE` is set: explain a failed connection on stderr. (`env_is_set` fails
/// only for a name the table lacks, which `accord-knobs`' test of every literal rules out.)
fn diagnose() -> bool {
    accord_knobs::env_is_set("ACCORD_SIM_DIAGNOSE").unwrap_or(false)
}

fn check_stale_frame_rule(before: &ConnectionStats, after: &ConnectionStats) -> Result<(), String> {
    if after.stale_frames == before.stale_frames {
        return Ok(());
    }
    let timing = |s: &ConnectionStats| {
        (s.rtt_min, s.rtt_smoothed, s.packets_lost, s.bytes_acked, s.nacks_received, s.window_bytes)
    };
    let paths = |s: &ConnectionStats| {
        s.paths.iter().map(|p| (p.rto, p.rtt_smoothed, p.quarantined, p.quarantines, p.timeouts)).collect::<Vec<_>>()
    };
    if timing(before) != timing(after) || paths(before) != paths(after) {
        return Err(format!(
            "a stale frame changed state: before {:?} {:?}, after {:?} {:?}",
            timing(before),
            paths(before),
            timing(after),
            paths(after)
        ));
    }
    Ok(())
}

struct Host {
    endpoint: Endpoint,
    memory: SimMemory,
    nic: Nic,
    conn: Option<ConnectionHandle>,
    sources: BTreeMap<OpId, (Rc<Vec<u8>>, usize)>,
    completions: Vec<Completion>,
    imms: Vec<(OpId, u32, u64)>,
    received: Vec<Received>,
    other_events: Vec<Event>,
    timer_at: Option<Instant>,
    timer_generation: u64,
}

enum SimEvent {
    /// `replay`: a verbatim copy delivered long after the original (see
    /// `FaultConfig::replay`); the stale-frame rule is checked on it.
    Deliver {
        to: Side,
        path: PathId,
        datagram: Vec<u8>,
        replay: bool,
    },
    Timer {
        host: Side,
        generation: u64,
    },
    NicDequeued {
        host: Side,
        bytes: u64,
    },
    Cut {
        path: PathId,
        cut: bool,
    },
}

/// The two-host simulation.
pub struct PairSim {
    config: PairConfig,
    hosts: [Host; 2],
    queue: EventQueue<SimEvent>,
    now: Instant,
    rng: ChaCha8Rng,
    cut_paths: BTreeSet<PathId>,
    wire: WireCounters,
    in_flight: u64,
    events_handled: u64,
    buf: Vec<u8>,
}

impl PairSim {
    pub fn new(config: PairConfig) -> Result<Self, SimError> {
        let mut seeds = ChaCha8Rng::seed_from_u64(config.seed);
        use rand::RngCore;
        let make_host = |seed: u64| -> Result<Host, SimError> {
            Ok(Host {
                endpoint: Endpoint::new(config.endpoint.clone(), seed).map_err(|e| SimError::Config(e.to_string()))?,
                memory: SimMemory::new(config.track_placements),
                nic: Nic::default(),
                conn: None,
                sources: BTreeMap::new(),
                completions: vec![],
                imms: vec![],
                received: vec![],
                other_events: vec![],
                timer_at: None,
                timer_generation: 0,
            })
        };
        let hosts = [make_host(seeds.next_u64())?, make_host(seeds.next_u64())?];
        let rng = ChaCha8Rng::seed_from_u64(seeds.next_u64());
        let buf = vec![0u8; config.endpoint.connection.max_datagram_bytes as usize + MAX_ACK_LEN];
        Ok(PairSim {
            config,
            hosts,
            queue: EventQueue::default(),
            now: Instant::ZERO,
            rng,
            cut_paths: BTreeSet::new(),
            wire: WireCounters::default(),
            in_flight: 0,
            events_handled: 0,
            buf,
        })
    }

    pub fn seed(&self) -> u64 {
        self.config.seed
    }

    pub fn now(&self) -> Instant {
        self.now
    }

    /// Opens the connection from A to B and runs until both sides have it.
    pub fn connect(&mut self) -> Result<(), SimError> {
        let conn = self.hosts[0]
            .endpoint
            .connect(self.now)
            .map_err(|e| SimError::NoConnection(e.to_string(), self.config.seed))?;
        self.hosts[0].conn = Some(conn);
        self.drive(Side::A);
        let deadline = self.now + Duration::from_secs(1);
        while !(self.established(Side::A) && self.hosts[1].conn.is_some()) {
            if !self.step()? || self.now > deadline {
                return Err(SimError::NoConnection("handshake did not finish".into(), self.config.seed));
            }
        }
        Ok(())
    }

    fn established(&self, side: Side) -> bool {
        let h = &self.hosts[side.index()];
        h.conn.is_some_and(|c| h.endpoint.is_established(c))
    }

    pub fn memory(&self, side: Side) -> &SimMemory {
        &self.hosts[side.index()].memory
    }

    pub fn memory_mut(&mut self, side: Side) -> &mut SimMemory {
        &mut self.hosts[side.index()].memory
    }

    pub fn register(&mut self, side: Side, id: RegionId, key: RegionKey, len: usize) {
        self.hosts[side.index()].memory.register(id, key, len);
    }

    pub fn post_recv(&mut self, side: Side, len: usize) -> RecvBufferId {
        self.hosts[side.index()].memory.post_recv(len)
    }

    fn conn(&self, side: Side) -> Result<ConnectionHandle, SubmitError> {
        self.hosts[side.index()].conn.ok_or(SubmitError::UnknownConnection)
    }

    /// A one-sided write from `from`: bytes `source[offset..offset + req.len]`.
    pub fn write(
        &mut self,
        from: Side,
        source: Rc<Vec<u8>>,
        offset: usize,
        req: WriteRequest,
    ) -> Result<OpId, SubmitError> {
        assert!(offset + req.len as usize <= source.len(), "test bug: source too short");
        let conn = self.conn(from)?;
        let host = &mut self.hosts[from.index()];
        let op = host.endpoint.write(conn, req)?;
        host.sources.insert(op, (source, offset));
        self.drive(from);
        Ok(op)
    }

    /// A two-sided send from `from` of all of `source`.
    pub fn send(&mut self, from: Side, source: Rc<Vec<u8>>, imm: Option<u32>) -> Result<OpId, SubmitError> {
        let conn = self.conn(from)?;
        let host = &mut self.hosts[from.index()];
        let op = host.endpoint.send(conn, SendRequest { len: source.len() as u64, imm, tag: 0 })?;
        host.sources.insert(op, (source, 0));
        self.drive(from);
        Ok(op)
    }

    /// Cuts (or restores) a path in both directions at `at`.
    pub fn schedule_cut(&mut self, at: Instant, path: PathId, cut: bool) {
        self.queue.push(at, SimEvent::Cut { path, cut });
    }

    pub fn completions(&self, side: Side) -> &[Completion] {
        &self.hosts[side.index()].completions
    }

    /// Immediates the side received: (operation, immediate, tag).
    pub fn imms(&self, side: Side) -> &[(OpId, u32, u64)] {
        &self.hosts[side.index()].imms
    }

    pub fn received(&self, side: Side) -> &[Received] {
        &self.hosts[side.index()].received
    }

    pub fn other_events(&self, side: Side) -> &[Event] {
        &self.hosts[side.index()].other_events
    }

    /// The protocol's own dump of one side's connection (see `Endpoint::diagnose`).
    pub fn diagnose(&self, side: Side) -> Option<String> {
        let h = &self.hosts[side.index()];
        h.endpoint.diagnose(h.conn?)
    }

    pub fn connection_stats(&self, side: Side) -> Option<ConnectionStats> {
        let h = &self.hosts[side.index()];
        h.endpoint.connection_stats(h.conn?)
    }

    pub fn wire(&self) -> &WireCounters {
        &self.wire
    }

    pub fn events_handled(&self) -> u64 {
        self.events_handled
    }

    /// Operations submitted and not completed, both sides.
    pub fn pending_ops(&self) -> usize {
        self.hosts.iter().map(|h| h.sources.len()).sum()
    }

    /// Runs until every submitted operation completed.
    pub fn run_until_complete(&mut self) -> Result<(), SimError> {
        let limit = Instant::ZERO + self.config.time_limit;
        while self.pending_ops() > 0 {
            if self.now > limit || !self.step()? {
                return Err(SimError::TimeLimit {
                    seed: self.config.seed,
                    limit: self.config.time_limit,
                    pending: self.pending_ops(),
                });
            }
        }
        Ok(())
    }

    /// Runs until virtual time `until` (events at exactly `until` included).
    pub fn run_until(&mut self, until: Instant) -> Result<(), SimError> {
        while self.queue.peek_time().is_some_and(|t| t <= until) {
            self.step()?;
        }
        self.now = self.now.max(until);
        Ok(())
    }

    /// Handles one event. Returns false when nothing is left to do.
    pub fn step(&mut self) -> Result<bool, SimError> {
        let Some((at, event)) = self.queue.pop() else { return Ok(false) };
        debug_assert!(at >= self.now, "time went backwards");
        self.now = at;
        self.events_handled += 1;
        match event {
            SimEvent::Deliver { to, path, datagram, replay } => {
                self.in_flight -= 1;
                self.wire.delivered += 1;
                let host = &mut self.hosts[to.index()];
                let rx = RxMeta { path, ecn_ce: false };
                let before = if replay { host.conn.and_then(|c| host.endpoint.connection_stats(c)) } else { None };
                let outcome = host.endpoint.handle_datagram(at, rx, &datagram, &mut host.memory);
                let after = before.as_ref().and(host.conn).and_then(|c| host.endpoint.connection_stats(c));
                if let (Some(before), Some(after)) = (&before, &after) {
                    check_stale_frame_rule(before, after).map_err(|what| SimError::Invariant {
                        seed: self.config.seed,
                        at_ns: at.as_nanos(),
                        what,
                    })?;
                }
                let host = &mut self.hosts[to.index()];
                if let Some(placement) = &outcome.placement {
                    host.memory.place(placement, &datagram);
                }
                if host.conn.is_none() {
                    host.conn = outcome.conn;
                }
                self.drive(to);
            }
            SimEvent::Timer { host, generation } => {
                let h = &mut self.hosts[host.index()];
                if generation == h.timer_generation {
                    h.timer_at = None;
                    h.endpoint.handle_timeout(at);
                    self.drive(host);
                }
            }
            SimEvent::NicDequeued { host, bytes } => {
                self.hosts[host.index()].nic.dequeued(bytes);
                self.drive(host);
            }
            SimEvent::Cut { path, cut } => {
                if cut {
                    self.cut_paths.insert(path);
                } else {
                    self.cut_paths.remove(&path);
                }
            }
        }
        if self.config.check_invariants {
            self.check_invariants()?;
        }
        Ok(true)
    }

    fn check_invariants(&self) -> Result<(), SimError> {
        for h in &self.hosts {
            h.endpoint.check_invariants().map_err(|what| SimError::Invariant {
                seed: self.config.seed,
                at_ns: self.now.as_nanos(),
                what,
            })?;
        }
        let w = &self.wire;
        let dropped = w.lost + w.corrupted + w.cut;
        if w.sent + w.duplicated != w.delivered + dropped + self.in_flight {
            return Err(SimError::Conservation {
                seed: self.config.seed,
                sent: w.sent + w.duplicated,
                delivered: w.delivered,
                dropped,
                in_flight: self.in_flight,
            });
        }
        Ok(())
    }

    /// The driver loop for one host: transmit while the NIC has room, collect events, re-arm
    /// the timer.
    fn drive(&mut self, side: Side) {
        let now = self.now;
        loop {
            let host = &mut self.hosts[side.index()];
            if host.nic.queued_bytes() >= self.config.link.nic_queue_bytes_max {
                break;
            }
            let Some(t) = host.endpoint.poll_transmit(now, &mut self.buf) else { break };
            let mut datagram = Vec::with_capacity(t.datagram_len());
            datagram.extend_from_slice(&self.buf[..t.header_len]);
            if let Some(p) = t.payload {
                let (source, base) = host.sources.get(&p.op).expect("transmit names a submitted operation");
                let start = base + p.offset as usize;
                datagram.extend_from_slice(&source[start..start + p.len as usize]);
            }
            datagram.resize(t.datagram_len(), 0); // room for a MAC trailer, if the mode adds one
            t.seal_payload(&mut datagram);
            let bytes = datagram.len() as u64;
            if let Some(pause) = self.config.faults.decide_stall(&mut self.rng) {
                host.nic.stall(now, pause);
                self.wire.stalls += 1;
            }
            let departs = host.nic.enqueue(now, bytes, &self.config.link);
            self.queue.push(departs, SimEvent::NicDequeued { host: side, bytes });
            self.wire.sent += 1;
            if self.cut_paths.contains(&t.path) {
                self.wire.cut += 1;
                continue;
            }
            match self.config.faults.decide(&mut self.rng) {
                Fate::Lost => self.wire.lost += 1,
                Fate::Corrupted => self.wire.corrupted += 1,
                Fate::Deliver(delays) => {
                    if let Some(bit) = self.config.faults.decide_undetected_flip(&mut self.rng, datagram.len()) {
                        datagram[bit / 8] ^= 1 << (bit % 8);
                        self.wire.flipped += 1;
                    }
                    self.wire.duplicated += delays.len() as u64 - 1;
                    let arrive = departs + self.config.link.propagation;
                    let last = delays.len() - 1;
                    if let Some(later) = self.config.faults.decide_replay(&mut self.rng) {
                        self.wire.duplicated += 1;
                        self.wire.replayed += 1;
                        self.in_flight += 1;
                        let copy = datagram.clone();
                        let to = side.other();
                        self.queue
                            .push(arrive + later, SimEvent::Deliver { to, path: t.path, datagram: copy, replay: true });
                    }
                    for (i, extra) in delays.iter().enumerate() {
                        let copy = if i == last { std::mem::take(&mut datagram) } else { datagram.clone() };
                        self.in_flight += 1;
                        self.queue.push(
                            arrive + *extra,
                            SimEvent::Deliver { to: side.other(), path: t.path, datagram: copy, replay: false },
                        );
                    }
                }
            }
        }
        let host = &mut self.hosts[side.index()];
        while let Some(event) = host.endpoint.poll_event() {
            match event {
                Event::OpCompleted { op, result, .. } => {
                    host.sources.remove(&op);
                    host.completions.push(Completion { op, at: now, result });
                }
                Event::ImmReceived { op, imm, tag, .. } => host.imms.push((op, imm, tag)),
                Event::RecvCompleted { op, buffer, len, imm, .. } => {
                    host.received.push(Received { op, buffer, len, imm })
                }
                Event::Accepted { conn } => {
                    host.conn.get_or_insert(conn);
                    host.other_events.push(event);
                }
                Event::ConnectionFailed { conn, .. } if diagnose() => {
                    eprintln!(
                        "{side:?} at {} ns: connection failed: {:?}",
                        now.as_nanos(),
                        host.endpoint.diagnose(conn)
                    );
                    host.other_events.push(event);
                }
                other => host.other_events.push(other),
            }
        }
        let nic_full = host.nic.queued_bytes() >= self.config.link.nic_queue_bytes_max;
        if let Some(due) = host.endpoint.poll_timeout() {
            // With the NIC full, a due ACK waits for the NIC, which wakes the host itself.
            if (due > now || !nic_full) && host.timer_at != Some(due) {
                host.timer_generation += 1;
                host.timer_at = Some(due);
                let generation = host.timer_generation;
                self.queue.push(due.max(now), SimEvent::Timer { host: side, generation });
            }
        }
    }
}
