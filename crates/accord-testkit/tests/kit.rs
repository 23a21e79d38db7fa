//! The kit on itself: this binary's `kit_child` is the child of every test here.
//!
//! What is proved: the context reaches every child; lines flow both ways; a child that fails
//! is named with its rank, exit status and stderr; a child that hangs is killed at the bound
//! and named; a child that ends before answering is named; dropping a group (a panicking
//! test) leaves no child behind.

use accord_testkit::{child, hear, say, Event, Failure, Group, Spawn};
use std::time::Duration;

/// Longer than any test here waits, so a child that "hangs" is ended by its group only.
const HANG: Duration = Duration::from_secs(600);

#[test]
fn kit_child() {
    let Some(ctx) = child() else { return };
    match ctx.role.as_str() {
        "echo" => {
            say(&format!("hello {} {} {}", ctx.rank, ctx.ranks, ctx.value("word").unwrap_or("-")));
            std::fs::write(ctx.dir.join(format!("rank-{}", ctx.rank)), b"here").unwrap();
            while let Some(line) = hear() {
                say(&format!("{} heard {line}", ctx.rank));
            }
        }
        "fail-1" => {
            if ctx.rank == 1 {
                eprintln!("rank 1 is about to fail on purpose");
                panic!("failing on purpose");
            }
        }
        "hang-0" => {
            if ctx.rank == 0 {
                eprintln!("rank 0 hangs on purpose");
                std::thread::sleep(HANG);
            }
        }
        "quiet-exit" => {
            eprintln!("leaving without a word");
            std::process::exit(7);
        }
        "hang" => {
            say("up");
            std::thread::sleep(HANG);
        }
        other => panic!("unknown role {other:?}"),
    }
}

fn is_gone(pid: u32) -> bool {
    // Safety: signal 0 only checks whether the process exists.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

#[test]
fn every_child_gets_its_context_and_lines_flow_both_ways() {
    let mut group = Spawn::new("kit_child", 3).role("echo").value("word", "accord").start().unwrap();
    let mut hellos = vec![String::new(); 3];
    for _ in 0..3 {
        let (rank, text) = group.said().unwrap();
        hellos[rank] = text;
    }
    assert_eq!(hellos, ["hello 0 3 accord", "hello 1 3 accord", "hello 2 3 accord"]);
    group.send(2, "ping").unwrap();
    assert_eq!(group.said().unwrap(), (2, "2 heard ping".to_string()));
    group.send_all("all").unwrap();
    let mut heard: Vec<(usize, String)> = (0..3).map(|_| group.said().unwrap()).collect();
    heard.sort();
    assert_eq!(heard, (0..3).map(|r| (r, format!("{r} heard all"))).collect::<Vec<_>>());
    group.finish().unwrap();
    for rank in 0..3 {
        assert_eq!(std::fs::read(group.dir().join(format!("rank-{rank}"))).unwrap(), b"here");
    }
    let dir = group.dir().to_path_buf();
    drop(group);
    assert!(!dir.exists(), "the group's directory is removed with it");
}

#[test]
fn a_child_that_fails_is_named_with_its_status_and_stderr() {
    let mut group = Spawn::new("kit_child", 3).role("fail-1").start().unwrap();
    let failure = group.finish().unwrap_err();
    assert_eq!(failure.ranks, [1], "{failure}");
    let text = failure.to_string();
    assert!(text.contains("rank 1") && text.contains(&format!("pid {}", group.pid(1))), "{text}");
    assert!(text.contains("exit status: 101"), "libtest's exit code for a failed test: {text}");
    assert!(text.contains("about to fail on purpose"), "its stderr is shown: {text}");
    assert!(group.stderr(1).contains("failing on purpose"), "the panic message is kept");
}

/// Starts `ranks` children of which rank 0 hangs, under a short bound, and runs `wait`:
/// it must fail naming rank 0 only, saying `what`, with rank 0 killed and reaped.
fn rank_0_hangs(ranks: usize, wait: impl FnOnce(&mut Group) -> Failure, what: &str) {
    let mut group = Spawn::new("kit_child", ranks).role("hang-0").bound(Duration::from_secs(3)).start().unwrap();
    let pid = group.pid(0);
    let failure = wait(&mut group);
    assert_eq!(failure.ranks, [0], "{failure}");
    assert!(failure.message.contains(what) && failure.message.contains("hangs on purpose"), "{failure}");
    assert!(is_gone(pid), "the hanging child was killed and reaped");
}

#[test]
fn a_child_that_hangs_is_killed_at_the_bound_and_named() {
    rank_0_hangs(2, |g| g.finish().unwrap_err(), "was still running at the group's bound");
}

#[test]
fn a_wait_for_a_line_ends_at_the_bound_naming_the_silent_child() {
    rank_0_hangs(1, |g| g.said().unwrap_err(), "waiting for a line");
}

#[test]
fn a_wait_for_one_child_ends_at_the_bound_naming_it() {
    rank_0_hangs(2, |g| g.wait(0).unwrap_err(), "did not exit in time");
}

#[test]
fn a_child_that_ends_before_answering_is_named() {
    let mut group = Spawn::new("kit_child", 1).role("quiet-exit").start().unwrap();
    let failure = group.said().unwrap_err();
    assert_eq!(failure.ranks, [0], "{failure}");
    assert!(failure.message.contains("exit status: 7"), "{failure}");
    assert!(failure.message.contains("leaving without a word"), "{failure}");
}

#[test]
fn a_killed_child_is_no_failure_and_its_end_is_an_event() {
    let mut group = Spawn::new("kit_child", 2).role("hang").start().unwrap();
    let mut up = [false; 2];
    for _ in 0..2 {
        up[group.said().unwrap().0] = true;
    }
    assert_eq!(up, [true, true]);
    group.kill(1);
    assert_eq!(group.next_event().unwrap(), Event::Ended { rank: 1 });
    assert!(group.signal(1, libc::SIGSTOP).is_err(), "a reaped child takes no signal");
    group.kill(0);
    group.finish().unwrap();
}

#[test]
fn a_panicking_parent_leaves_no_child_behind() {
    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::panic::catch_unwind(move || {
        let mut group: Group = Spawn::new("kit_child", 2).role("hang").start().unwrap();
        group.said().unwrap();
        tx.send((group.pid(0), group.pid(1))).unwrap();
        panic!("the parent fails with its children running");
    });
    assert!(result.is_err());
    let (a, b) = rx.recv().unwrap();
    assert!(is_gone(a) && is_gone(b), "the group's drop killed and reaped both");
}

#[test]
fn another_program_runs_as_ranks_with_the_same_bound_and_naming() {
    // Each rank leaves only when told, after both hellos were read: rank 1's failed exit
    // reaching the group before rank 0's hello would fail `said` (as it should), and did once.
    let script = r#"echo "@@hi $RANK $WHO"; read go; echo "rank $RANK leaves" >&2; exit "$RANK""#;
    let mut group = Spawn::program("/bin/sh", &["-c", script], 2).env_rank("RANK").env("WHO", "sh").start().unwrap();
    let mut hellos: Vec<(usize, String)> = (0..2).map(|_| group.said().unwrap()).collect();
    hellos.sort();
    assert_eq!(hellos, [(0, "hi 0 sh".to_string()), (1, "hi 1 sh".to_string())]);
    group.send_all("go").unwrap();
    let failure = group.finish().unwrap_err();
    assert_eq!(failure.ranks, [1], "{failure}");
    assert!(failure.message.contains("exit status: 1") && failure.message.contains("rank 1 leaves"), "{failure}");
    assert!(group.status(0).is_some_and(|s| s.success()));
    assert_eq!(group.status(1).and_then(|s| s.code()), Some(1));
}
