//! What `accord bench <collective>` prints: nccl-tests' layout (parameter header, out-of-place
//! and in-place column groups, the out-of-bounds footer and the average bus bandwidth), plus a
//! same-run baseline column, and the same rows as JSON or CSV with the run's metadata on
//! every row.

use super::datapath::Datapath;
use serde::Serialize;
use std::fmt::Write as _;

/// Time and bandwidths of one placement (out-of-place or in-place) of one row.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Placement {
    /// Time per call in microseconds (reduced across ranks as `-a` says).
    pub time_us: f64,
    /// Bytes / time, GB/s (1e9 bytes per second).
    pub algbw_gbps: f64,
    /// algbw times the collective's bus factor, GB/s.
    pub busbw_gbps: f64,
    /// Output elements that differed from the reference, summed over ranks and checked calls.
    pub wrong: u64,
}

/// One size (and dtype, op, root) of the sweep.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    pub bytes: u64,
    pub count: u64,
    pub dtype: String,
    pub op: String,
    pub root: i64,
    pub out_of_place: Placement,
    /// None where the collective has no in-place form here (all_to_all, sendrecv).
    pub in_place: Option<Placement>,
    /// The same-run baseline: one core's memcpy of `bytes` on rank 0, GB/s.
    pub memcpy_gbps: f64,
}

/// The run's parameters and where it ran.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunInfo {
    pub collective: String,
    pub ranks: usize,
    pub host: String,
    pub version: String,
    pub min_bytes: u64,
    pub max_bytes: u64,
    /// `2(factor)` or `1048576(bytes)`, as nccl-tests prints it.
    pub step: String,
    pub warmup: usize,
    pub iters: usize,
    pub check: usize,
    pub average: String,
    pub algo: String,
    pub datapath: Datapath,
}

/// Every wrong element of every row, both placements.
pub fn out_of_bounds(rows: &[Row]) -> u64 {
    rows.iter().map(|r| r.out_of_place.wrong + r.in_place.map_or(0, |p| p.wrong)).sum()
}

/// Mean bus bandwidth over every measured placement, as nccl-tests averages it.
pub fn avg_busbw(rows: &[Row]) -> f64 {
    let all: Vec<f64> = rows
        .iter()
        .flat_map(|r| std::iter::once(r.out_of_place.busbw_gbps).chain(r.in_place.map(|p| p.busbw_gbps)))
        .collect();
    if all.is_empty() {
        0.0
    } else {
        all.iter().sum::<f64>() / all.len() as f64
    }
}

/// The nccl-tests text table.
pub fn to_text(info: &RunInfo, rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# nThread 1 nGpus 1 minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} agg iters: 1 validation: {} graph: 0",
        info.min_bytes,
        info.max_bytes,
        info.step,
        info.warmup,
        info.iters,
        info.check
    );
    let _ = writeln!(s, "#");
    let _ = writeln!(
        s,
        "# accord {} bench {}: {} local ranks (one process each) on {}, host buffers, algorithm {}, time: {}",
        info.version, info.collective, info.ranks, info.host, info.algo, info.average
    );
    let _ = writeln!(s, "# {}", info.datapath.describe());
    let _ = writeln!(s, "#");
    let group = |a: &str, b: &str| format!("{a:>32}{b:>33}");
    let _ = writeln!(s, "# {:>52}{}{:>10}", "", group("out-of-place", "in-place"), "baseline");
    let cols = "    time   algbw   busbw  #wrong";
    let _ = writeln!(
        s,
        "# {:>10} {:>12} {:>8} {:>6} {:>6}   {cols}   {cols}  {:>8}",
        "size", "count", "type", "redop", "root", "memcpy"
    );
    let units = "    (us)  (GB/s)  (GB/s)        ";
    let _ = writeln!(
        s,
        "# {:>10} {:>12} {:>8} {:>6} {:>6}   {units}   {units}  {:>8}",
        "(B)", "(elements)", "", "", "", "(GB/s)"
    );
    let placement = |p: Option<Placement>| match p {
        Some(p) => format!("{:>8.2} {:>7.2} {:>7.2} {:>7}", p.time_us, p.algbw_gbps, p.busbw_gbps, p.wrong),
        None => format!("{:>8} {:>7} {:>7} {:>7}", "N/A", "N/A", "N/A", "N/A"),
    };
    for r in rows {
        let _ = writeln!(
            s,
            "  {:>10} {:>12} {:>8} {:>6} {:>6}   {}   {}  {:>8.2}",
            r.bytes,
            r.count,
            r.dtype,
            r.op,
            r.root,
            placement(Some(r.out_of_place)),
            placement(r.in_place),
            r.memcpy_gbps
        );
    }
    let bad = out_of_bounds(rows);
    let _ = writeln!(s, "# Out of bounds values : {bad} {}", if bad == 0 { "OK" } else { "FAILED" });
    let _ = writeln!(s, "# Avg bus bandwidth    : {:.3}", avg_busbw(rows));
    let _ = writeln!(s, "#");
    let _ = writeln!(
        s,
        "# time: per call; algbw = size / time; busbw = algbw x the bus factor (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all(v) (n-1)/n; others 1);"
    );
    let _ = writeln!(
        s,
        "# #wrong: output elements that differ from the reference ({} checked call(s) per group, 0 = check off); in-place N/A: the collective has no in-place form here;",
        info.check
    );
    let _ = writeln!(
        s,
        "# memcpy: baseline measured in this run, one core copying `size` bytes on rank 0 (the ceiling of one copy)."
    );
    s
}

/// Metadata every JSON and CSV row repeats, so rows from many runs can be pooled.
#[derive(Serialize)]
struct FlatRow<'a> {
    collective: &'a str,
    ranks: usize,
    host: &'a str,
    version: &'a str,
    warmup: usize,
    iters: usize,
    #[serde(flatten)]
    row: &'a Row,
    /// Out-of-place figures repeated at the top level (what older readers of `--json` read).
    time_us: f64,
    algbw_gbps: f64,
    busbw_gbps: f64,
    wrong: u64,
}

fn flat<'a>(info: &'a RunInfo, r: &'a Row) -> FlatRow<'a> {
    FlatRow {
        collective: &info.collective,
        ranks: info.ranks,
        host: &info.host,
        version: &info.version,
        warmup: info.warmup,
        iters: info.iters,
        row: r,
        time_us: r.out_of_place.time_us,
        algbw_gbps: r.out_of_place.algbw_gbps,
        busbw_gbps: r.out_of_place.busbw_gbps,
        wrong: r.out_of_place.wrong,
    }
}

/// One JSON object: the run's parameters, the rows (each with the metadata), the footer.
pub fn to_json(info: &RunInfo, rows: &[Row]) -> String {
    let with_metadata: Vec<FlatRow<'_>> = rows.iter().map(|r| flat(info, r)).collect();
    serde_json::json!({
        "run": info,
        "rows": with_metadata,
        "out_of_bounds": out_of_bounds(rows),
        "avg_busbw_gbps": avg_busbw(rows),
    })
    .to_string()
}

/// Column names of [`to_csv`].
pub const CSV_HEADER: &str = "collective,ranks,host,version,warmup,iters,bytes,count,dtype,op,root,\
oop_time_us,oop_algbw_gbps,oop_busbw_gbps,oop_wrong,ip_time_us,ip_algbw_gbps,ip_busbw_gbps,ip_wrong,memcpy_gbps,datapath";

/// A header line and one line per row; in-place cells are empty where there is none.
pub fn to_csv(info: &RunInfo, rows: &[Row]) -> String {
    let mut s = String::from(CSV_HEADER);
    s.push('\n');
    let clean = |v: &str| v.replace([',', '\n', '"'], "_");
    for r in rows {
        let p = |p: Option<Placement>| match p {
            Some(p) => format!("{:.3},{:.4},{:.4},{}", p.time_us, p.algbw_gbps, p.busbw_gbps, p.wrong),
            None => ",,,".to_string(),
        };
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{:.4},{}",
            clean(&info.collective),
            info.ranks,
            clean(&info.host),
            clean(&info.version),
            info.warmup,
            info.iters,
            r.bytes,
            r.count,
            clean(&r.dtype),
            clean(&r.op),
            r.root,
            p(Some(r.out_of_place)),
            p(r.in_place),
            r.memcpy_gbps,
            clean(info.datapath.name())
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> RunInfo {
        RunInfo {
            collective: "all_reduce".into(),
            ranks: 2,
            host: "h".into(),
            version: "0.1.0".into(),
            min_bytes: 8,
            max_bytes: 16,
            step: "2(factor)".into(),
            warmup: 1,
            iters: 5,
            check: 1,
            average: "mean over ranks".into(),
            algo: "by size".into(),
            datapath: Datapath::default(),
        }
    }

    fn row(wrong: u64, in_place: bool) -> Row {
        let p = Placement { time_us: 10.0, algbw_gbps: 1.0, busbw_gbps: 2.0, wrong };
        Row {
            bytes: 8,
            count: 2,
            dtype: "float".into(),
            op: "sum".into(),
            root: -1,
            out_of_place: p,
            in_place: in_place.then_some(Placement { busbw_gbps: 4.0, ..p }),
            memcpy_gbps: 5.0,
        }
    }

    #[test]
    fn footer_counts_both_groups() {
        let text = to_text(&info(), &[row(0, true), row(2, true)]);
        assert!(text.contains("# Out of bounds values : 4 FAILED"), "{text}");
        assert!(text.contains("# Avg bus bandwidth    : 3.000"), "{text}");
        let ok = to_text(&info(), &[row(0, false)]);
        assert!(ok.contains("# Out of bounds values : 0 OK"), "{ok}");
        assert!(ok.contains("N/A"), "{ok}");
    }

    #[test]
    fn json_and_csv_rows_carry_the_metadata() {
        let j: serde_json::Value = serde_json::from_str(&to_json(&info(), &[row(0, true)])).unwrap();
        let r = &j["rows"][0];
        for key in ["dtype", "op", "ranks", "iters", "warmup", "host", "version", "collective"] {
            assert!(!r[key].is_null(), "{key} missing in {r}");
        }
        assert_eq!(r["in_place"]["busbw_gbps"], 4.0);
        let csv = to_csv(&info(), &[row(0, false)]);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].split(',').count(), lines[1].split(',').count());
    }
}
