//! `--plot FILE`: SVG charts of what a command measured, drawn with `plotters`' SVG backend
//! (no system fonts needed: the SVG names a font family and the viewer renders the text).
//!
//! - `accord bench <collective>`: bus bandwidth against size, out-of-place and in-place, with
//!   the same-run memcpy baseline.
//! - `accord bench p2p`: Accord's throughput against write size, with the TCP and kernel-UDP
//!   baselines of the same run.
//! - `accord sim permutation`: the CDF of flow completion times, with the line-rate ideal.

use crate::bench::report::{Row, RunInfo};
use accord_bench::p2p::P2pRow;
use plotters::prelude::*;
use std::path::Path;

/// Pixel size of every chart.
const SIZE: (u32, u32) = (900, 560);

/// One named line of points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

fn err(path: &Path) -> impl Fn(String) -> String + '_ {
    move |e| format!("writing the plot {}: {e}", path.display())
}

/// Draws `series` on log-2 x (sizes) or linear x, linear y, with a legend naming each series.
fn draw(path: &Path, title: &str, x_label: &str, y_label: &str, log_x: bool, series: &[Series]) -> Result<(), String> {
    let all = || series.iter().flat_map(|s| s.points.iter().copied());
    if all().next().is_none() {
        return Err(format!("nothing to plot in {}", path.display()));
    }
    let (mut x0, mut x1) = all().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), (x, _)| (a.min(x), b.max(x)));
    let y1 = all().fold(0.0f64, |m, (_, y)| m.max(y)).max(1e-9) * 1.1;
    if x1 <= x0 {
        x1 = x0 * 2.0 + 1.0;
    }
    if log_x {
        x0 = x0.max(1.0);
    }
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path)(e.to_string()))?;
    let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    let mut builder = ChartBuilder::on(&root);
    builder.caption(title, ("sans-serif", 20)).margin(15).x_label_area_size(45).y_label_area_size(60);
    macro_rules! finish {
        ($chart:expr) => {{
            let mut chart = $chart.map_err(|e| err(path)(e.to_string()))?;
            chart
                .configure_mesh()
                .x_desc(x_label)
                .y_desc(y_label)
                .x_label_formatter(&|x: &f64| if log_x { bytes_label(*x) } else { format!("{x:.0}") })
                .draw()
                .map_err(|e| err(path)(e.to_string()))?;
            for (i, s) in series.iter().enumerate() {
                let color = colors[i % colors.len()];
                chart
                    .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))
                    .map_err(|e| err(path)(e.to_string()))?
                    .label(s.name.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(|e| err(path)(e.to_string()))?;
        }};
    }
    if log_x {
        finish!(builder.build_cartesian_2d((x0..x1).log_scale(), 0.0..y1));
    } else {
        finish!(builder.build_cartesian_2d(x0..x1, 0.0..y1));
    }
    root.present().map_err(|e| err(path)(e.to_string()))
}

/// `4K`, `1M`, `64M` for a size axis (powers of 1024, as the bench's flags read them).
fn bytes_label(x: f64) -> String {
    let units = [(1u64 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")];
    for (scale, unit) in units {
        if x >= scale as f64 {
            return format!("{}{unit}", (x / scale as f64 * 10.0).round() / 10.0);
        }
    }
    format!("{x:.0}")
}

/// Bus bandwidth against size for the rows of the first dtype/op/root, and the baseline.
pub fn bench_chart(path: &Path, info: &RunInfo, rows: &[Row]) -> Result<(), String> {
    let first = rows.first().ok_or("no rows to plot")?;
    let same = |r: &&Row| r.dtype == first.dtype && r.op == first.op && r.root == first.root;
    let rows: Vec<&Row> = rows.iter().filter(same).collect();
    let mut series = vec![Series {
        name: "accord busbw, out-of-place".into(),
        points: rows.iter().map(|r| (r.bytes as f64, r.out_of_place.busbw_gbps)).collect(),
    }];
    if rows.iter().all(|r| r.in_place.is_some()) {
        series.push(Series {
            name: "accord busbw, in-place".into(),
            points: rows.iter().filter_map(|r| r.in_place.map(|p| (r.bytes as f64, p.busbw_gbps))).collect(),
        });
    }
    series.push(Series {
        name: "baseline: memcpy, one core (same run)".into(),
        points: rows.iter().map(|r| (r.bytes as f64, r.memcpy_gbps)).collect(),
    });
    let title = format!(
        "accord bench {} ({} ranks, {}, {}) on {}: {}",
        info.collective,
        info.ranks,
        first.dtype,
        first.op,
        info.host,
        info.datapath.name()
    );
    draw(path, &title, "size (bytes)", "GB/s", true, &series)
}

/// Throughput against write size for the `write` rows of `accord bench p2p`.
pub fn p2p_chart(path: &Path, rows: &[P2pRow]) -> Result<(), String> {
    let writes: Vec<&P2pRow> = rows.iter().filter(|r| r.op == "write").collect();
    let line = |name: &str, f: fn(&P2pRow) -> f64| Series {
        name: name.into(),
        points: writes.iter().map(|r| (r.bytes as f64, f(r))).collect(),
    };
    let series = [
        line("accord (default datapath)", |r| r.accord_gbps),
        line("baseline: TCP stream (same run)", |r| r.tcp_gbps),
        line("baseline: accord over kernel UDP (same run)", |r| r.udp_gbps),
    ];
    draw(path, "accord bench p2p: one-sided writes between two processes", "write size (bytes)", "GB/s", true, &series)
}

/// Empirical CDF of flow completion times, with the line-rate ideal as a vertical line.
pub fn fct_cdf_chart(path: &Path, title: &str, fcts_us: &[f64], ideal_us: f64) -> Result<(), String> {
    let mut sorted = fcts_us.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len().max(1) as f64;
    let cdf: Vec<(f64, f64)> = sorted.iter().enumerate().map(|(i, &t)| (t, (i + 1) as f64 / n)).collect();
    let series = [
        Series { name: "flow completion time CDF".into(), points: cdf },
        Series { name: "line-rate ideal".into(), points: vec![(ideal_us, 0.0), (ideal_us, 1.0)] },
    ];
    draw(path, title, "flow completion time (us)", "fraction of flows", false, &series)
}
