//! `accord sim ...` prints a table, and exactly one JSON object with `--json`.

use std::process::Command;

fn accord(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_accord")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

/// Runs `accord` with `args` (which include `--json`), expects success, returns its one object.
fn accord_json(args: &[&str]) -> serde_json::Value {
    let (ok, stdout, stderr) = accord(args);
    assert!(ok, "{stderr}");
    serde_json::from_str(stdout.trim()).expect("one JSON object")
}

#[test]
fn loss_sweep_json_has_the_issue_shape() {
    let v = accord_json(&["sim", "loss-sweep", "--bytes", "1048576", "--json"]);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6);
    for row in rows {
        for field in ["loss", "accord_goodput_pct", "gbn_goodput_pct"] {
            assert!(row[field].is_number(), "{field} missing in {row}");
        }
    }
    assert_eq!(rows[0]["accord_goodput_pct"].as_f64(), Some(100.0));
}

#[test]
fn path_cut_completes_and_reports_recovery() {
    let (ok, stdout, stderr) = accord(&["sim", "path-cut", "--bytes", "8388608", "--json"]);
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["completed"], true);
    assert!(v["recovered_goodput_pct"].as_f64().unwrap() > 0.0);
}

#[test]
fn table_output_and_bad_arguments() {
    let (ok, stdout, _) = accord(&["sim", "loss-sweep", "--bytes", "1048576"]);
    assert!(ok && stdout.contains("accord_goodput_%"));
    let (ok, _, stderr) = accord(&["sim", "loss-sweep", "--cc", "bbr"]);
    assert!(!ok && stderr.contains("unknown congestion control"));
    let (ok, _, stderr) = accord(&["sim", "path-cut", "--paths", "1"]);
    assert!(!ok && stderr.contains("at least 2"));
}

#[test]
fn permutation_json_has_the_issue_shape_and_is_repeatable() {
    let args = [
        "sim",
        "permutation",
        "--nodes",
        "16",
        "--bytes",
        "200000",
        "--paths",
        "16",
        "--cc",
        "cubic",
        "--checked",
        "--json",
    ];
    let (ok, stdout, stderr) = accord(&args);
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let ideal = v["ideal_us"].as_f64().unwrap();
    assert!((ideal - 4.0).abs() < 1e-6, "200 kB at 400 Gbit/s is 4 us, got {ideal}");
    let fct = &v["fct_us"];
    let (min, p50, p99, max) = (
        fct["min"].as_f64().unwrap(),
        fct["p50"].as_f64().unwrap(),
        fct["p99"].as_f64().unwrap(),
        fct["max"].as_f64().unwrap(),
    );
    assert!(ideal <= min && min <= p50 && p50 <= p99 && p99 <= max, "{fct}");
    assert!((v["slowdown_max"].as_f64().unwrap() - max / ideal).abs() < 1e-6);
    assert!(v["events"].as_u64().unwrap() > 0 && v["wall_s"].is_number());
    // Same seed, same result.
    let (ok, again, stderr) = accord(&args);
    assert!(ok, "{stderr}");
    let w: serde_json::Value = serde_json::from_str(again.trim()).unwrap();
    assert_eq!(v["hash"], w["hash"]);
    assert_eq!(v["fct_us"], w["fct_us"]);
}

#[test]
fn permutation_table_and_bad_arguments() {
    let (ok, stdout, stderr) = accord(&["sim", "permutation", "--nodes", "8", "--bytes", "100000", "--paths", "8"]);
    assert!(ok && stdout.contains("slowdown_max"), "{stderr}");
    let (ok, _, stderr) = accord(&["sim", "permutation", "--nodes", "1"]);
    assert!(!ok && stderr.contains("at least 2"));
    let (ok, _, stderr) = accord(&["sim", "permutation", "--nodes", "8", "--cc", "bbr"]);
    assert!(!ok && stderr.contains("unknown congestion control"));
    let (ok, _, stderr) = accord(&["sim", "permutation", "--nodes", "8", "--queue", "magic"]);
    assert!(!ok && stderr.contains("unknown queue policy"));
}

#[test]
fn sizes_parse_alike_in_sim_and_bench() {
    // 1 MiB written three ways gives the same deterministic run.
    let runs: Vec<String> = ["1048576", "1M", "1MiB"]
        .iter()
        .map(|b| {
            let (ok, stdout, stderr) = accord(&["sim", "loss-sweep", "--bytes", b, "--json"]);
            assert!(ok, "--bytes {b}: {stderr}");
            stdout
        })
        .collect();
    assert!(runs.windows(2).all(|w| w[0] == w[1]));
    let (ok, _, _) = accord(&["sim", "permutation", "--nodes", "16", "--bytes", "64KB", "--json"]);
    assert!(ok, "--bytes 64KB refused");
    let (ok, _, stderr) = accord(&["sim", "loss-sweep", "--bytes", "64XB"]);
    assert!(!ok && stderr.contains("unknown unit"), "{stderr}");
}

#[test]
fn permutation_plot_is_an_fct_cdf_with_one_point_per_flow() {
    let path = std::env::temp_dir().join(format!("accord-fct-{}.svg", std::process::id()));
    let (ok, _, stderr) =
        accord(&["sim", "permutation", "--nodes", "16", "--bytes", "64KB", "--plot", path.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let body = std::fs::read_to_string(&path).expect("the plot file");
    std::fs::remove_file(&path).unwrap();
    let doc = roxmltree::Document::parse(&body).expect("valid XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let texts: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_string())
        .collect();
    for name in ["flow completion time CDF", "line-rate ideal"] {
        assert!(texts.iter().any(|t| t == name), "legend lacks {name:?}: {texts:?}");
    }
    // The CDF: one vertex per flow (16 hosts, 16 flows).
    let most_points = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .filter_map(|n| n.attribute("points"))
        .map(|p| p.split_whitespace().count())
        .max()
        .unwrap_or(0);
    assert_eq!(most_points, 16, "{body}");
}

#[test]
fn late_acks_compares_the_learned_floor_under_both_kinds_of_lateness() {
    let v = accord_json(&["sim", "late-acks", "--bytes", "1048576", "--json"]);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 10, "five fractions for each of stall and reorder");
    for kind in ["stall", "reorder"] {
        assert_eq!(rows.iter().filter(|r| r["lateness"] == kind).count(), 5);
    }
    for row in rows {
        for side in ["learned", "unlearned"] {
            for field in ["completion_us", "retransmits", "lost", "lost_spurious"] {
                assert!(row[side][field].is_number(), "{side}.{field} missing in {row}");
            }
        }
    }
    // Nothing late: the floor never moves, so both runs are the same run.
    assert_eq!(rows[0]["learned"], rows[0]["unlearned"]);
    let (ok, _, stderr) = accord(&["sim", "late-acks", "--late-us", "0"]);
    assert!(!ok && stderr.contains("--late-us 0 is out of range"), "{stderr}");
}
