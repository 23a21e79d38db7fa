//! The fabric experiments as library entry points returning result structs; the CLI
//! (`accord sim permutation`, `accord sim incast`) and the examples wrap these.

use super::port::QueueConfig;
use super::sim::{FabricConfig, FabricError, FabricReport, FabricSim, FlowResult};
use super::topology::{LinkSpec, TopologyKind};
use super::workload::{self, FlowClass, FlowSpec};
use accord_proto::cc::CcKind;
use accord_proto::path::SelectorKind;
use accord_proto::wire::DATA_HEADER_LEN;
use accord_proto::PacerOrder;
use core::time::Duration;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// EQDS speculation in base RTTs of line rate: what a sender sends before its first credit.
/// Half a base RTT: a 15:1 incast then bursts 15 half-BDPs into the receiver's port instead of
/// 15 whole ones, and the credit loop still fills the pipe from then on. Measured with the
/// final EQDS code, 0.5 against 1.0 base RTT: 1024-host permutation (64 MB, 256 paths) max FCT
/// 1.132x vs 1.140x ideal; 128 hosts x 16 MB 1.260x vs 1.321x; 16-host star 8 MB 1.150x; incast
/// 15:1 with victims below their fair share of the incast port (`accord sim incast
/// --victim-messages 5`, 5 seeds) victim P99 cubic/eqds 4.32x vs 3.70x, at `--victim-messages
/// 10` 4.79x vs 3.75x; with victims above their share (20, the default) 1.85x vs 1.84x.
pub const EQDS_SPECULATIVE_BASE_RTTS: f64 = 0.5;

/// EQDS receivers grant this fraction of the NIC's line rate (wire bytes). 0.99, not the
/// proto default 0.98, because EQDS connections here ACK every 16 packets (below): the reverse
/// control traffic a host receives beside its granted data (ACKs and credit of its own sends)
/// drops from about 2% of the link to about 1%. Measured (permutation, 256 paths, max FCT /
/// ideal, power-of-two selector): 128 hosts x 64 MB, ACK every 4 packets (the default) at 0.98
/// 1.1142, at 0.99 1.1647 (the last hop's queue stands); ACK every 16 at 0.99 1.1066. 1024
/// hosts x 16 MB: ACK every 4 at 0.98 1.2369, ACK every 16 at 0.99 1.2309. 0.995 was worse
/// (128 x 64 MB, recycling selector: 1.1526 against 1.1047 at 0.99).
pub const EQDS_RATE_FRACTION: f64 = 0.99;

/// ACK spacing of EQDS connections (`ack_every_packets`; the sender asks for an ACK every half
/// of it). A receiver-driven sender is clocked by credit, not ACKs, so ACKs only resolve
/// packets: fewer leave more of the receiver's link to data. 128 hosts x 64 MB, power-of-two
/// selector, max FCT / ideal: 8 (default) at rate 0.98 1.1142; 16 at 0.98 1.1140, at 0.99
/// 1.1083; 32 at 0.99 1.1066.
pub const EQDS_ACK_EVERY_PACKETS: u16 = 32;

/// Options shared by every experiment.
#[derive(Clone, Debug, PartialEq)]
pub struct ExperimentOptions {
    /// Hosts (fat-trees use the smallest radix that holds them). Default 128.
    pub nodes: u32,
    /// Line rate of every link. Default 400.
    pub link_gbps: f64,
    /// Bytes per flow. Default 1 MB.
    pub bytes: u64,
    /// Payload bytes per packet. Default 4096.
    pub mtu: u32,
    /// Paths (entropy values) per connection. Default 256.
    pub paths: u16,
    /// Congestion control by name (`cubic`, `swift`, `eqds`, `fixed`). Default cubic.
    pub cc: String,
    /// Bytes per chunk (one path decision). Default 8 KiB: two packets per path at the 4 KB
    /// MTU. Spraying at that grain keeps the random load on each fabric link smooth; 32 KiB
    /// chunks (the transport's default, sized for GSO on sockets) put 8-packet bursts on one
    /// path and doubled the tail of a permutation. EQDS caps it further at its own
    /// `chunk_bytes_max` (4 KiB: one packet per path decision).
    pub chunk: u32,
    /// Default 3-tier fat-tree.
    pub topology: TopologyKind,
    pub seed: u64,
    /// Switch queue policy by name (`droptail`, `ecn`, `trim`, or `auto`: trimming for the
    /// receiver-driven EQDS, which NACKs trimmed headers, ECN marking for the sender-driven
    /// policies, which react to marks). Default auto.
    pub queue: String,
    /// Switch buffer per output port, in full packets. Default 100.
    pub queue_packets: u32,
    /// Propagation delay per link. Default 1 µs.
    pub link_latency: Duration,
    /// Per-event invariant checks and exact placement tracking (tests). Default off.
    pub checked: bool,
    /// Receive batching window (see [`FabricConfig::rx_batch`]). Default zero: exact.
    pub rx_batch: Duration,
    /// Path selector by name: `p2c` (power-of-two choices, the default), `rr` or `recycle`
    /// (entropy recycling; for EQDS it halved trims and helped at 128 hosts x 64 MB, max FCT
    /// 1.1066 -> 1.1047x, but hurt at 1024 hosts x 16 MB, 1.2309 -> 1.2574x: with 64 core
    /// paths per flow its feedback per path is sparse and stale).
    pub selector: String,
    /// Order of the EQDS receivers' credit pacer among senders. Default shortest remaining
    /// first: a victim's short messages beside an incast finish near their unloaded latency
    /// (the MoE serving case of issue 8), at the cost of the incast's last flow (see
    /// `docs/results`); [`PacerOrder::RoundRobin`] is max-min fair.
    pub pacer_order: PacerOrder,
    /// Initial congestion window in bytes; 0 (the default) means one bandwidth-delay product
    /// of the fabric's longest base round trip (line-rate start, as datacenter transports that
    /// spray do: a non-blocking fabric has the capacity, and a window of 32 packets would take
    /// over a hundred round trips of additive increase to fill 400 Gbit/s).
    pub initial_window_bytes: u64,
}

impl Default for ExperimentOptions {
    fn default() -> Self {
        ExperimentOptions {
            nodes: 128,
            link_gbps: 400.0,
            bytes: 1_000_000,
            mtu: 4096,
            paths: 256,
            cc: "cubic".into(),
            chunk: 8 * 1024,
            topology: TopologyKind::FatTree3,
            seed: 1,
            queue: "auto".into(),
            queue_packets: 100,
            link_latency: Duration::from_micros(1),
            checked: false,
            rx_batch: Duration::ZERO,
            initial_window_bytes: 0,
            selector: "p2c".into(),
            pacer_order: PacerOrder::ShortestRemaining,
        }
    }
}

impl ExperimentOptions {
    /// The simulator configuration these options describe.
    pub fn fabric_config(&self) -> Result<FabricConfig, FabricError> {
        let bad = |what: String| FabricError::Config(what);
        if self.link_gbps.is_nan() || self.link_gbps <= 0.0 {
            return Err(bad(format!("link_gbps {} must be positive", self.link_gbps)));
        }
        let datagram = self.mtu as usize + DATA_HEADER_LEN;
        if datagram > u16::MAX as usize {
            return Err(bad(format!("mtu {} too large (datagram at most 65535 bytes)", self.mtu)));
        }
        let link = LinkSpec { rate_bps: (self.link_gbps * 1e9) as u64, latency: self.link_latency };
        let mut cfg = FabricConfig::new(self.seed, self.topology, self.nodes, link);
        let c = &mut cfg.endpoint.connection;
        let initial_rtt = c.initial_rtt;
        let bdp_bytes = (link.rate_bps as u128 * initial_rtt.as_nanos() / 8_000_000_000) as u64;
        let initial_window_bytes = if self.initial_window_bytes == 0 { bdp_bytes } else { self.initial_window_bytes };
        let mut cc = CcKind::from_name(&self.cc).map_err(|e| bad(e.to_string()))?;
        let mss = self.mtu as u64;
        let initial_packets = initial_window_bytes.div_ceil(mss.max(1)).max(1);
        match &mut cc {
            CcKind::Cubic(cubic) => cubic.initial_window_packets = initial_packets.min(u32::MAX as u64) as u32,
            CcKind::Swift(swift) => swift.initial_window_packets = initial_packets as f64,
            _ => {}
        }
        if let CcKind::Eqds(eqds) = &mut cc {
            // Speculate one bandwidth-delay product of the credit loop; ask (Rts) after the RTO
            // floor, which only matters where a header was lost outright.
            eqds.speculative_bytes =
                (EQDS_SPECULATIVE_BASE_RTTS * initial_rtt.as_secs_f64() * self.link_gbps * 1e9 / 8.0) as u64;
            eqds.rts_timeout = c.rto_min;
        }
        // EQDS receivers keep one BDP of demand ahead of the pull clock (paced, no burst).
        let credit = &mut cfg.endpoint.credit;
        credit.pull_headroom_bytes = (initial_rtt.as_secs_f64() * self.link_gbps * 1e9 / 8.0) as u64;
        credit.rate_fraction = EQDS_RATE_FRACTION;
        credit.order = self.pacer_order;
        let receiver_driven = matches!(cc, CcKind::Eqds(_));
        let selector = SelectorKind::from_name(&self.selector)
            .ok_or_else(|| bad(format!("unknown selector {:?}: use p2c, rr or recycle", self.selector)))?;
        let c = &mut cfg.endpoint.connection;
        *c = accord_proto::ConnectionConfig {
            max_datagram_bytes: datagram as u16,
            path_count: self.paths,
            chunk_bytes: self.chunk,
            ack_every_packets: if receiver_driven { EQDS_ACK_EVERY_PACKETS } else { c.ack_every_packets },
            selector,
            cc,
            initial_rtt,
            ..c.clone()
        };
        // Timers and queues scale with the packet size chosen here.
        let mtu_wire = datagram as u64 + crate::link::FRAMING_BYTES;
        let capacity = self.queue_packets as u64 * mtu_wire;
        cfg.queue = QueueConfig::from_name(self.queue_name(), capacity)
            .ok_or_else(|| bad(format!("unknown queue policy {:?}: use droptail, ecn, trim or auto", self.queue)))?;
        cfg.nic_queue_bytes_max = 16 * mtu_wire;
        cfg.check_invariants = self.checked;
        cfg.rx_batch = self.rx_batch;
        cfg.track_placements = self.checked;
        // Generous: a failing run ends here instead of spinning.
        let ideal = self.bytes as f64 * 8.0 / (self.link_gbps * 1e9);
        cfg.time_limit = Duration::from_secs_f64((ideal * 200.0).max(0.2));
        Ok(cfg)
    }

    /// The fabric and the load, as a run's header line starts (`accord sim permutation` and the
    /// `fabric_permutation` example): hosts, topology, line rate, bytes per host, MTU, paths.
    pub fn fabric_summary(&self) -> String {
        format!(
            "{} hosts, {:?}, {} Gbit/s, {} bytes/host, mtu {}, {} paths",
            self.nodes, self.topology, self.link_gbps, self.bytes, self.mtu, self.paths
        )
    }

    /// The switch queue policy this run uses: `queue`, with `auto` resolved for `cc`.
    pub fn queue_name(&self) -> &str {
        if self.queue.trim().eq_ignore_ascii_case("auto") {
            if self.cc.trim().eq_ignore_ascii_case("eqds") {
                "trim"
            } else {
                "ecn"
            }
        } else {
            &self.queue
        }
    }

    /// Line-rate time of `bytes` payload.
    pub fn ideal(&self, bytes: u64) -> Duration {
        Duration::from_secs_f64(bytes as f64 * 8.0 / (self.link_gbps * 1e9))
    }
}

/// Minimum, median, 99th percentile and maximum of a set of times, in µs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FctSummary {
    pub min: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// Nearest-rank percentile `q` (0..=1) of sorted `values`.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn sorted_fct_us(flows: &[&FlowResult]) -> Vec<f64> {
    let mut v: Vec<f64> = flows.iter().map(|f| f.fct.as_secs_f64() * 1e6).collect();
    v.sort_by(f64::total_cmp);
    v
}

impl FctSummary {
    fn of(flows: &[&FlowResult]) -> Self {
        let v = sorted_fct_us(flows);
        FctSummary {
            min: v.first().copied().unwrap_or(0.0),
            p50: percentile(&v, 0.5),
            p99: percentile(&v, 0.99),
            max: v.last().copied().unwrap_or(0.0),
        }
    }
}

/// What a permutation (or any one-size flow set) produced.
#[derive(Clone, Debug, PartialEq)]
pub struct PermutationResult {
    pub cc: String,
    pub nodes: u32,
    /// Line-rate time of one flow's bytes.
    pub ideal_us: f64,
    pub fct_us: FctSummary,
    /// Largest FCT over the ideal.
    pub slowdown_max: f64,
    pub events: u64,
    pub wall_s: f64,
    pub events_per_s: f64,
    pub drops: u64,
    pub ecn_marks: u64,
    pub trims: u64,
    pub hash: u64,
    /// Every flow's completion time, µs, ascending (for a CDF).
    pub fcts_us: Vec<f64>,
}

impl PermutationResult {
    /// The columns of a permutation's summary table, one per cell of [`PermutationResult::row`].
    pub const COLUMNS: [&'static str; 12] = [
        "ideal_us",
        "fct_min_us",
        "fct_p50_us",
        "fct_p99_us",
        "fct_max_us",
        "slowdown_max",
        "drops",
        "marks",
        "events",
        "wall_s",
        "events/s",
        "hash",
    ];

    /// This run's summary cells under [`PermutationResult::COLUMNS`], formatted once for every
    /// table that shows runs (`accord sim permutation`, the `fabric_permutation` example).
    pub fn row(&self) -> [String; 12] {
        [
            format!("{:.1}", self.ideal_us),
            format!("{:.1}", self.fct_us.min),
            format!("{:.1}", self.fct_us.p50),
            format!("{:.1}", self.fct_us.p99),
            format!("{:.1}", self.fct_us.max),
            format!("{:.3}", self.slowdown_max),
            self.drops.to_string(),
            self.ecn_marks.to_string(),
            self.events.to_string(),
            format!("{:.2}", self.wall_s),
            format!("{:.0}", self.events_per_s),
            format!("{:016x}", self.hash),
        ]
    }
}

fn summarise(opts: &ExperimentOptions, report: &FabricReport) -> PermutationResult {
    let flows: Vec<&FlowResult> = report.flows.iter().collect();
    let wall_s = report.wall.as_secs_f64();
    PermutationResult {
        cc: opts.cc.clone(),
        nodes: opts.nodes,
        ideal_us: opts.ideal(opts.bytes).as_secs_f64() * 1e6,
        fct_us: FctSummary::of(&flows),
        slowdown_max: flows.iter().map(|f| f.slowdown()).fold(0.0, f64::max),
        events: report.events,
        wall_s,
        events_per_s: report.events as f64 / wall_s.max(1e-9),
        drops: report.counters.dropped,
        ecn_marks: report.counters.ecn_marks,
        trims: report.counters.trims,
        hash: report.hash,
        fcts_us: sorted_fct_us(&flows),
    }
}

/// Runs `flows` on the fabric `opts` describes and returns the full report.
pub fn run_flows(opts: &ExperimentOptions, flows: Vec<FlowSpec>) -> Result<FabricReport, FabricError> {
    FabricSim::new(opts.fabric_config()?, flows)?.run()
}

fn workload_rng(opts: &ExperimentOptions) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(opts.seed ^ 0x574f_524b_4c4f_4144)
}

/// Each host writes `opts.bytes` to a distinct random host.
pub fn permutation(opts: &ExperimentOptions) -> Result<PermutationResult, FabricError> {
    permutation_reporting(opts, |_, _| {})
}

/// As [`permutation`], with `progress(flows done, flows in all)` called as the run goes
/// ([`FabricSim::run_reporting`]).
pub fn permutation_reporting(
    opts: &ExperimentOptions,
    progress: impl FnMut(usize, usize),
) -> Result<PermutationResult, FabricError> {
    let flows = workload::permutation(opts.nodes, opts.bytes, &mut workload_rng(opts));
    Ok(summarise(opts, &FabricSim::new(opts.fabric_config()?, flows)?.run_reporting(progress)?))
}

/// Every host writes `opts.bytes` to every other host.
pub fn all_to_all(opts: &ExperimentOptions) -> Result<PermutationResult, FabricError> {
    let flows = workload::all_to_all(opts.nodes, opts.bytes, Duration::ZERO, &mut workload_rng(opts));
    Ok(summarise(opts, &run_flows(opts, flows)?))
}

/// Settings of the incast experiment.
#[derive(Clone, Debug, PartialEq)]
pub struct IncastOptions {
    /// Fabric, flow size (`bytes`, per incast sender) and seed; `cc` is ignored (see `ccs`).
    pub base: ExperimentOptions,
    /// Senders into host 0.
    pub fan_in: u32,
    /// Congestion controls to compare, one run each.
    pub ccs: Vec<String>,
    /// Bytes per victim flow (a permutation among the other hosts); 0 for a bare incast.
    pub victim_bytes: u64,
    /// Victims start this long before the incast.
    pub victim_lead: Duration,
    /// Hosts of the victims' permutation, `0..victim_hosts` (host 0, the incast's receiver,
    /// included); 0 keeps the bare shape: one flow per host among all hosts but host 0.
    pub victim_hosts: u32,
    /// Messages per victim pair (with `victim_hosts` set), one every `victim_interval`.
    pub victim_messages: u32,
    pub victim_interval: Duration,
    /// Runs per congestion control, seeds `base.seed..base.seed + runs`; percentiles pool the
    /// flows of all runs (one run of 16 victims has no P99 distinct from its maximum).
    pub runs: u32,
}

/// Incast and victim completion-time percentiles for one congestion control.
#[derive(Clone, Debug, PartialEq)]
pub struct IncastResult {
    pub cc: String,
    /// Line-rate time of one incast flow's bytes (all of them share one link: the last can
    /// finish no sooner than `fan_in` times this).
    pub ideal_us: f64,
    pub incast_p50_us: f64,
    pub incast_p99_us: f64,
    pub incast_p999_us: f64,
    pub victim_p50_us: f64,
    pub victim_p99_us: f64,
    pub victim_p999_us: f64,
    pub drops: u64,
    pub ecn_marks: u64,
    pub trims: u64,
    pub events: u64,
    pub wall_s: f64,
    /// Hash of the first run (same seed, same hash).
    pub hash: u64,
    /// Switch queue policy used.
    pub queue: String,
}

/// An N:1 incast into host 0, with victim flows among the other hosts, once per congestion
/// control in `opts.ccs`.
pub fn incast(opts: &IncastOptions) -> Result<Vec<IncastResult>, FabricError> {
    if opts.fan_in == 0 || opts.fan_in >= opts.base.nodes {
        return Err(FabricError::Config(format!("fan_in {} must be in 1..{}", opts.fan_in, opts.base.nodes)));
    }
    let mut out = Vec::with_capacity(opts.ccs.len());
    for cc in &opts.ccs {
        let cc_opts = ExperimentOptions { cc: cc.clone(), ..opts.base.clone() };
        let (mut incast, mut victims) = (Vec::new(), Vec::new());
        let (mut drops, mut ecn_marks, mut trims, mut events, mut wall_s, mut hash) = (0, 0, 0, 0, 0.0, None);
        for run in 0..opts.runs.max(1) {
            let run_opts = ExperimentOptions { seed: cc_opts.seed.wrapping_add(run as u64), ..cc_opts.clone() };
            let mut rng = workload_rng(&run_opts);
            let flows = if opts.victim_bytes > 0 && opts.victim_hosts > 0 {
                let mut flows = workload::incast(run_opts.nodes, opts.fan_in, 0, run_opts.bytes, &mut rng);
                for f in &mut flows {
                    f.start = opts.victim_lead;
                }
                flows.extend(workload::victim_messages(
                    opts.victim_hosts.min(run_opts.nodes),
                    opts.victim_bytes,
                    opts.victim_messages.max(1),
                    opts.victim_interval,
                    &mut rng,
                ));
                flows
            } else if opts.victim_bytes > 0 {
                workload::incast_with_victims(
                    run_opts.nodes,
                    opts.fan_in,
                    run_opts.bytes,
                    opts.victim_bytes,
                    opts.victim_lead,
                    &mut rng,
                )
            } else {
                workload::incast(run_opts.nodes, opts.fan_in, 0, run_opts.bytes, &mut rng)
            };
            let report = run_flows(&run_opts, flows)?;
            let fct_us = |f: &FlowResult| f.fct.as_secs_f64() * 1e6;
            incast.extend(report.flows.iter().filter(|f| f.class == FlowClass::Incast).map(fct_us));
            victims.extend(report.flows.iter().filter(|f| f.class == FlowClass::Victim).map(fct_us));
            drops += report.counters.dropped;
            ecn_marks += report.counters.ecn_marks;
            trims += report.counters.trims;
            events += report.events;
            wall_s += report.wall.as_secs_f64();
            hash.get_or_insert(report.hash);
        }
        incast.sort_by(f64::total_cmp);
        victims.sort_by(f64::total_cmp);
        out.push(IncastResult {
            cc: cc.clone(),
            ideal_us: cc_opts.ideal(cc_opts.bytes).as_secs_f64() * 1e6,
            incast_p50_us: percentile(&incast, 0.5),
            incast_p99_us: percentile(&incast, 0.99),
            incast_p999_us: percentile(&incast, 0.999),
            victim_p50_us: percentile(&victims, 0.5),
            victim_p99_us: percentile(&victims, 0.99),
            victim_p999_us: percentile(&victims, 0.999),
            drops,
            ecn_marks,
            trims,
            events,
            wall_s,
            hash: hash.unwrap_or(0),
            queue: cc_opts.queue_name().to_string(),
        });
    }
    Ok(out)
}
