//! `accord doctor` on stuck reports recorded from real runs (tests/fixtures/doctor, recorded
//! with scripts/record-doctor-fixtures.sh), and live: a rank stopped with SIGSTOP mid
//! collective is named by the reports the others write.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

fn doctor(dir: &std::path::Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_accord")).arg("doctor").arg(dir).output().expect("run accord doctor");
    assert!(out.status.success(), "doctor failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/doctor").join(name)
}

#[test]
fn a_killed_rank_is_named_as_dead() {
    let line = doctor(&fixture("killed"));
    assert!(line.starts_with("rank 2 died during all_reduce #2: its process"), "{line}");
}

#[test]
fn a_stopped_rank_is_named_by_its_missing_report() {
    let line = doctor(&fixture("stopped"));
    assert!(line.starts_with("rank 2 wrote no report; rank 0 waits inside all_reduce #6"), "{line}");
}

#[test]
fn a_lossy_running_job_names_its_slowest_link() {
    let line = doctor(&fixture("lossy"));
    assert!(line.starts_with("all ranks in all_reduce #64; slowest link r0\u{2192}r1"), "{line}");
}

#[test]
fn a_file_that_is_not_a_report_is_refused_naming_it() {
    let dir = std::env::temp_dir().join(format!("accord-doctor-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("x.json"), "{\"not\": 1}").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_accord")).arg("doctor").arg(&dir).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("x.json is not a stuck report"));
}

#[test]
fn a_rank_stopped_mid_collective_is_named_by_the_others_reports() {
    let port = 20_000 + (std::process::id() % 9_000) as u16 + 7;
    let mut ranks = common::three_all_reduce_ranks(port, &[])
        .env("ACCORD_COLL_TIMEOUT_MS", "3000")
        .env_dir("ACCORD_REPORT_DIR")
        .bound(Duration::from_secs(60))
        .start()
        .expect("start the ranks");
    std::thread::sleep(Duration::from_millis(1500)); // joined, inside the timed loop
    ranks.signal(2, libc::SIGSTOP).expect("stop rank 2");
    for rank in 0..2 {
        let status = ranks.wait(rank).unwrap_or_else(|f| panic!("{f}"));
        assert!(!status.success(), "rank {rank} finished although rank 2 was stopped");
    }
    ranks.kill(2);
    let line = doctor(ranks.dir());
    assert!(line.starts_with("rank 2 "), "doctor did not name rank 2: {line}");
}
