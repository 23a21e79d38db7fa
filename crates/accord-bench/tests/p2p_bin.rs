//! `accord-p2p-bench` end to end: its second process is this same binary, which now returns
//! its exit code to `main` instead of the library ending the process; a run that gets rows
//! proves the second process served the whole benchmark and exited on its own.

use std::process::{Command, Output};

fn p2p_bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_accord-p2p-bench"))
        .args(args)
        .env_remove("ACCORD_P2P_BENCH_CHILD")
        .output()
        .expect("accord-p2p-bench starts")
}

#[test]
fn one_small_size_gives_one_json_row_with_both_baselines() {
    let out = p2p_bench(&["--json", "--sizes", "4096", "--no-paged"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON value");
    let rows = report["rows"].as_array().expect("a list of rows");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["op"], "write");
    assert_eq!(rows[0]["bytes"], 4096);
    for column in ["accord_gbps", "tcp_gbps", "udp_gbps"] {
        assert!(rows[0][column].as_f64().is_some_and(|v| v > 0.0), "{column}: {rows:?}");
    }
}

#[test]
fn a_bad_argument_exits_2_with_the_usage_and_starts_no_benchmark() {
    let out = p2p_bench(&["--bogus"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage: accord-p2p-bench"));
    assert!(out.stdout.is_empty());
}

#[test]
fn sizes_out_of_range_fail_with_a_message_and_code_1() {
    let out = p2p_bench(&["--sizes", "0", "--no-paged"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid benchmark options"), "{out:?}");
}

fn p2p_bench_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_accord-p2p-bench"));
    cmd.args(args)
        .env_remove("ACCORD_P2P_BENCH_CHILD")
        .env_remove("ACCORD_METRICS_ADDR")
        .env_remove("ACCORD_TRACE_FILE");
    cmd.envs(env.iter().copied()).output().expect("accord-p2p-bench starts")
}

/// The A/B pauses recording for its paused blocks only: the traces of both processes hold
/// exactly the writes made while recording (warm-up, sizing, the recording blocks), none of
/// the paused blocks' as many again; each pair gives one ratio.
#[test]
fn the_telemetry_ab_records_only_the_recording_blocks() {
    let dir = std::env::temp_dir().join(format!("accord-p2p-ab-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace-%p.json");
    let out = p2p_bench_with(
        &["--telemetry-ab", "--pairs", "5", "--sizes", "65536", "--no-paged", "--json"],
        &[("ACCORD_TRACE_FILE", trace.to_str().unwrap())],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON value");
    let ab = &report["telemetry_ab"];
    assert_eq!((ab["metrics"].as_bool(), ab["trace"].as_bool()), (Some(false), Some(true)), "{ab}");
    let rows = ab["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(row["ratios"].as_array().map(Vec::len), Some(5), "{row}");
    for column in ["paused_gbps", "on_gbps", "ratio", "low", "high", "block_ms"] {
        assert!(row[column].as_f64().is_some_and(|v| v > 0.0), "{column}: {row}");
    }
    assert!(row["low"].as_f64() <= row["ratio"].as_f64() && row["ratio"].as_f64() <= row["high"].as_f64(), "{row}");
    assert!(["met", "missed", "unresolved"].contains(&row["verdict"].as_str().unwrap()), "{row}");
    let per_block = row["writes_per_block"].as_u64().unwrap();
    let recorded = ab["writes_recorded"].as_u64().unwrap();
    assert!(row["writes_recorded"].as_u64().unwrap() > 5 * per_block, "sizing writes are recorded too: {row}");
    let mut traced = 0;
    for file in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(file.unwrap().path()).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).expect("a trace is JSON");
        traced += json["traceEvents"].as_array().unwrap().iter().filter(|e| e["name"] == "transfer").count() as u64;
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(traced, recorded, "the paused blocks' {} writes are not in the traces", 5 * per_block);
}

#[test]
fn the_telemetry_ab_without_telemetry_or_with_too_few_pairs_fails_with_a_message() {
    let out = p2p_bench_with(&["--telemetry-ab", "--sizes", "4096", "--no-paged"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ACCORD_METRICS_ADDR"), "{out:?}");
    let out = p2p_bench_with(&["--telemetry-ab", "--pairs", "4"], &[("ACCORD_METRICS_ADDR", "127.0.0.1:0")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("pairs 4 must be in 5..="), "{out:?}");
    let out = p2p_bench_with(&["--pairs", "9"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--pairs goes with --telemetry-ab"), "{out:?}");
}
