//! nccl-tests bandwidth math and result tables, for the `accord bench` CLI.
//!
//! `algbw = bytes / time`; `busbw = algbw * factor`, where the factor makes
//! the number comparable to link bandwidth (what each rank's busiest link
//! carries): all_reduce `2(n-1)/n`; all_gather, reduce_scatter and
//! all_to_all `(n-1)/n`; broadcast, reduce and sendrecv `1`. For all_gather
//! and reduce_scatter, `bytes` is the total (`n x` per-rank) size, as in
//! nccl-tests.

use std::fmt::Write as _;

use serde::Serialize;

use crate::algo::Collective;

/// The bus-bandwidth factor of `collective` on `n` ranks.
pub fn busbw_factor(collective: Collective, n: usize) -> f64 {
    let n = n.max(1) as f64;
    match collective {
        Collective::AllReduce => 2.0 * (n - 1.0) / n,
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll | Collective::AllToAllV => {
            (n - 1.0) / n
        }
        Collective::Broadcast | Collective::Reduce | Collective::SendRecv => 1.0,
        Collective::Barrier => 0.0,
    }
}

/// Algorithm bandwidth in GB/s (10^9 bytes per second); 0 for a zero time.
pub fn algbw_gbps(bytes: u64, time_us: f64) -> f64 {
    if time_us <= 0.0 {
        return 0.0;
    }
    bytes as f64 / (time_us * 1e-6) / 1e9
}

/// Bus bandwidth in GB/s.
pub fn busbw_gbps(collective: Collective, n: usize, bytes: u64, time_us: f64) -> f64 {
    algbw_gbps(bytes, time_us) * busbw_factor(collective, n)
}

/// One measured size.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BenchRow {
    /// Bytes (nccl-tests `size`).
    pub bytes: u64,
    /// Elements (`count`).
    #[serde(skip)]
    pub count: u64,
    /// Mean time per iteration in microseconds.
    pub time_us: f64,
    /// Algorithm bandwidth, GB/s.
    pub algbw_gbps: f64,
    /// Bus bandwidth, GB/s.
    pub busbw_gbps: f64,
    /// Wrong elements found by the check.
    pub wrong: u64,
}

impl BenchRow {
    /// A row with both bandwidths computed.
    pub fn new(collective: Collective, n: usize, bytes: u64, count: u64, time_us: f64, wrong: u64) -> BenchRow {
        BenchRow {
            bytes,
            count,
            time_us,
            algbw_gbps: algbw_gbps(bytes, time_us),
            busbw_gbps: busbw_gbps(collective, n, bytes, time_us),
            wrong,
        }
    }
}

/// A table of rows for one collective.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BenchTable {
    /// The collective's name.
    pub collective: String,
    /// dtype name (`float`, ...).
    #[serde(skip)]
    pub dtype: String,
    /// Reduction op name, or `none`.
    #[serde(skip)]
    pub redop: String,
    /// Root rank, or -1 where there is none.
    #[serde(skip)]
    pub root: i64,
    /// Measured rows.
    pub rows: Vec<BenchRow>,
}

impl BenchTable {
    /// The nccl-tests text table:
    /// `size count type redop root time algbw busbw #wrong`.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# collective: {}", self.collective);
        let _ = writeln!(
            s,
            "# {:>10} {:>12} {:>8} {:>6} {:>6} {:>9} {:>8} {:>8} {:>7}",
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"
        );
        let _ = writeln!(
            s,
            "# {:>10} {:>12} {:>8} {:>6} {:>6} {:>9} {:>8} {:>8} {:>7}",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", ""
        );
        for r in &self.rows {
            let _ = writeln!(
                s,
                "  {:>10} {:>12} {:>8} {:>6} {:>6} {:>9.2} {:>8.2} {:>8.2} {:>7}",
                r.bytes, r.count, self.dtype, self.redop, self.root, r.time_us, r.algbw_gbps, r.busbw_gbps, r.wrong
            );
        }
        if !self.rows.is_empty() {
            let avg = self.rows.iter().map(|r| r.busbw_gbps).sum::<f64>() / self.rows.len() as f64;
            let _ = writeln!(s, "# Avg bus bandwidth    : {avg:.3}");
        }
        s
    }

    /// `{"collective":..,"rows":[{"bytes":..,"time_us":..,"algbw_gbps":..,"busbw_gbps":..,"wrong":..}]}`.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plain data serialises")
    }
}

#[cfg(test)]
mod tests;
