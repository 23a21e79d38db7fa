//! `accord bench` as nccl-tests' users call it: the same flags give the same layout (parameter
//! header, out-of-place and in-place groups, the out-of-bounds footer), a wrong value turns the
//! exit status non-zero, the machine-readable forms carry the run's metadata, `--plot` writes a
//! valid SVG with the expected series, and `RUST_LOG` shows the engine's events.

use std::process::{Command, Output};

fn accord(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_accord"))
        .args(args)
        .envs(env.iter().copied())
        .env("ACCORD_COLL_TIMEOUT_MS", "20000")
        .output()
        .expect("run accord")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
}

/// The command line, with a small rank count.
const NCCL_TESTS_ARGS: [&str; 18] =
    ["-b", "8", "-e", "1M", "-f", "2", "-n", "5", "-w", "1", "-c", "1", "-d", "float", "-o", "sum", "--ranks", "2"];

fn all_reduce(extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut args = vec!["bench", "all-reduce"];
    args.extend_from_slice(&NCCL_TESTS_ARGS);
    args.extend_from_slice(extra);
    accord(&args, env)
}

#[test]
fn nccl_tests_arguments_give_nccl_tests_layout() {
    let out = all_reduce(&[], &[]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("# nThread 1 nGpus 1 minBytes 8 maxBytes 1048576 step: 2(factor) warmup iters: 1 iters: 5"),
        "{t}"
    );
    assert!(t.contains("validation: 1"), "{t}");
    assert!(t.contains("out-of-place") && t.contains("in-place"), "{t}");
    assert!(t.contains("# datapath: "), "{t}");
    let header = t.lines().find(|l| l.contains("#wrong")).expect("column header");
    assert_eq!(header.matches("#wrong").count(), 2, "{header}");
    assert_eq!(header.matches("busbw").count(), 2, "{header}");
    // 8 B .. 1 MiB doubling: 18 rows, each with both groups and the baseline (14 cells).
    let rows: Vec<&str> = t.lines().filter(|l| l.starts_with("  ") && !l.trim().is_empty()).collect();
    assert_eq!(rows.len(), 18, "{t}");
    for r in &rows {
        let cells: Vec<&str> = r.split_whitespace().collect();
        assert_eq!(cells.len(), 14, "{r}");
        assert_eq!(&cells[2..4], ["float", "sum"], "{r}");
        assert_eq!((cells[8], cells[12]), ("0", "0"), "wrong values in {r}");
    }
    assert!(t.contains("# Out of bounds values : 0 OK"), "{t}");
    assert!(t.contains("# Avg bus bandwidth    : "), "{t}");
}

#[test]
fn an_injected_wrong_value_fails_the_run() {
    let out = all_reduce(&["-e", "64"], &[("ACCORD_BENCH_CORRUPT", "1")]);
    let t = text(&out);
    assert!(!out.status.success(), "exit 0 despite a wrong value:\n{t}");
    assert!(t.contains("# Out of bounds values : ") && t.contains(" FAILED"), "{t}");
    // Without the injection the same run passes (the failure came from the injected value).
    assert!(all_reduce(&["-e", "64"], &[]).status.success());
}

#[test]
fn json_and_csv_rows_carry_the_run_metadata() {
    let out = all_reduce(&["-e", "64", "--json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let line = String::from_utf8_lossy(&out.stdout).lines().find(|l| l.starts_with('{')).expect("JSON").to_string();
    let v: serde_json::Value = serde_json::from_str(&line).expect("one JSON object");
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 4);
    for r in rows {
        assert_eq!(r["dtype"], "float");
        assert_eq!(r["op"], "sum");
        assert_eq!(r["ranks"], 2);
        assert_eq!(r["iters"], 5);
        assert_eq!(r["warmup"], 1);
        assert!(r["host"].as_str().is_some_and(|h| !h.is_empty()));
        assert_eq!(r["version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(r["in_place"]["wrong"], 0);
    }
    assert_eq!(v["out_of_bounds"], 0);

    let out = all_reduce(&["-e", "64", "--csv"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let csv = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 5, "{csv}");
    let header: Vec<&str> = lines[0].split(',').collect();
    for col in ["dtype", "op", "ranks", "iters", "warmup", "host", "version"] {
        assert!(header.contains(&col), "{col} missing from {}", lines[0]);
    }
    for l in &lines[1..] {
        assert_eq!(l.split(',').count(), header.len(), "{l}");
    }
}

#[test]
fn refused_nccl_tests_values_say_why() {
    let out = accord(&["bench", "all-reduce", "-g", "2"], &[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("--ranks"), "{}", text(&out));
    let out = accord(&["bench", "all-reduce", "-b", "1X"], &[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("unknown unit"), "{}", text(&out));
}

/// Names of the legend entries and the number of polylines in an SVG `plotters` wrote.
fn svg_series(path: &std::path::Path) -> (Vec<String>, usize) {
    let body = std::fs::read_to_string(path).expect("the plot file");
    let doc = roxmltree::Document::parse(&body).expect("valid XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    let texts = root
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_string())
        .collect();
    let lines = root.descendants().filter(|n| n.has_tag_name("polyline")).count();
    (texts, lines)
}

#[test]
fn plot_writes_an_svg_with_the_bench_and_baseline_series() {
    let dir = std::env::temp_dir().join(format!("accord-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("all_reduce.svg");
    let out = all_reduce(&["-b", "1K", "-e", "64K", "-f", "4", "--plot", path.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let (texts, polylines) = svg_series(&path);
    for name in ["accord busbw, out-of-place", "accord busbw, in-place", "baseline: memcpy, one core (same run)"] {
        assert!(texts.iter().any(|t| t == name), "legend lacks {name:?}: {texts:?}");
    }
    // Three data lines and three legend swatches.
    assert!(polylines >= 6, "{polylines} polylines");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn rust_log_debug_shows_engine_events() {
    let out = accord(
        &["bench", "all-reduce", "--ranks", "2", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0"],
        &[("RUST_LOG", "debug")],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("DEBUG") && err.contains("accord_engine"), "no engine events on stderr:\n{err}");
    // And without it, the same run prints no debug lines.
    let quiet = accord(&["bench", "all-reduce", "--ranks", "2", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0"], &[]);
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("DEBUG"));
}

/// The exact command: the p2p benchmark's engines (both processes) log at debug. The
/// same run plots throughput against size with both baselines, and its header names the
/// datapath.
#[test]
fn rust_log_debug_accord_bench_p2p_prints_engine_events() {
    let path = std::env::temp_dir().join(format!("accord-p2p-{}.svg", std::process::id()));
    let out = accord(&["bench", "p2p", "--plot", path.to_str().unwrap()], &[("RUST_LOG", "debug")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("DEBUG") && err.contains("accord_engine") && err.contains("engine started"), "{err}");
    assert!(err.contains("peer added"), "{err}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("# datapath of the accord columns: "), "{table}");
    assert!(table.contains("one_write_us") && !table.contains("lat_us"), "{table}");
    let (texts, polylines) = svg_series(&path);
    std::fs::remove_file(&path).unwrap();
    for name in
        ["accord (default datapath)", "baseline: TCP stream (same run)", "baseline: accord over kernel UDP (same run)"]
    {
        assert!(texts.iter().any(|t| t == name), "legend lacks {name:?}: {texts:?}");
    }
    assert!(polylines >= 6, "{polylines} polylines");
}
