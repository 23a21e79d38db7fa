//! Bad command lines, one table: each must be refused before any work starts, with its exit
//! code and one non-empty line that names the problem.

use std::process::Command;

/// (arguments, exit code, text the one line of stderr must contain).
const CASES: &[(&[&str], i32, &str)] = &[
    // Probabilities.
    (&["bench", "p2p", "--loss", "2"], 1, "--loss 2 is not a probability"),
    (&["bench", "p2p", "--loss", "nan"], 1, "--loss NaN is not a probability"),
    (&["bench", "p2p", "--loss", "inf"], 1, "--loss inf is not a probability"),
    (&["bench", "p2p", "--loss", "1"], 1, "--loss 1 drops every packet"),
    // The telemetry A/B's pair count, and --pairs alone.
    (&["bench", "p2p", "--telemetry-ab", "--pairs", "3"], 1, "pairs 3 must be in 5..=1000"),
    (&["bench", "p2p", "--pairs", "9"], 2, "--telemetry-ab"),
    // Empty lists.
    (&["sim", "incast", "--cc", ""], 1, "--cc \"\" names nothing"),
    (&["sim", "incast", "--cc", " , "], 1, "names nothing"),
    (&["sim", "incast", "--cc", "cubic,,eqds"], 1, "has an empty entry"),
    (&["sim", "loss-sweep", "--cc", ""], 1, "unknown congestion control"),
    // Selector names, each error listing the accepted ones.
    (
        &["sim", "loss-sweep", "--cc", "bbr"],
        1,
        "--cc: unknown congestion control \"bbr\": use one of cubic, swift, eqds, fixed",
    ),
    (&["sim", "incast", "--cc", "cubic,bbr"], 1, "use one of cubic, swift, eqds, fixed"),
    (
        &["sim", "permutation", "--selector", "ecmp"],
        1,
        "--selector: unknown path selector \"ecmp\": use one of p2c, rr, recycle",
    ),
    (
        &["sim", "incast", "--pacer-order", "fifo"],
        1,
        "--pacer-order: unknown pacer order \"fifo\": use one of rr, srpt",
    ),
    // Sizes and counts against named limits and this machine's memory.
    (&["sim", "permutation", "--nodes", "100000000"], 1, "--nodes 100000000 needs about 29.8 TiB of memory"),
    (&["sim", "permutation", "--nodes", "1"], 1, "--nodes must be at least 2"),
    (&["sim", "loss-sweep", "--bytes", "0"], 1, "--bytes 0 is out of range"),
    (&["sim", "path-cut", "--bytes", "2000000000000"], 1, "--bytes 2000000000000 is out of range"),
    (&["sim", "incast", "--victims", "1000000", "--victim-messages", "100000"], 1, "a victim message"),
    // Rates and durations.
    (&["sim", "incast", "--gbps", "inf"], 1, "--gbps inf must be a finite number above 0"),
    (&["sim", "incast", "--gbps", "0"], 1, "--gbps 0 must be"),
    (&["sim", "incast", "--victim-interval-us", "nan"], 1, "--victim-interval-us NaN must be"),
    (&["sim", "permutation", "--link-gbps", "nan"], 1, "--link-gbps NaN must be"),
    (&["sim", "permutation", "--link-gbps=-1"], 1, "--link-gbps -1 must be"),
    // Rank counts.
    (&["run", "-n", "0", "--", "true"], 1, "-n must be in 1..=1024"),
    (&["run", "-n", "1025", "--", "true"], 1, "-n must be in 1..=1024"),
    (&["run", "-n", "1", "--", "/nonexistent/program"], 1, "could not start \"/nonexistent/program\" for rank 0"),
    // What clap refuses (exit 2).
    (&["run", "-n", "-1", "--", "true"], 2, "error:"),
    (&["sim", "permutation", "--nodes", "many"], 2, "invalid value"),
];

#[test]
fn every_bad_input_is_refused_with_its_code_and_one_clear_line() {
    for (args, code, text) in CASES {
        let out = Command::new(env!("CARGO_BIN_EXE_accord")).args(*args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {stderr}");
        assert!(stderr.contains(text), "{args:?}: expected {text:?} in {stderr:?}");
        assert!(out.stdout.is_empty(), "{args:?} did work before refusing: {}", String::from_utf8_lossy(&out.stdout));
        if *code == 1 {
            let lines: Vec<&str> = stderr.lines().collect();
            assert_eq!(lines.len(), 1, "{args:?}: one line, got {stderr:?}");
            assert!(lines[0].len() > "accord: ".len() + 10, "{args:?}: an empty message");
        }
    }
}

#[test]
#[allow(unsafe_code)]
fn a_rank_count_past_the_open_file_limit_is_refused_before_any_rank_starts() {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(env!("CARGO_BIN_EXE_accord"));
    command.args(["run", "-n", "100", "--", "true"]);
    // Safety: the hook makes one async-signal-safe system call.
    unsafe {
        command.pre_exec(|| {
            let r = libc::rlimit { rlim_cur: 100, rlim_max: 100 };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("-n 100 needs about 264 open files") && stderr.contains("ulimit -n"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}
