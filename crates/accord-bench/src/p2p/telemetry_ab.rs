//! `accord bench p2p --telemetry-ab`: what telemetry costs a write, measured inside one pair of
//! processes. Separate runs with telemetry off and on differ by more than telemetry's cost
//! (placement, which core a worker lands on; `scripts/telemetry-overhead.sh` in
//! docs/results/2026-11-26-never-hang.md), so here each size runs as many short blocks of pipelined writes, recording paused and on in
//! turn ([`accord_engine::telemetry::set_recording`], in both processes at once), on the same
//! engines and connections. Pairs alternate their order (paused first, then on first, ...),
//! so a drift over the run favours neither side. Each pair gives one ratio, on rate over paused
//! rate; the median of the ratios and its order-statistics interval ([`crate::paired`]) are
//! judged against the 3% target.
//!
//! Telemetry must be turned on by the environment as usual (`ACCORD_METRICS_ADDR`,
//! `ACCORD_TRACE_FILE`): paused, the engines skip what telemetry does per transfer; the
//! endpoint's thread and the trace stay up in both arms.

use super::{
    checked_sizes, engine_err, paged_layout, read_byte, send_cmd, submit_paged, submit_write, with_second_process,
    BenchError, P2pOptions, Parent, Side, OP_RECORDING, SIDE_DEFAULT,
};
use crate::paired::{self, median, median_interval, Verdict};
use accord_engine::Transfer;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Pairs per size unless asked otherwise: with 40 the interval is the 15th to the 26th
/// smallest ratio (92% coverage).
pub const PAIRS_DEFAULT: usize = 40;
/// Fewest pairs: with fewer, even the min..max interval covers the median less than 90% of the time.
pub const PAIRS_MIN: usize = 5;
/// A block is grown until it takes at least this long: timed well above the clock's and the
/// scheduler's granularity.
pub const BLOCK_TARGET: Duration = Duration::from_millis(5);
/// Fewest writes a block pipelines (the p2p table's rows pipeline at least two as well).
const WRITES_PER_BLOCK_MIN: u64 = 2;
/// Most: 2000 (the p2p table's most) 4 KiB writes took 1.9 ms on the 2-core development
/// machine (`ACCORD_METRICS_ADDR=127.0.0.1:0 accord-p2p-bench --telemetry-ab --pairs 20`, with
/// that cap), under the block target; submissions past the engine's queue wait for room.
const WRITES_PER_BLOCK_MAX: u64 = 8192;
/// The target: recording costs under 3% (ratio on/paused at least this).
pub const COST_TARGET: f64 = 0.97;
/// Transfers the warm-up records (4 pipelined and 4 lone writes on each of the two engines).
const WARMUP_WRITES: u64 = 16;
/// Options of the A/B run.
#[derive(Clone, Debug)]
pub struct AbOptions {
    /// Sizes, paged row and loss, as for the p2p table.
    pub p2p: P2pOptions,
    /// Pairs of blocks (one paused, one recording) per size.
    pub pairs: usize,
}

impl Default for AbOptions {
    fn default() -> Self {
        AbOptions { p2p: P2pOptions::default(), pairs: PAIRS_DEFAULT }
    }
}

/// One size's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AbRow {
    /// `write` or `paged`, as in the p2p table.
    pub op: String,
    /// Bytes per write.
    pub bytes: u64,
    /// Writes pipelined in each block.
    pub writes_per_block: u64,
    /// Median block duration, milliseconds (both arms).
    pub block_ms: f64,
    /// Median rate of the paused blocks, GB/s (1e9 bytes per second).
    pub paused_gbps: f64,
    /// Median rate of the recording blocks, GB/s.
    pub on_gbps: f64,
    /// Each pair's on rate over its paused rate, in the order the pairs ran.
    pub ratios: Vec<f64>,
    /// Median of `ratios`.
    pub ratio: f64,
    /// The interval that bounds the median ratio.
    pub low: f64,
    /// Its upper end.
    pub high: f64,
    /// Probability that `low..=high` holds the median ratio.
    pub coverage: f64,
    /// `met`, `missed`, `unresolved` or `too few pairs`, against [`COST_TARGET`].
    pub verdict: String,
    /// Writes this size made with recording on: the sizing blocks and the recording blocks.
    pub writes_recorded: u64,
}

/// The A/B run's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AbReport {
    /// Whether the environment turned the metrics endpoint on.
    pub metrics: bool,
    /// Whether it turned the trace on.
    pub trace: bool,
    /// Pairs per size.
    pub pairs: usize,
    /// The target ratio.
    pub target: f64,
    /// One row per size.
    pub rows: Vec<AbRow>,
    /// Transfers the first process's engines made with recording on in the whole run
    /// (warm-up included): what its trace holds and its `transfer` histogram counts.
    pub writes_recorded: u64,
}

/// Which telemetry the environment turns on: (metrics endpoint, trace).
fn telemetry_from_env() -> Result<(bool, bool), BenchError> {
    let config =
        accord_engine::EngineConfig::default().with_overrides_from(|n| std::env::var(n).ok()).map_err(engine_err)?;
    Ok((config.metrics_addr.is_some(), config.trace_file.is_some()))
}

/// Runs the A/B: spawns the second process, then per size (and the paged row) sizes a block
/// and runs `opts.pairs` pairs of blocks.
pub fn run_telemetry_ab(opts: &AbOptions) -> Result<AbReport, BenchError> {
    if !(PAIRS_MIN..=paired::RATIOS_MAX).contains(&opts.pairs) {
        return Err(BenchError::Options(format!(
            "pairs {} must be in {PAIRS_MIN}..={}",
            opts.pairs,
            paired::RATIOS_MAX
        )));
    }
    let (max, paged_total) = checked_sizes(&opts.p2p)?;
    let (metrics, trace) = telemetry_from_env()?;
    if !metrics && !trace {
        return Err(BenchError::Options(
            "--telemetry-ab compares recording paused and on: turn telemetry on with ACCORD_METRICS_ADDR \
             (e.g. 127.0.0.1:0) and/or ACCORD_TRACE_FILE"
                .into(),
        ));
    }
    let rows = with_second_process(opts.p2p.loss, max, |p| {
        let rows = all_rows(opts, p, paged_total);
        // Leave both processes recording, as their environment asked, however the rows went.
        let resumed = p.set_recording(true);
        let rows = rows?;
        resumed.map(|()| rows)
    })?;
    let writes_recorded = WARMUP_WRITES + rows.iter().map(|r| r.writes_recorded).sum::<u64>();
    Ok(AbReport { metrics, trace, pairs: opts.pairs, target: COST_TARGET, rows, writes_recorded })
}

fn all_rows(opts: &AbOptions, p: &mut Parent, paged_total: u64) -> Result<Vec<AbRow>, BenchError> {
    let mut rows = vec![];
    for (i, &bytes) in opts.p2p.sizes.iter().enumerate() {
        let imm = 100 + i as u32;
        let row = size_row(p, "write", bytes, opts.pairs, imm, &|s| submit_write(s, bytes, imm))
            .map_err(|e| BenchError::Engine(format!("writes of {bytes} bytes: {e}")))?;
        rows.push(row);
    }
    if let Some(page) = opts.p2p.paged_page_bytes {
        let (src_pages, dst_pages) = paged_layout(opts.p2p.paged_pages);
        let imm = 99;
        let submit = |s: &Side| submit_paged(s, page, &src_pages, &dst_pages, imm);
        rows.push(size_row(p, "paged", paged_total, opts.pairs, imm, &submit)?);
    }
    Ok(rows)
}

impl Parent {
    /// Pauses or resumes recording here and in the second process; returns once both did.
    fn set_recording(&mut self, on: bool) -> Result<(), BenchError> {
        accord_engine::telemetry::set_recording(on);
        send_cmd(&mut self.tcp, OP_RECORDING, u64::from(on), 0)?;
        match read_byte(&mut self.tcp)? {
            1 => Ok(()),
            other => Err(BenchError::Engine(format!("the second process answered {other} to a recording switch"))),
        }
    }

    /// Seconds `n` pipelined writes take, all awaited, on the engine under test.
    fn block(&self, n: u64, submit: &dyn Fn(&Side) -> Result<Transfer, BenchError>) -> Result<f64, BenchError> {
        self.pipelined(SIDE_DEFAULT, n, submit)
    }
}

/// One size: a block sized to [`BLOCK_TARGET`] (recording, as the environment set it), then
/// `pairs` pairs, then the second process's count of the writes' immediates checked.
fn size_row(
    p: &mut Parent,
    op: &str,
    bytes: u64,
    pairs: usize,
    imm: u32,
    submit: &dyn Fn(&Side) -> Result<Transfer, BenchError>,
) -> Result<AbRow, BenchError> {
    let (n, sizing_writes) = writes_per_block(p, submit)?;
    // Blocks' seconds by arm: [paused, recording].
    let mut secs: [Vec<f64>; 2] = [vec![], vec![]];
    let mut ratios = vec![];
    let mut recording = true;
    for i in 0..pairs {
        let order = if i % 2 == 0 { [false, true] } else { [true, false] };
        let mut pair = [0.0; 2];
        for on in order {
            if on != recording {
                p.set_recording(on)?;
                recording = on;
            }
            pair[usize::from(on)] = p.block(n, submit)?;
        }
        // On rate over paused rate: the same bytes, so paused seconds over on seconds.
        ratios.push(pair[0] / pair[1]);
        secs[0].push(pair[0]);
        secs[1].push(pair[1]);
    }
    p.set_recording(true)?;
    p.verify(SIDE_DEFAULT, imm, sizing_writes + 2 * n * pairs as u64)?;
    let interval = median_interval(&ratios)
        .ok_or_else(|| BenchError::Engine(format!("{op} {bytes}: a block took no measurable time")))?;
    let gbps = |s: &[f64]| (bytes * n) as f64 / median(s) / 1e9;
    let both: Vec<f64> = secs.concat();
    Ok(AbRow {
        op: op.into(),
        bytes,
        writes_per_block: n,
        block_ms: median(&both) * 1e3,
        paused_gbps: gbps(&secs[0]),
        on_gbps: gbps(&secs[1]),
        ratio: interval.median,
        low: interval.low,
        high: interval.high,
        coverage: interval.coverage,
        verdict: Verdict::of(&interval, COST_TARGET).word().into(),
        ratios,
        writes_recorded: sizing_writes + n * pairs as u64,
    })
}

/// Grows a block from [`WRITES_PER_BLOCK_MIN`] writes until it takes [`BLOCK_TARGET`] (or
/// holds [`WRITES_PER_BLOCK_MAX`] writes); returns (writes per block, writes made while
/// sizing). Each candidate runs twice and the faster run counts: a first block that pays for
/// something once (pages, a window growing) does not make the blocks too short.
fn writes_per_block(
    p: &Parent,
    submit: &dyn Fn(&Side) -> Result<Transfer, BenchError>,
) -> Result<(u64, u64), BenchError> {
    let target = BLOCK_TARGET.as_secs_f64();
    let mut n = WRITES_PER_BLOCK_MIN;
    let mut written = 0;
    loop {
        let secs = p.block(n, submit)?.min(p.block(n, submit)?);
        written += 2 * n;
        if secs >= target || n >= WRITES_PER_BLOCK_MAX {
            return Ok((n, written));
        }
        let grow = (target / secs.max(1e-7)).clamp(1.5, 8.0);
        n = ((n as f64 * grow).ceil() as u64).min(WRITES_PER_BLOCK_MAX);
    }
}

/// The table `--telemetry-ab` prints.
pub fn format_ab_table(report: &AbReport) -> String {
    let on = |b: bool| if b { "on" } else { "off" };
    let mut out = format!(
        "# telemetry A/B: one pair of processes, the same engines and connections; per size {} pairs of blocks, \
         recording paused and on (order alternating per pair), both processes switched together\n",
        report.pairs
    );
    out += &format!(
        "# telemetry from the environment: metrics endpoint {}, trace {}; ratio = on/paused rate, 1.000 = no cost\n",
        on(report.metrics),
        on(report.trace)
    );
    out += &format!(
        "{:>6} {:>10} {:>7} {:>9} {:>11} {:>9} {:>7} {:>15} {:>8}  verdict (<{:.0}%)\n",
        "op",
        "bytes",
        "writes",
        "block_ms",
        "paused_GBps",
        "on_GBps",
        "ratio",
        "interval",
        "coverage",
        (1.0 - report.target) * 100.0
    );
    for r in &report.rows {
        out += &format!(
            "{:>6} {:>10} {:>7} {:>9.2} {:>11.3} {:>9.3} {:>7.3} {:>15} {:>7.0}%  {}\n",
            r.op,
            r.bytes,
            r.writes_per_block,
            r.block_ms,
            r.paused_gbps,
            r.on_gbps,
            r.ratio,
            format!("{:.3}..{:.3}", r.low, r.high),
            r.coverage * 100.0,
            r.verdict
        );
    }
    let ratios: Vec<f64> = report.rows.iter().map(|r| r.ratio).filter(|r| *r > 0.0).collect();
    if !ratios.is_empty() {
        let geo = (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp();
        out += &format!("geometric mean of the sizes' median ratios: {geo:.3}\n");
    }
    out += "# writes: pipelined writes per block, grown until a block takes 5 ms; block_ms: median block time\n";
    out += "# paused_GBps, on_GBps: median block rate of each arm; ratio: median over pairs of on/paused\n";
    out += "# interval: order statistics of the pairs' ratios that hold the median ratio with `coverage`;\n";
    out += "#   met = interval at or above the target, missed = below it, unresolved = across it\n";
    out
}

/// The `--json` form: `{"telemetry_ab": {"metrics", "trace", "pairs", "target", "rows": [..],
/// "writes_recorded"}}`; `scripts/telemetry_overhead_summary.py --ab FILE` reads it.
pub fn format_ab_json(report: &AbReport) -> String {
    serde_json::json!({ "telemetry_ab": report }).to_string()
}
