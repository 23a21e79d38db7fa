//! The experiments behind `accord sim loss-sweep`, `path-cut` and `late-acks`, as library code so
//! tests and the CLI run the same thing.

use crate::gbn::{self, GbnConfig};
use crate::link::FaultConfig;
use crate::pair::{PairConfig, PairSim, Side, SimError};
use accord_proto::cc::CcKind;
use accord_proto::{Instant, PathId, RegionId, RegionKey, WriteRequest};
use core::time::Duration;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::rc::Rc;

/// Loss rates of the sweep (the list).
pub const LOSS_SWEEP_RATES: [f64; 6] = [0.0, 1.0 / 16384.0, 1.0 / 4096.0, 1.0 / 1024.0, 1.0 / 256.0, 1.0 / 64.0];

/// Settings shared by the experiments.
#[derive(Clone, Debug)]
pub struct ScenarioConfig {
    pub seed: u64,
    pub bytes: u64,
    pub paths: u16,
    pub cc: CcKind,
}

/// Fractions of the datagrams each host sends that come late in `accord sim late-acks`: that
/// stall their host first, or that are held back alone.
pub const LATE_ACK_FRACTIONS: [f64; 5] = [0.0, 1.0 / 4096.0, 1.0 / 1024.0, 1.0 / 256.0, 1.0 / 64.0];

/// Result of moving one write through the pair.
#[derive(Clone, Debug, PartialEq)]
pub struct WriteRun {
    pub completion: Duration,
    pub retransmits: u64,
    /// Packets the sender declared lost, and of those the ones acknowledged after all.
    pub lost: u64,
    pub lost_spurious: u64,
    pub events: u64,
    /// Path quarantines over the run (all paths).
    pub quarantines: u64,
}

fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    ChaCha8Rng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

fn pair_config(cfg: &ScenarioConfig, faults: FaultConfig) -> PairConfig {
    let mut pc = PairConfig::datacenter(cfg.seed);
    pc.faults = faults;
    pc.endpoint.connection.path_count = cfg.paths;
    pc.endpoint.connection.cc = cfg.cc.clone();
    // Per-event invariant checks cost more than the protocol at these sizes; the property
    // tests run them on every event.
    pc.check_invariants = false;
    pc
}

/// Writes `cfg.bytes` from A to B, checks every byte and the immediate, and times it. When
/// `cut_at_fraction` is set, cuts path 0 once that fraction has been acknowledged and returns
/// the instant and bytes at the cut as well.
fn run_write(
    cfg: &ScenarioConfig,
    faults: FaultConfig,
    cut_at_fraction: Option<f64>,
) -> Result<(WriteRun, Option<(Duration, u64)>), SimError> {
    run_write_in(pair_config(cfg, faults), cfg, cut_at_fraction)
}

fn run_write_in(
    pc: PairConfig,
    cfg: &ScenarioConfig,
    cut_at_fraction: Option<f64>,
) -> Result<(WriteRun, Option<(Duration, u64)>), SimError> {
    let mut sim = PairSim::new(pc)?;
    sim.connect()?;
    let len = cfg.bytes as usize;
    let source = Rc::new(random_bytes(cfg.seed ^ 0x5eed, len));
    let key = RegionKey(0xacc0_12d5 ^ cfg.seed);
    sim.register(Side::B, RegionId(1), key, len);
    let start = sim.now();
    let req = WriteRequest { region: RegionId(1), key, offset: 0, len: cfg.bytes, imm: Some(7), tag: 0 };
    sim.write(Side::A, source.clone(), 0, req).map_err(|e| SimError::Config(e.to_string()))?;
    let mut cut = None;
    if let Some(fraction) = cut_at_fraction {
        let threshold = (cfg.bytes as f64 * fraction) as u64;
        let mut steps = 0u64;
        while sim.pending_ops() > 0 {
            if !sim.step()? {
                break;
            }
            steps += 1;
            if steps.is_multiple_of(256) {
                let acked = sim.connection_stats(Side::A).map_or(0, |s| s.bytes_acked);
                if acked >= threshold {
                    let now = sim.now();
                    sim.schedule_cut(now, PathId(0), true);
                    cut = Some((now, acked));
                    break;
                }
            }
        }
    }
    sim.run_until_complete()?;
    let done = sim.completions(Side::A).first().cloned().expect("one write submitted");
    if let Err(e) = done.result {
        return Err(SimError::Config(format!("seed {}: write failed: {e}", cfg.seed)));
    }
    let region = sim.memory(Side::B).region(RegionId(1)).expect("registered");
    if region.bytes[..] != source[..] {
        return Err(SimError::Invariant {
            seed: cfg.seed,
            at_ns: sim.now().as_nanos(),
            what: "bytes differ at the receiver".into(),
        });
    }
    if sim.imms(Side::B).len() != 1 || sim.memory(Side::B).bytes_placed != cfg.bytes {
        return Err(SimError::Invariant {
            seed: cfg.seed,
            at_ns: sim.now().as_nanos(),
            what: format!(
                "imms {} bytes placed {} of {}",
                sim.imms(Side::B).len(),
                sim.memory(Side::B).bytes_placed,
                cfg.bytes
            ),
        });
    }
    let stats = sim.connection_stats(Side::A).unwrap_or_default();
    let quarantines = stats.paths.iter().map(|p| p.quarantines).sum();
    let run = WriteRun {
        completion: done.at - start,
        retransmits: stats.packets_retransmitted,
        lost: stats.packets_lost,
        lost_spurious: stats.packets_lost_spurious,
        events: sim.events_handled(),
        quarantines,
    };
    Ok((run, cut.map(|(t, acked): (Instant, u64)| (t - start, acked))))
}

/// One row of the loss sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct LossSweepRow {
    pub loss: f64,
    pub accord_goodput_pct: f64,
    pub gbn_goodput_pct: f64,
    pub accord_completion_us: f64,
    pub gbn_completion_us: f64,
    pub accord_retransmits: u64,
    pub gbn_rewinds: u64,
}

/// Goodput of Accord and go-back-N at each loss rate, as percent of each one's lossless run.
pub fn loss_sweep(cfg: &ScenarioConfig, rates: &[f64]) -> Result<Vec<LossSweepRow>, SimError> {
    let pc = pair_config(cfg, FaultConfig::default());
    let conn = &pc.endpoint.connection;
    let mss = conn.mss_bytes() as u64;
    let bdp_bytes = (pc.link.rate_bps / 8) as f64 * (pc.link.propagation.as_secs_f64() * 2.0);
    let gbn_cfg = |loss: f64| GbnConfig {
        seed: cfg.seed,
        link: pc.link.clone(),
        faults: FaultConfig { loss, ..Default::default() },
        mss_bytes: mss,
        window_packets: ((2.0 * bdp_bytes) as u64 / mss).max(16),
        rto: conn.rto_min,
        time_limit: Duration::from_secs(60),
    };
    let mut rows = Vec::new();
    let mut baseline: Option<(Duration, Duration)> = None;
    for &loss in rates {
        let (accord, _) = run_write(cfg, FaultConfig { loss, ..Default::default() }, None)?;
        let gbn = gbn::transfer(&gbn_cfg(loss), cfg.bytes).map_err(SimError::Config)?;
        let (accord_base, gbn_base) = *baseline.get_or_insert((accord.completion, gbn.completion));
        rows.push(LossSweepRow {
            loss,
            accord_goodput_pct: 100.0 * accord_base.as_secs_f64() / accord.completion.as_secs_f64(),
            gbn_goodput_pct: 100.0 * gbn_base.as_secs_f64() / gbn.completion.as_secs_f64(),
            accord_completion_us: accord.completion.as_secs_f64() * 1e6,
            gbn_completion_us: gbn.completion.as_secs_f64() * 1e6,
            accord_retransmits: accord.retransmits,
            gbn_rewinds: gbn.rewinds,
        });
    }
    Ok(rows)
}

/// Result of the path-cut experiment.
#[derive(Clone, Debug, PartialEq)]
pub struct PathCutResult {
    pub goodput_before_gbps: f64,
    pub goodput_after_gbps: f64,
    /// Goodput after the cut relative to 7/8 of the goodput before it, percent.
    pub recovered_goodput_pct: f64,
    pub completion_us: f64,
    pub retransmits: u64,
    /// Quarantines over the run: the cut path should be one.
    pub quarantined_paths: u64,
}

/// Cuts one of `cfg.paths` paths halfway through a write; the write must still complete.
pub fn path_cut(cfg: &ScenarioConfig) -> Result<PathCutResult, SimError> {
    let (run, cut) = run_write(cfg, FaultConfig::default(), Some(0.5))?;
    let (cut_after, acked_at_cut) = cut.ok_or_else(|| SimError::Config("write finished before the cut".into()))?;
    let before_s = cut_after.as_secs_f64();
    let after_s = (run.completion.as_secs_f64() - before_s).max(1e-12);
    let before_gbps = acked_at_cut as f64 * 8.0 / before_s / 1e9;
    let after_gbps = (cfg.bytes - acked_at_cut) as f64 * 8.0 / after_s / 1e9;
    let share = (cfg.paths.max(2) - 1) as f64 / cfg.paths.max(2) as f64;
    Ok(PathCutResult {
        goodput_before_gbps: before_gbps,
        goodput_after_gbps: after_gbps,
        recovered_goodput_pct: 100.0 * after_gbps / (share * before_gbps),
        completion_us: run.completion.as_secs_f64() * 1e6,
        retransmits: run.retransmits,
        quarantined_paths: run.quarantines,
    })
}

/// How datagrams come late in the late-delivery sweep (nothing is ever lost).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lateness {
    /// A host stalls before a send: everything it sends next waits, in order (a descheduled
    /// worker, a queued shared-memory ring: late acknowledgements).
    Stall,
    /// One datagram alone is held back (reordering in the network).
    Reorder,
}

impl Lateness {
    pub fn name(self) -> &'static str {
        match self {
            Lateness::Stall => "stall",
            Lateness::Reorder => "reorder",
        }
    }

    fn faults(self, fraction: f64, late_by: Duration) -> FaultConfig {
        match self {
            Lateness::Stall => FaultConfig { stall: fraction, stall_max: late_by, ..Default::default() },
            Lateness::Reorder => FaultConfig { reorder: fraction, reorder_delay: late_by, ..Default::default() },
        }
    }
}

/// One row of the late-delivery sweep: the same write, seed and faults, with the learned RTO
/// floor (`ConnectionConfig::learn_rto_floor`) on and off.
#[derive(Clone, Debug, PartialEq)]
pub struct LateAckRow {
    pub lateness: Lateness,
    pub late_fraction: f64,
    pub learned: WriteRun,
    pub unlearned: WriteRun,
}

/// Writes `cfg.bytes` while datagrams come late, up to `late_by`, and nothing is lost: for
/// each kind of lateness and each fraction (of the datagrams each host sends), once with the
/// learned RTO floor on and once off.
pub fn late_ack_sweep(cfg: &ScenarioConfig, fractions: &[f64], late_by: Duration) -> Result<Vec<LateAckRow>, SimError> {
    let mut rows = Vec::new();
    for lateness in [Lateness::Stall, Lateness::Reorder] {
        for &late_fraction in fractions {
            let learning = pair_config(cfg, lateness.faults(late_fraction, late_by));
            let mut unlearning = learning.clone();
            unlearning.endpoint.connection.learn_rto_floor = false;
            let (learned, _) = run_write_in(learning, cfg, None)?;
            let (unlearned, _) = run_write_in(unlearning, cfg, None)?;
            rows.push(LateAckRow { lateness, late_fraction, learned, unlearned });
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The learned RTO floor's point, on counts the simulation decides exactly: while the
    /// receiving host stalls, a sender that learns declares fewer packets lost that were only
    /// late, and either way every byte arrives (`run_write_in` checks them and the immediate).
    #[test]
    fn under_host_stalls_the_learned_floor_declares_fewer_false_losses() {
        let cfg = ScenarioConfig { seed: 1, bytes: 4 << 20, paths: 16, cc: CcKind::Cubic(Default::default()) };
        let rows = late_ack_sweep(&cfg, &[0.0, 1.0 / 256.0], Duration::from_millis(1)).unwrap();
        let stall = rows.iter().find(|r| r.lateness == Lateness::Stall && r.late_fraction > 0.0).unwrap();
        assert!(stall.unlearned.lost_spurious > 0, "stalls make losses that are not: {stall:?}");
        assert!(stall.learned.lost < stall.unlearned.lost, "{stall:?}");
        for r in rows.iter().filter(|r| r.late_fraction == 0.0) {
            assert_eq!(r.learned, r.unlearned, "with nothing late the floor never moves");
        }
    }
}
