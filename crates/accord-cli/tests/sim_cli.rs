//! `accord sim ...` prints a table, and exactly one JSON object with `--json`.

use std::process::Command;

fn accord(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_accord")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn loss_sweep_json_has_the_issue_shape() {
    let (ok, stdout, stderr) = accord(&["sim", "loss-sweep", "--bytes", "1048576", "--json"]);
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
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
