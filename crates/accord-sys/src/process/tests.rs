use super::*;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A child process killed and reaped when the test ends, even when it fails.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn state_of(pid: u32) -> Option<u8> {
    std::fs::read(format!("/proc/{pid}/stat")).ok().and_then(|s| stat_state(&s))
}

#[test]
fn this_process_runs_and_impossible_pids_do_not() {
    assert!(process_alive(std::process::id()));
    assert!(!process_alive(0));
    assert!(!process_alive(u32::MAX));
    assert!(!process_alive(i32::MAX as u32), "beyond any pid_max the kernel allows");
}

#[test]
fn a_live_child_runs_and_an_unreaped_exited_child_is_dead() {
    let mut child = Reaped(Command::new("sleep").arg("30").spawn().expect("spawn sleep"));
    let pid = child.0.id();
    assert!(process_alive(pid), "a sleeping child runs");
    child.0.kill().expect("kill the child");
    // Not reaped: the child stays a zombie until wait(). Bounded wait for the kernel to finish
    // its exit (the signal is delivered asynchronously).
    let deadline = Instant::now() + Duration::from_secs(20);
    while state_of(pid) != Some(b'Z') {
        assert!(Instant::now() < deadline, "child {pid} did not become a zombie (state {:?})", state_of(pid));
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(exists_by_signal(pid as libc::pid_t), "kill(pid, 0) still succeeds on the zombie");
    assert!(!process_alive(pid), "a zombie is dead");
    child.0.wait().expect("reap the child");
    assert!(!process_alive(pid), "a reaped child is dead");
}

#[test]
fn the_state_is_read_after_the_last_parenthesis_of_the_command_name() {
    assert_eq!(stat_state(b"42 (sleep) S 1 42 42 0"), Some(b'S'));
    assert_eq!(stat_state(b"42 (a) Z (b) R 1 42"), Some(b'R'), "a name holding ') Z' is skipped");
    assert_eq!(stat_state(b"42 (x)  Z 1"), Some(b'Z'));
    assert_eq!(stat_state(b"42 (x)"), None);
    assert_eq!(stat_state(b"garbage"), None);
}
