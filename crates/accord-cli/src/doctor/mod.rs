//! `accord doctor <reports...>`: merges the stuck reports of a job's ranks
//! (`accord_coll::report`, written to `ACCORD_REPORT_DIR`) and names the cause in one line per
//! communicator.
//!
//! The reasoning, in order (the first that applies wins):
//! 1. a rank the engine declared dead: "rank 2 died during all_reduce #5 (...)";
//! 2. ranks that reported but are not inside the stuck collective: "rank 3 never entered
//!    all_reduce #812" (unless such a rank is itself stuck in an earlier collective waiting for
//!    a rank that wrote no report: then that silent rank is the cause, rule 3);
//! 3. ranks awaited by others that wrote no report (a stopped or hung process cannot write):
//!    "rank 2 wrote no report; ranks 0, 1 wait inside all_reduce #5 for it: ...";
//! 4. a chain of waits (A waits for B, B for C, ...) that ends at a rank waiting for nobody:
//!    "rank 5 is inside all_reduce #812 waiting for rank 6's step 14; path 2 to rank 6 has
//!    100% loss";
//! 5. otherwise every rank is inside it (waits form a cycle, as in a ring): the slowest link.
//!
//! The NCCL plugin's in-flight dumps in the same folder get one line per process first
//! ([`plugin`]).

mod plugin;

use accord_coll::report::{PathReport, StuckReport};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// How long a rank must have been inside the collective for its waits to count as stuck.
pub const STUCK_MS: u64 = 1000;

/// Arguments of `accord doctor`.
#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Report files, or directories holding them (every `*.json` inside).
    #[arg(required = true)]
    pub reports: Vec<PathBuf>,
    /// Also print one line per rank.
    #[arg(long)]
    pub verbose: bool,
}

/// Runs `accord doctor`.
pub fn run(args: DoctorArgs) -> Result<(), String> {
    let (reports, plugin_dumps) = load(&args.reports)?;
    if reports.is_empty() && plugin_dumps.is_empty() {
        return Err("no stuck reports or plugin dumps found in the paths given".into());
    }
    for line in plugin::diagnose(&plugin_dumps) {
        println!("{line}");
    }
    for (comm, ranks) in by_comm(reports) {
        if args.verbose {
            for r in ranks.values() {
                println!("  comm {comm} {}", summary(r));
            }
        }
        println!("{}", diagnose(&ranks));
    }
    Ok(())
}

/// Reads every report and plugin dump under `paths`; a file that is neither is an error naming
/// it.
fn load(paths: &[PathBuf]) -> Result<(Vec<StuckReport>, Vec<plugin::PluginDump>), String> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let entries = std::fs::read_dir(p).map_err(|e| format!("reading {}: {e}", p.display()))?;
            let mut inside: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "json"))
                .collect();
            inside.sort();
            files.extend(inside);
        } else {
            files.push(p.clone());
        }
    }
    let (mut reports, mut dumps) = (Vec::new(), Vec::new());
    for f in &files {
        match parse(f)? {
            Parsed::Report(r) => reports.push(*r),
            Parsed::PluginDump(d) => dumps.push(d),
        }
    }
    Ok((reports, dumps))
}

enum Parsed {
    Report(Box<StuckReport>),
    PluginDump(plugin::PluginDump),
}

fn parse(path: &Path) -> Result<Parsed, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    if plugin::is_plugin_dump(&value) {
        return serde_json::from_value(value)
            .map(Parsed::PluginDump)
            .map_err(|e| format!("{} is not a whole plugin dump: {e}", path.display()));
    }
    serde_json::from_value(value)
        .map(|r| Parsed::Report(Box::new(r)))
        .map_err(|e| format!("{} is not a stuck report: {e}", path.display()))
}

/// Reports grouped by communicator, the latest per rank.
fn by_comm(reports: Vec<StuckReport>) -> BTreeMap<String, BTreeMap<usize, StuckReport>> {
    let mut out: BTreeMap<String, BTreeMap<usize, StuckReport>> = BTreeMap::new();
    for r in reports {
        let ranks = out.entry(r.comm.clone()).or_default();
        match ranks.get(&r.rank) {
            Some(old) if old.unix_ms >= r.unix_ms => {}
            _ => {
                ranks.insert(r.rank, r);
            }
        }
    }
    out
}

fn summary(r: &StuckReport) -> String {
    match &r.op {
        Some(op) => {
            let waits: Vec<String> = op.waiting_for.iter().map(|w| format!("r{} {}", w.rank, w.what)).collect();
            format!(
                "rank {} ({}): in {} #{} step {:?} for {} ms, waiting for [{}]",
                r.rank,
                r.trigger,
                op.collective,
                op.seq,
                op.step,
                op.elapsed_ms,
                waits.join(", ")
            )
        }
        None => format!(
            "rank {} ({}): in no collective; last completed {}",
            r.rank,
            r.trigger,
            r.last_completed.as_ref().map_or("none".to_string(), |o| format!("{} #{}", o.collective, o.seq))
        ),
    }
}

/// "waits" for one rank, "wait" for several.
fn wait_verb(ranks: &[usize]) -> &'static str {
    if ranks.len() == 1 {
        "waits"
    } else {
        "wait"
    }
}

fn list(ranks: &[usize]) -> String {
    let names: Vec<String> = ranks.iter().map(ToString::to_string).collect();
    format!("{} {}", if ranks.len() == 1 { "rank" } else { "ranks" }, names.join(", "))
}

/// The one-line finding for one communicator's reports (see the module docs).
pub fn diagnose(ranks: &BTreeMap<usize, StuckReport>) -> String {
    // The stuck collective: the latest one any rank is inside.
    let Some((name, seq)) =
        ranks.values().filter_map(|r| r.op.as_ref()).map(|o| (o.collective.clone(), o.seq)).max_by_key(|(_, s)| *s)
    else {
        return "no rank is inside a collective: nothing is stuck in these reports".into();
    };
    let op = format!("{name} #{seq}");
    let inside: Vec<usize> =
        ranks.values().filter(|r| r.op.as_ref().is_some_and(|o| o.seq == seq)).map(|r| r.rank).collect();
    let waits_of = |rank: usize| -> Vec<usize> {
        let mut v: Vec<usize> = ranks
            .get(&rank)
            .and_then(|r| r.op.as_ref())
            .filter(|o| o.seq == seq)
            .map(|o| o.waiting_for.iter().map(|w| w.rank).collect())
            .unwrap_or_default();
        v.dedup();
        v
    };

    // 1. Declared dead by an engine.
    let mut dead: BTreeMap<usize, (String, BTreeSet<usize>)> = BTreeMap::new();
    for r in ranks.values() {
        for p in &r.peers {
            if let Some(reason) = &p.dead {
                dead.entry(p.rank).or_insert_with(|| (reason.clone(), BTreeSet::new())).1.insert(r.rank);
            }
        }
    }
    if let Some((rank, (reason, seen_by))) = dead.iter().next() {
        let seen: Vec<usize> = seen_by.iter().copied().collect();
        return format!("rank {rank} died during {op}: {reason} (seen by {})", list(&seen));
    }

    // 2. Reported, but not inside it: the cause, unless it waits inside an earlier collective
    // for a rank that wrote no report (a rank stopped between the two collectives leaves the
    // others one collective apart: the one still in the earlier one is a victim too).
    let world = ranks.values().map(|r| r.world_size).max().unwrap_or(0);
    let silent: Vec<usize> = (0..world).filter(|r| !ranks.contains_key(r)).collect();
    let outside: Vec<&StuckReport> = ranks.values().filter(|r| r.op.as_ref().is_none_or(|o| o.seq < seq)).collect();
    let behind_for_silent =
        |r: &StuckReport| r.op.as_ref().is_some_and(|o| o.waiting_for.iter().any(|w| silent.contains(&w.rank)));
    if let Some(victim) = outside.iter().find(|r| behind_for_silent(r)) {
        let o = victim.op.as_ref().expect("checked above");
        let awaited: Vec<usize> =
            silent.iter().copied().filter(|s| o.waiting_for.iter().any(|w| w.rank == *s)).collect();
        return format!(
            "{} wrote no report; {} {} inside {} #{} for it and {} {} inside {op}: it is stopped, hung or dead",
            list(&awaited),
            list(&[victim.rank]),
            wait_verb(&[victim.rank]),
            o.collective,
            o.seq,
            list(&inside),
            wait_verb(&inside)
        );
    }
    if !outside.is_empty() {
        let names: Vec<usize> = outside.iter().map(|r| r.rank).collect();
        let last = match &outside[0].last_completed {
            Some(o) => format!("last completed {} #{}", o.collective, o.seq),
            None => "completed no collective".into(),
        };
        return format!(
            "{} never entered {op} ({last}); {} {} inside it",
            list(&names),
            list(&inside),
            wait_verb(&inside)
        );
    }

    // 3. Awaited but silent (no report at all).
    if !silent.is_empty() {
        let awaited: Vec<usize> =
            silent.iter().copied().filter(|s| inside.iter().any(|&i| waits_of(i).contains(s))).collect();
        let target = if awaited.is_empty() { silent.clone() } else { awaited };
        let waiters: Vec<usize> =
            inside.iter().copied().filter(|&i| waits_of(i).iter().any(|w| target.contains(w))).collect();
        let wait_part = if waiters.is_empty() {
            format!("{} are inside {op}", list(&inside))
        } else {
            format!("{} {} inside {op} for it", list(&waiters), wait_verb(&waiters))
        };
        return format!("{} wrote no report; {wait_part}: it is stopped, hung or dead", list(&target));
    }

    // 4. Follow the waits to a rank that waits for nobody (only once a wait has lasted: in a
    // snapshot of a running job a rank between two waits is not a culprit).
    let lasted = |rank: usize| ranks[&rank].op.as_ref().is_some_and(|o| o.elapsed_ms >= STUCK_MS);
    if let Some(start) = inside.iter().copied().find(|&i| !waits_of(i).is_empty() && lasted(i)) {
        let (mut cur, mut seen) = (start, BTreeSet::new());
        loop {
            seen.insert(cur);
            let Some(&next) = waits_of(cur).first() else { break };
            if seen.contains(&next) {
                // A cycle: nobody in particular; fall through to the slowest link.
                cur = usize::MAX;
                break;
            }
            if waits_of(next).is_empty() {
                let report = &ranks[&cur];
                let wait = report.op.as_ref().and_then(|o| o.waiting_for.iter().find(|w| w.rank == next));
                let what = match wait {
                    Some(w) if w.what == "handshake" => format!("rank {next} to enter it"),
                    Some(w) => match w.step {
                        Some(step) => format!("rank {next}'s step {step}"),
                        None => format!("rank {next}'s data"),
                    },
                    None => format!("rank {next}"),
                };
                let mut line = format!("rank {cur} is inside {op} waiting for {what}");
                if let Some((path, loss)) = worst_path(report, next) {
                    line += &format!("; path {} (lane {}) to rank {next} has {loss:.0}% loss", path.path, path.lane);
                }
                return line;
            }
            cur = next;
        }
        let _ = cur;
    }

    // 5. Everyone inside, waits in a cycle: the slowest link reported.
    let mut slowest: Option<(usize, usize, &PathReport)> = None;
    for r in ranks.values() {
        for p in &r.peers {
            for path in &p.paths {
                let worse = match slowest {
                    None => true,
                    Some((_, _, best)) => (path.loss_pct, path.rtt_us) > (best.loss_pct, best.rtt_us),
                };
                if worse {
                    slowest = Some((r.rank, p.rank, path));
                }
            }
        }
    }
    match slowest {
        Some((from, to, p)) => format!(
            "all ranks in {op}; slowest link r{from}\u{2192}r{to} (path {}, rtt {} us, {:.1}% loss)",
            p.path, p.rtt_us, p.loss_pct
        ),
        None => format!("all ranks in {op}; no path statistics in the reports"),
    }
}

/// The path to `peer` with the highest loss in `report`, when it is lossy (at least 50%, or
/// quarantined).
fn worst_path(report: &StuckReport, peer: usize) -> Option<(&PathReport, f64)> {
    let paths = &report.peers.iter().find(|p| p.rank == peer)?.paths;
    let worst = paths.iter().max_by(|a, b| a.loss_pct.total_cmp(&b.loss_pct))?;
    let loss = if worst.quarantined { worst.loss_pct.max(100.0) } else { worst.loss_pct };
    (loss >= 50.0).then_some((worst, loss.min(100.0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use accord_coll::report::{OpRef, OpReport, PeerReport, Waiting, REPORT_VERSION};

    fn report(rank: usize, op: Option<(u64, Vec<usize>)>) -> StuckReport {
        StuckReport {
            version: REPORT_VERSION,
            comm: "c".into(),
            rank,
            world_size: 4,
            host: "h".into(),
            pid: 1,
            unix_ms: 1,
            trigger: "deadline".into(),
            op: op.map(|(seq, waits)| OpReport {
                collective: "all_reduce".into(),
                seq,
                algo: "ring".into(),
                elapsed_ms: 3000,
                step: Some(3),
                waiting_for: waits
                    .into_iter()
                    .map(|r| Waiting { rank: r, what: "data".into(), step: Some(3), count: 1 })
                    .collect(),
            }),
            last_completed: Some(OpRef { collective: "all_reduce".into(), seq: 4 }),
            peers: vec![],
        }
    }

    fn map(v: Vec<StuckReport>) -> BTreeMap<usize, StuckReport> {
        v.into_iter().map(|r| (r.rank, r)).collect()
    }

    #[test]
    fn a_chain_of_waits_ends_at_the_lossy_link() {
        let mut r1 = report(1, Some((5, vec![2])));
        r1.peers = vec![PeerReport {
            rank: 2,
            dead: None,
            paths: vec![
                PathReport { path: 0, loss_pct: 0.0, ..Default::default() },
                PathReport { path: 2, loss_pct: 100.0, ..Default::default() },
            ],
        }];
        let ranks =
            map(vec![report(0, Some((5, vec![1]))), r1, report(2, Some((5, vec![]))), report(3, Some((5, vec![0])))]);
        assert_eq!(
            diagnose(&ranks),
            "rank 1 is inside all_reduce #5 waiting for rank 2's step 3; path 2 (lane 0) to rank 2 has 100% loss"
        );
    }

    #[test]
    fn a_rank_outside_the_collective_is_named() {
        let ranks = map(vec![
            report(0, Some((5, vec![3]))),
            report(1, Some((5, vec![3]))),
            report(2, Some((5, vec![3]))),
            report(3, None),
        ]);
        assert_eq!(
            diagnose(&ranks),
            "rank 3 never entered all_reduce #5 (last completed all_reduce #4); ranks 0, 1, 2 wait inside it"
        );
    }

    #[test]
    fn a_rank_behind_waiting_for_a_silent_rank_is_a_victim_not_the_cause() {
        // Rank 2 stopped after finishing #5 with rank 1 but not with rank 0: rank 0 still waits
        // for it in #5, rank 1 in #6, and rank 2 wrote nothing.
        let mut r0 = report(0, Some((5, vec![2])));
        r0.world_size = 3;
        let mut r1 = report(1, Some((6, vec![2])));
        r1.world_size = 3;
        assert_eq!(
            diagnose(&map(vec![r0, r1])),
            "rank 2 wrote no report; rank 0 waits inside all_reduce #5 for it and rank 1 waits inside \
             all_reduce #6: it is stopped, hung or dead"
        );
    }

    #[test]
    fn a_cycle_of_waits_names_the_slowest_link() {
        let mut r0 = report(0, Some((5, vec![1])));
        r0.peers =
            vec![PeerReport { rank: 1, dead: None, paths: vec![PathReport { rtt_us: 900, ..Default::default() }] }];
        let ranks =
            map(vec![r0, report(1, Some((5, vec![2]))), report(2, Some((5, vec![3]))), report(3, Some((5, vec![0])))]);
        assert_eq!(
            diagnose(&ranks),
            "all ranks in all_reduce #5; slowest link r0\u{2192}r1 (path 0, rtt 900 us, 0.0% loss)"
        );
    }
}
