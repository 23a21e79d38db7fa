//! The fabric simulator: N hosts running `accord-proto` endpoints over switches and links.
//!
//! The driver loop per host is `crate::pair`'s, generalised: after each input the host counts
//! the placement, hands datagrams to its NIC while the NIC backlog is under
//! [`FabricConfig::nic_queue_bytes_max`], collects events and re-arms its timer. When the NIC is
//! full the host sleeps until the backlog has halved (one wake-up per several packets).
//!
//! With [`FabricConfig::rx_batch`] set, a host models receive interrupt moderation (or a
//! busy-polling worker that handles a batch per loop, DESIGN §4): each datagram is handled and
//! placed on arrival, but the rest of the driver loop (transmit, events, timer) runs once per
//! batch window instead of once per datagram. Zero (the default) drives after every datagram.
//!
//! Events are ordered by (time, sequence); only the head of each port's wire has an event
//! ([`super::port`]), plus at most one live timer and one NIC wake-up per host, so the event
//! queue holds O(ports + hosts) entries whatever the load.

use super::memory::CountingMemory;
use super::packet::{PacketPool, RxBuffer};
use super::port::{Admission, Picos, Port, PortCounters, QueueConfig};
use super::topology::{ecmp_hash, mix64, LinkSpec, Topology, TopologyError, TopologyKind};
use super::workload::{FlowClass, FlowSpec};
use crate::events::EventQueue;
use accord_proto::wire::MAX_ACK_LEN;
use accord_proto::{
    ConnectionId, Endpoint, EndpointConfig, Event, Instant, OpId, PathId, RegionId, RegionKey, RxMeta, WriteRequest,
};
use core::time::Duration;
use std::collections::BTreeMap;

/// Events allowed at one virtual instant before the run is declared livelocked.
pub const SAME_INSTANT_EVENTS_MAX: u64 = 50_000_000;

/// Everything a fabric run depends on.
#[derive(Clone, Debug)]
pub struct FabricConfig {
    /// Every random stream (workload, tokens, path picks, ECMP salts, RED) derives from this.
    pub seed: u64,
    pub topology: TopologyKind,
    pub hosts: u32,
    pub link: LinkSpec,
    /// Switch output queues (host NICs are bounded by `nic_queue_bytes_max` instead).
    pub queue: QueueConfig,
    pub endpoint: EndpointConfig,
    /// Bytes a host lets queue in its NIC before it stops polling the protocol.
    pub nic_queue_bytes_max: u64,
    /// Receive batching window: after a datagram, the host's transmit/event/timer steps run
    /// at most this much later, once for every datagram in the window. Default zero (exact,
    /// per datagram).
    pub rx_batch: Duration,
    /// Check conservation and the touched endpoint's invariants after every event.
    pub check_invariants: bool,
    /// Record every placement to prove each byte landed exactly once (tests).
    pub track_placements: bool,
    /// Virtual time after which an unfinished run fails.
    pub time_limit: Duration,
}

impl FabricConfig {
    /// A fabric of `hosts` hosts at `link`, with endpoint timers scaled to its base RTT and
    /// ECN-marking switch queues of 100 full packets.
    pub fn new(seed: u64, topology: TopologyKind, hosts: u32, link: LinkSpec) -> Self {
        // The fabric carries payloads as lengths, not bytes: the end-to-end check covers the
        // headers (what trimming and marking rewrite is outside it, being the payload).
        let mut endpoint = EndpointConfig { integrity: accord_proto::wire::Integrity::Header, ..Default::default() };
        let c = &mut endpoint.connection;
        let mtu_wire = c.max_datagram_bytes as u64 + crate::link::FRAMING_BYTES;
        let base_rtt = Self::base_rtt_for(Self::hops_for(topology), link, mtu_wire);
        c.initial_rtt = base_rtt;
        c.rto_min = (base_rtt * 8).max(Duration::from_micros(50));
        c.rto_max = Duration::from_millis(10);
        c.probe_interval = Duration::from_micros(200);
        c.idle_timeout = Duration::from_secs(1);
        let capacity = 100 * mtu_wire;
        // One endpoint per NIC: its credit pacer (EQDS) grants at this NIC's line rate.
        endpoint.credit.line_rate_bytes_per_sec = link.rate_bps / 8;
        endpoint.credit.wire_overhead_bytes_per_packet =
            accord_proto::wire::DATA_HEADER_LEN as u32 + crate::link::FRAMING_BYTES as u32;
        FabricConfig {
            seed,
            topology,
            hosts,
            link,
            queue: QueueConfig::ecn(capacity, capacity / 5, capacity * 4 / 5),
            endpoint,
            nic_queue_bytes_max: 16 * mtu_wire,
            rx_batch: Duration::ZERO,
            check_invariants: false,
            track_placements: false,
            time_limit: Duration::from_secs(2),
        }
    }

    /// Links on the longest host-to-host route of `topology` (one way).
    pub fn hops_for(topology: TopologyKind) -> u32 {
        match topology {
            TopologyKind::Pair => 1,
            TopologyKind::Star => 2,
            TopologyKind::Dumbbell | TopologyKind::FatTree2 => 4,
            TopologyKind::FatTree3 => 6,
        }
    }

    /// Round trip over `hops` links each way with one full packet serialised per hop.
    pub fn base_rtt_for(hops: u32, link: LinkSpec, packet_wire_bytes: u64) -> Duration {
        let ser_ns = packet_wire_bytes * 8 * 1_000_000_000 / link.rate_bps.max(1);
        (link.latency + Duration::from_nanos(ser_ns)) * hops * 2
    }
}

/// Why a run failed. Each names the seed that reproduces it.
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("seed {seed}: invariant broken at {at_ns} ns on host {host}: {what}")]
    Invariant { seed: u64, at_ns: u64, host: u32, what: String },
    #[error("seed {seed}: conservation broken at {at_ns} ns: {counters:?}, in flight {in_flight}")]
    Conservation { seed: u64, at_ns: u64, counters: FabricCounters, in_flight: u64 },
    #[error("seed {seed}: {pending} flows unfinished at the virtual time limit {limit:?}; first: {stuck}")]
    TimeLimit { seed: u64, limit: Duration, pending: usize, stuck: String },
    #[error("seed {seed}: more than {SAME_INSTANT_EVENTS_MAX} events at {at_ns} ns: livelock")]
    Livelock { seed: u64, at_ns: u64 },
    #[error("seed {seed}: flow {flow} ({src} -> {dst}): {what}")]
    Flow { seed: u64, flow: u32, src: u32, dst: u32, what: String },
}

/// Datagram counters of the whole fabric, for the conservation check:
/// `sent == delivered + dropped + trimmed_delivered + in flight`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FabricCounters {
    pub sent: u64,
    pub delivered: u64,
    pub dropped: u64,
    /// Trimmed headers that reached their receiver (handed to the endpoint, which NACKs them).
    pub trimmed_delivered: u64,
    /// Packets trimmed by queues.
    pub trims: u64,
    pub ecn_marks: u64,
    /// Data packets given to endpoints (subset of `delivered`).
    pub data_delivered: u64,
    /// Transmits for a connection whose peer host is unknown (a driver bug: always zero).
    pub unroutable: u64,
    pub timers_fired: u64,
    pub nic_wakes: u64,
    pub connection_failures: u64,
}

/// How one flow went.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowResult {
    pub src: u32,
    pub dst: u32,
    pub bytes: u64,
    pub class: FlowClass,
    pub start: Duration,
    /// Submission to the sender's completion (every packet acknowledged).
    pub fct: Duration,
    /// Submission to the receiver's immediate (every byte placed).
    pub receive_time: Duration,
    /// Line-rate serialisation of the payload alone: no FCT can be shorter.
    pub ideal: Duration,
}

impl FlowResult {
    /// FCT divided by the ideal.
    pub fn slowdown(&self) -> f64 {
        self.fct.as_secs_f64() / self.ideal.as_secs_f64().max(1e-12)
    }
}

/// What a finished run produced.
#[derive(Clone, Debug)]
pub struct FabricReport {
    pub flows: Vec<FlowResult>,
    pub counters: FabricCounters,
    /// Port counters summed over switch ports.
    pub switch_ports: PortCounters,
    pub events: u64,
    pub virtual_time: Duration,
    pub wall: std::time::Duration,
    /// Most packets in the fabric at once.
    pub packets_live_max: u64,
    /// Hash over every flow's completion times and the counters: same seed, same hash.
    pub hash: u64,
}

#[derive(Copy, Clone, Debug)]
enum Ev {
    /// The head `packet` of `port`'s wire reaches the far end (the event names the packet so
    /// that its line and the port's are fetched together).
    Arrive {
        port: u32,
        packet: u32,
    },
    PriorityArrive {
        port: u32,
        packet: u32,
    },
    Timer {
        host: u32,
        generation: u32,
    },
    NicWake {
        host: u32,
    },
    /// The end of a receive batch window.
    RxBatch {
        host: u32,
    },
    FlowStart {
        flow: u32,
    },
}

struct Host {
    endpoint: Endpoint,
    memory: CountingMemory,
    /// Peer host of every connection.
    peers: BTreeMap<ConnectionId, u32>,
    /// Our connection to each destination host, one per flow class (an application keeps its
    /// latency-sensitive messages off the connection its bulk transfer queues on).
    conns: BTreeMap<(u32, FlowClass), ConnectionId>,
    /// Flow of each outstanding write.
    ops: BTreeMap<(ConnectionId, OpId), u32>,
    timer_at: Option<Instant>,
    timer_generation: u32,
    wake_pending: bool,
    rx_batch_pending: bool,
}

struct FlowState {
    spec: FlowSpec,
    key: RegionKey,
    started: Option<Instant>,
    sent_done: Option<Instant>,
    received_done: Option<Instant>,
    error: Option<String>,
}

/// The network half: ports, packets, events, clock.
struct Net {
    topo: Topology,
    ports: Vec<Port>,
    salts: Vec<u64>,
    pool: PacketPool,
    queue: EventQueue<Ev>,
    now: Instant,
    rng_state: u64,
    counters: FabricCounters,
}

impl Net {
    fn now_ps(&self) -> Picos {
        self.now.as_nanos() * 1000
    }

    fn uniform(&mut self) -> f64 {
        self.rng_state = self.rng_state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        (mix64(self.rng_state) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn send(&mut self, port: u32, packet: u32, priority: bool) {
        let now_ps = self.now_ps();
        let wire_bytes = self.pool.get(packet).wire_bytes();
        if let Some(at) = self.ports[port as usize].transmit(now_ps, packet, wire_bytes, priority, &mut self.pool) {
            let ev = if priority { Ev::PriorityArrive { port, packet } } else { Ev::Arrive { port, packet } };
            self.queue.push(Instant::from_nanos(at), ev);
        }
    }

    /// A packet reached switch `node`: pick the output by ECMP, apply the queue policy.
    fn forward(&mut self, node: u32, packet: u32) {
        let p = self.pool.get(packet);
        let hops = self.topo.next_hops(node, p.dst);
        let port = if hops.len() == 1 {
            hops[0]
        } else {
            let salt = self.salts[(node - self.topo.hosts()) as usize];
            hops[(ecmp_hash(p.src, p.dst, p.path, salt) % hops.len() as u64) as usize]
        };
        let (wire_bytes, data, ecn_capable, trimmed) = (p.wire_bytes(), p.payload_len > 0, p.ecn_capable, p.trimmed);
        let now_ps = self.now_ps();
        // Trimming switches also put control packets (no payload) in the header lane.
        let control = !data && !trimmed && self.ports[port as usize].prioritises_headers();
        if trimmed || control {
            if self.ports[port as usize].admit_header(now_ps) {
                self.send(port, packet, true);
            } else {
                self.ports[port as usize].counters.drops += 1;
                self.counters.dropped += 1;
                self.pool.free(packet);
            }
            return;
        }
        let uniform = self.uniform();
        match self.ports[port as usize].admit(now_ps, wire_bytes, data, ecn_capable, uniform) {
            Admission::Queue { mark_ce } => {
                if mark_ce {
                    self.pool.get_mut(packet).ecn_ce = true;
                    self.ports[port as usize].counters.ecn_marks += 1;
                    self.counters.ecn_marks += 1;
                }
                self.send(port, packet, false);
            }
            Admission::Trim => {
                let p = self.pool.get_mut(packet);
                p.payload_len = 0;
                p.trimmed = true;
                self.ports[port as usize].counters.trims += 1;
                self.counters.trims += 1;
                self.send(port, packet, true);
            }
            Admission::Drop => {
                self.ports[port as usize].counters.drops += 1;
                self.counters.dropped += 1;
                self.pool.free(packet);
            }
        }
    }
}

/// The fabric simulation. Build with [`FabricSim::new`], then [`FabricSim::run`].
/// Events between two calls of [`FabricSim::run_reporting`]'s callback.
pub const PROGRESS_EVERY_STEPS: u64 = 1 << 18;

pub struct FabricSim {
    config: FabricConfig,
    hosts: Vec<Host>,
    net: Net,
    flows: Vec<FlowState>,
    flows_pending: usize,
    tx_buf: Vec<u8>,
    rx: RxBuffer,
    events: u64,
    same_instant_events: u64,
}

impl FabricSim {
    /// Builds the topology, the hosts and the flows (registering each flow's region at its
    /// receiver). Flows start at their `start` when the run begins.
    pub fn new(config: FabricConfig, flows: Vec<FlowSpec>) -> Result<Self, FabricError> {
        config.endpoint.connection.validate().map_err(|e| FabricError::Config(e.to_string()))?;
        if flows.len() > u32::MAX as usize {
            return Err(FabricError::Config("more than 2^32 flows".into()));
        }
        if config.link.latency.as_nanos() > u32::MAX as u128 {
            return Err(FabricError::Config(format!("link latency {:?} above 4.29 s", config.link.latency)));
        }
        let topo = Topology::build(config.topology, config.hosts, config.link)?;
        let mut seeds = config.seed;
        let mut next_seed = || {
            seeds = seeds.wrapping_add(0x9e37_79b9_7f4a_7c15);
            mix64(seeds)
        };
        let ports = topo
            .ports()
            .iter()
            .map(|p| {
                let queue = if topo.is_host(p.from) {
                    QueueConfig::drop_tail(u64::MAX / 2) // bounded by nic_queue_bytes_max instead
                } else {
                    config.queue
                };
                Port::new(p.to, p.rate_bps, p.latency, queue)
            })
            .collect();
        let salts = (0..topo.switches()).map(|_| next_seed()).collect();
        let mut hosts = Vec::with_capacity(config.hosts as usize);
        for _ in 0..config.hosts {
            hosts.push(Host {
                endpoint: Endpoint::new(config.endpoint.clone(), next_seed())
                    .map_err(|e| FabricError::Config(e.to_string()))?,
                memory: CountingMemory::new(config.track_placements),
                peers: BTreeMap::new(),
                conns: BTreeMap::new(),
                ops: BTreeMap::new(),
                timer_at: None,
                timer_generation: 0,
                wake_pending: false,
                rx_batch_pending: false,
            });
        }
        let mut states = Vec::with_capacity(flows.len());
        for (i, spec) in flows.into_iter().enumerate() {
            if spec.src >= config.hosts || spec.dst >= config.hosts || spec.src == spec.dst || spec.bytes == 0 {
                return Err(FabricError::Config(format!("flow {i}: bad endpoints or size: {spec:?}")));
            }
            let key = RegionKey(next_seed() | 1);
            hosts[spec.dst as usize].memory.register(RegionId(i as u32), key, spec.bytes);
            states.push(FlowState { spec, key, started: None, sent_done: None, received_done: None, error: None });
        }
        let datagram_max = config.endpoint.connection.max_datagram_bytes as usize + MAX_ACK_LEN;
        let mut queue = EventQueue::default();
        for (i, f) in states.iter().enumerate() {
            queue.push(Instant::ZERO + f.spec.start, Ev::FlowStart { flow: i as u32 });
        }
        let net = Net {
            topo,
            ports,
            salts,
            pool: PacketPool::default(),
            queue,
            now: Instant::ZERO,
            rng_state: next_seed(),
            counters: FabricCounters::default(),
        };
        Ok(FabricSim {
            flows_pending: states.len(),
            flows: states,
            hosts,
            net,
            tx_buf: vec![0; datagram_max],
            rx: RxBuffer::new(datagram_max),
            events: 0,
            same_instant_events: 0,
            config,
        })
    }

    /// The topology being simulated.
    pub fn topology(&self) -> &Topology {
        &self.net.topo
    }

    /// Fabric-wide datagram counters so far.
    pub fn counters(&self) -> &FabricCounters {
        &self.net.counters
    }

    /// Runs until every flow completed, then checks the end-of-run oracles: every flow
    /// succeeded, every byte was placed exactly once, no FCT below its ideal.
    pub fn run(&mut self) -> Result<FabricReport, FabricError> {
        self.run_reporting(|_, _| {})
    }

    /// As [`FabricSim::run`], calling `progress(flows done, flows in all)` every
    /// [`PROGRESS_EVERY_STEPS`] events, so a long run can tell a person how far it got. The
    /// callback sees counts only: it cannot change the (deterministic) run.
    pub fn run_reporting(&mut self, mut progress: impl FnMut(usize, usize)) -> Result<FabricReport, FabricError> {
        let wall = std::time::Instant::now();
        let limit = Instant::ZERO + self.config.time_limit;
        let mut until_report = PROGRESS_EVERY_STEPS;
        while self.flows_pending > 0 {
            until_report -= 1;
            if until_report == 0 {
                until_report = PROGRESS_EVERY_STEPS;
                progress(self.flows.len() - self.flows_pending, self.flows.len());
            }
            if !self.step()? || self.net.now > limit {
                return Err(FabricError::TimeLimit {
                    seed: self.config.seed,
                    limit: self.config.time_limit,
                    pending: self.flows_pending,
                    stuck: self.describe_unfinished(4),
                });
            }
        }
        let wall = wall.elapsed();
        self.check_conservation()?;
        let flows = self.finish_flows()?;
        let mut switch_ports = PortCounters::default();
        for (spec, port) in self.net.topo.ports().iter().zip(&self.net.ports) {
            if !self.net.topo.is_host(spec.from) {
                let c = &port.counters;
                switch_ports.packets += c.packets;
                switch_ports.bytes += c.bytes;
                switch_ports.drops += c.drops;
                switch_ports.ecn_marks += c.ecn_marks;
                switch_ports.trims += c.trims;
                switch_ports.backlog_bytes_max = switch_ports.backlog_bytes_max.max(c.backlog_bytes_max);
            }
        }
        let c = &self.net.counters;
        let mut hash = mix64(self.config.seed);
        for f in &flows {
            hash = mix64(hash ^ f.fct.as_nanos() as u64);
            hash = mix64(hash ^ f.receive_time.as_nanos() as u64);
        }
        for v in [c.sent, c.delivered, c.dropped, c.trimmed_delivered, c.trims, c.ecn_marks, self.events] {
            hash = mix64(hash ^ v);
        }
        Ok(FabricReport {
            flows,
            counters: c.clone(),
            switch_ports,
            events: self.events,
            virtual_time: self.net.now - Instant::ZERO,
            wall,
            packets_live_max: self.net.pool.live_max(),
            hash,
        })
    }

    /// Up to `count` unfinished flows with their sender connection's state, for diagnosis.
    fn describe_unfinished(&self, count: usize) -> String {
        let mut out = Vec::new();
        for (i, f) in self.flows.iter().enumerate().filter(|(_, f)| f.sent_done.is_none()).take(count) {
            let placed =
                self.hosts[f.spec.dst as usize].memory.region(RegionId(i as u32)).map_or(0, |r| r.bytes_placed);
            let src = &self.hosts[f.spec.src as usize];
            let stats = src.conns.get(&(f.spec.dst, f.spec.class)).and_then(|&c| src.endpoint.connection_stats(c));
            let conn = match stats {
                Some(s) => format!(
                    "cc {} window {} in flight {} sent {} retransmitted {} lost {} acked {} srtt {:?} quarantined paths {}",
                    s.cc,
                    s.window_bytes,
                    s.bytes_in_flight,
                    s.packets_sent,
                    s.packets_retransmitted,
                    s.packets_lost,
                    s.bytes_acked,
                    s.rtt_smoothed,
                    s.paths.iter().filter(|p| p.quarantined).count()
                ),
                None => "no connection".into(),
            };
            out.push(format!("flow {i} {}->{} placed {}/{}: {conn}", f.spec.src, f.spec.dst, placed, f.spec.bytes));
        }
        out.join("; ")
    }

    fn finish_flows(&self) -> Result<Vec<FlowResult>, FabricError> {
        let rate = self.config.link.rate_bps.max(1) as u128;
        let mut out = Vec::with_capacity(self.flows.len());
        for (i, f) in self.flows.iter().enumerate() {
            let fail = |what: String| FabricError::Flow {
                seed: self.config.seed,
                flow: i as u32,
                src: f.spec.src,
                dst: f.spec.dst,
                what,
            };
            if let Some(e) = &f.error {
                return Err(fail(e.clone()));
            }
            let (Some(start), Some(done), Some(received)) = (f.started, f.sent_done, f.received_done) else {
                return Err(fail("did not complete at both ends".into()));
            };
            let region = self.hosts[f.spec.dst as usize].memory.region(RegionId(i as u32));
            region.ok_or_else(|| fail("region missing".into()))?.check_exactly_once().map_err(fail)?;
            let ideal = Duration::from_nanos((f.spec.bytes as u128 * 8 * 1_000_000_000 / rate) as u64);
            let result = FlowResult {
                src: f.spec.src,
                dst: f.spec.dst,
                bytes: f.spec.bytes,
                class: f.spec.class,
                start: start - Instant::ZERO,
                fct: done - start,
                receive_time: received - start,
                ideal,
            };
            if result.fct < ideal || result.receive_time < ideal {
                return Err(fail(format!("completed faster than line rate: {result:?}")));
            }
            out.push(result);
        }
        Ok(out)
    }

    fn check_conservation(&self) -> Result<(), FabricError> {
        let c = &self.net.counters;
        let in_flight = self.net.pool.live();
        if c.sent != c.delivered + c.dropped + c.trimmed_delivered + in_flight || c.unroutable != 0 {
            return Err(FabricError::Conservation {
                seed: self.config.seed,
                at_ns: self.net.now.as_nanos(),
                counters: c.clone(),
                in_flight,
            });
        }
        Ok(())
    }

    /// Handles one event. Returns false when nothing is left.
    fn step(&mut self) -> Result<bool, FabricError> {
        let Some((at, ev)) = self.net.queue.pop() else { return Ok(false) };
        debug_assert!(at >= self.net.now, "time went backwards");
        if at == self.net.now {
            self.same_instant_events += 1;
            if self.same_instant_events > SAME_INSTANT_EVENTS_MAX {
                return Err(FabricError::Livelock { seed: self.config.seed, at_ns: at.as_nanos() });
            }
        } else {
            self.same_instant_events = 0;
        }
        self.net.now = at;
        self.events += 1;
        // Start loading the next arrival's port and packet lines now, so that their misses
        // overlap this event's work instead of stalling the next one (a plain load: the value
        // is unused, `black_box` keeps it).
        if let Some(&(Ev::Arrive { port, packet } | Ev::PriorityArrive { port, packet })) = self.net.queue.peek() {
            core::hint::black_box(self.net.ports[port as usize].to);
            core::hint::black_box(self.net.pool.get(packet).next);
        }
        let touched = match ev {
            Ev::Arrive { port, packet } | Ev::PriorityArrive { port, packet } => {
                let priority = matches!(ev, Ev::PriorityArrive { .. });
                let p = &mut self.net.ports[port as usize];
                if let Some((next, next_ns)) = p.arrive(packet, priority, &mut self.net.pool) {
                    debug_assert!(next_ns >= at.as_nanos(), "wire arrival times decrease");
                    let ev = if priority {
                        Ev::PriorityArrive { port, packet: next }
                    } else {
                        Ev::Arrive { port, packet: next }
                    };
                    self.net.queue.push(Instant::from_nanos(next_ns), ev);
                }
                let node = p.to;
                if self.net.topo.is_host(node) {
                    self.deliver(node, packet);
                    Some(node)
                } else {
                    self.net.forward(node, packet);
                    None
                }
            }
            Ev::Timer { host, generation } => {
                let h = &mut self.hosts[host as usize];
                if generation == h.timer_generation && h.timer_at.is_some() {
                    h.timer_at = None;
                    if h.endpoint.poll_timeout().is_some_and(|due| due <= at) {
                        self.net.counters.timers_fired += 1;
                        h.endpoint.handle_timeout(at);
                        self.drive(host);
                    } else {
                        self.arm_timer(host);
                    }
                    Some(host)
                } else {
                    None
                }
            }
            Ev::RxBatch { host } => {
                self.hosts[host as usize].rx_batch_pending = false;
                self.drive(host);
                Some(host)
            }
            Ev::NicWake { host } => {
                self.hosts[host as usize].wake_pending = false;
                self.net.counters.nic_wakes += 1;
                self.drive(host);
                Some(host)
            }
            Ev::FlowStart { flow } => {
                let src = self.flows[flow as usize].spec.src;
                self.start_flow(flow)?;
                Some(src)
            }
        };
        if self.config.check_invariants {
            self.check_conservation()?;
            if let Some(host) = touched {
                self.hosts[host as usize].endpoint.check_invariants().map_err(|what| FabricError::Invariant {
                    seed: self.config.seed,
                    at_ns: at.as_nanos(),
                    host,
                    what,
                })?;
            }
        }
        Ok(true)
    }

    fn start_flow(&mut self, flow: u32) -> Result<(), FabricError> {
        let now = self.net.now;
        let f = &mut self.flows[flow as usize];
        let (src, dst) = (f.spec.src, f.spec.dst);
        let host = &mut self.hosts[src as usize];
        let config_error = |e: String| FabricError::Flow { seed: self.config.seed, flow, src, dst, what: e };
        let class = f.spec.class;
        let conn = match host.conns.get(&(dst, class)) {
            Some(&c) => c,
            None => {
                let c = host.endpoint.connect(now).map_err(|e| config_error(e.to_string()))?;
                host.conns.insert((dst, class), c);
                host.peers.insert(c, dst);
                c
            }
        };
        let req =
            WriteRequest { region: RegionId(flow), key: f.key, offset: 0, len: f.spec.bytes, imm: Some(flow), tag: 0 };
        let op = host.endpoint.write(conn, req).map_err(|e| config_error(e.to_string()))?;
        host.ops.insert((conn, op), flow);
        f.started = Some(now);
        self.drive(src);
        Ok(())
    }

    /// A packet reached host `host`.
    fn deliver(&mut self, host: u32, packet: u32) {
        let net = &mut self.net;
        let p = *net.pool.get(packet);
        let h = &mut self.hosts[host as usize];
        let rx = RxMeta { path: PathId(p.path), ecn_ce: p.ecn_ce };
        if p.trimmed {
            // Only the header arrived: the endpoint's trimmed entry point NACKs it and never
            // places anything (the bytes here are exactly the header the sender emitted).
            net.counters.trimmed_delivered += 1;
            let outcome = h.endpoint.handle_trimmed_datagram(rx, net.pool.header(packet));
            if let Some(conn) = outcome.conn {
                h.peers.entry(conn).or_insert(p.src);
            }
            net.pool.free(packet);
            self.after_delivery(host);
            return;
        }
        net.counters.delivered += 1;
        let (src, data) = (p.src, p.payload_len > 0);
        if let Some(datagram) = net.pool.datagram(packet, &mut self.rx) {
            net.counters.data_delivered += data as u64;
            let outcome = h.endpoint.handle_datagram(net.now, rx, datagram, &mut h.memory);
            if let Some(placement) = &outcome.placement {
                h.memory.place(placement);
            }
            if let Some(conn) = outcome.conn {
                h.peers.entry(conn).or_insert(src);
            }
        }
        net.pool.free(packet);
        self.after_delivery(host);
    }

    /// The driver loop after a datagram: at once, or at the end of the receive batch window.
    fn after_delivery(&mut self, host: u32) {
        if self.config.rx_batch.is_zero() {
            self.drive(host);
        } else if !self.hosts[host as usize].rx_batch_pending {
            self.hosts[host as usize].rx_batch_pending = true;
            self.net.queue.push(self.net.now + self.config.rx_batch, Ev::RxBatch { host });
        }
    }

    fn nic_full(&self, host: u32) -> bool {
        let port = &self.net.ports[self.net.topo.host_port(host) as usize];
        port.backlog_bytes(self.net.now_ps()) >= self.config.nic_queue_bytes_max
    }

    /// The driver loop for one host.
    fn drive(&mut self, host: u32) {
        let now = self.net.now;
        let port = self.net.topo.host_port(host);
        let nic_max = self.config.nic_queue_bytes_max;
        let h = &mut self.hosts[host as usize];
        loop {
            let nic = &self.net.ports[port as usize];
            if nic.backlog_bytes(self.net.now_ps()) >= nic_max {
                if !h.wake_pending {
                    h.wake_pending = true;
                    let at = nic.backlog_falls_to(nic_max / 2).div_ceil(1000).max(now.as_nanos());
                    self.net.queue.push(Instant::from_nanos(at), Ev::NicWake { host });
                }
                break;
            }
            let Some(t) = h.endpoint.poll_transmit(now, &mut self.tx_buf) else { break };
            let Some(&dst) = h.peers.get(&t.conn) else {
                self.net.counters.unroutable += 1;
                continue;
            };
            let payload_len = t.payload.map_or(0, |p| p.len);
            let packet =
                self.net.pool.alloc(host, dst, t.path.0, &self.tx_buf[..t.header_len], payload_len, t.ecn_capable);
            self.net.counters.sent += 1;
            self.net.send(port, packet, false);
        }
        while let Some(event) = h.endpoint.poll_event() {
            match event {
                Event::OpCompleted { conn, op, result } => {
                    if let Some(flow) = h.ops.remove(&(conn, op)) {
                        let f = &mut self.flows[flow as usize];
                        f.sent_done = Some(now);
                        if let Err(e) = result {
                            f.error = Some(format!("write failed: {e}"));
                        }
                        self.flows_pending -= 1;
                    }
                }
                Event::ImmReceived { imm, .. } => {
                    if let Some(f) = self.flows.get_mut(imm as usize) {
                        f.received_done.get_or_insert(now);
                    }
                }
                Event::ConnectionFailed { .. } => self.net.counters.connection_failures += 1,
                _ => {}
            }
        }
        self.arm_timer(host);
    }

    /// Keeps one timer event per host at the earliest instant the endpoint has work. A later
    /// deadline leaves the earlier event in place; it re-checks when it fires.
    fn arm_timer(&mut self, host: u32) {
        let now = self.net.now;
        let nic_full = self.nic_full(host);
        let h = &mut self.hosts[host as usize];
        let Some(due) = h.endpoint.poll_timeout() else { return };
        // With the NIC full, work due now waits for the NIC, which wakes the host itself.
        if due <= now && nic_full {
            return;
        }
        if h.timer_at.is_some_and(|t| t <= due) {
            return;
        }
        let at = due.max(now);
        h.timer_generation = h.timer_generation.wrapping_add(1);
        h.timer_at = Some(at);
        self.net.queue.push(at, Ev::Timer { host, generation: h.timer_generation });
    }
}
