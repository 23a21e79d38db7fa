//! `accord run` end to end: the real binary starting real processes.

use std::process::Command;
use std::time::{Duration, Instant};

fn accord() -> Command {
    Command::new(env!("CARGO_BIN_EXE_accord"))
}

#[test]
fn ranks_get_torchrun_variables_and_prefixed_output() {
    let out = accord()
        .args(["run", "-n", "4", "--", "sh", "-c", "echo $RANK/$WORLD_SIZE/$LOCAL_RANK/$MASTER_ADDR; echo oops >&2"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    for rank in 0..4 {
        assert!(stdout.contains(&format!("[{rank}] {rank}/4/{rank}/127.0.0.1")), "{stdout}");
        assert!(stderr.contains(&format!("[{rank}] oops")), "{stderr}");
    }
}

#[test]
fn one_failing_rank_stops_the_others_and_sets_the_status() {
    let started = Instant::now();
    let status = accord()
        .args(["run", "-n", "3", "--", "sh", "-c", "if [ $RANK = 2 ]; then exit 5; fi; sleep 60"])
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(5));
    assert!(started.elapsed() < Duration::from_secs(30), "the launcher waited for the sleeping ranks");
}

#[test]
fn bad_invocations_are_errors() {
    let out = accord().args(["run", "-n", "0", "--", "true"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("-n must be"));
    let out = accord().args(["run", "-n", "1", "--", "/nonexistent/program"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("could not start"));
}
