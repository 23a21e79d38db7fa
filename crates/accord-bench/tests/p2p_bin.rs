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
