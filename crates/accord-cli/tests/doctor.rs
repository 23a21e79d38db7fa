//! `accord doctor` on stuck reports recorded from real runs (tests/fixtures/doctor, recorded
//! with scripts/record-doctor-fixtures.sh), and live: a rank stopped with SIGSTOP mid
//! collective is named by the reports the others write.

use std::path::PathBuf;
use std::process::{Command, Stdio};
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
    let dir = std::env::temp_dir().join(format!("accord-doctor-live-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let port = 20_000 + (std::process::id() % 9_000) as u16 + 7;
    let mut children: Vec<_> = (0..3)
        .map(|rank| {
            Command::new(env!("CARGO_BIN_EXE_accord"))
                .args(["bench", "all-reduce", "--ranks", "3", "-b", "64M", "-e", "64M", "-w", "0", "-n", "50"])
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "3")
                .env("LOCAL_RANK", rank.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("ACCORD_BENCH_RANK", "1")
                .env("ACCORD_COLL_TIMEOUT_MS", "3000")
                .env("ACCORD_REPORT_DIR", &dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500)); // joined, inside the timed loop
    let stopped = children[2].id();
    // kill(1) rather than libc: this crate has no unsafe code.
    let ok = Command::new("kill").args(["-STOP", &stopped.to_string()]).status().expect("kill -STOP");
    assert!(ok.success());
    for child in children.iter_mut().take(2) {
        let status = child.wait().expect("wait");
        assert!(!status.success(), "a rank finished although rank 2 was stopped");
    }
    let _ = children[2].kill();
    let _ = children[2].wait();
    let line = doctor(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(line.starts_with("rank 2 "), "doctor did not name rank 2: {line}");
}
