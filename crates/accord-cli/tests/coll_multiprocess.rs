//! Collectives between real processes over UDP loopback, through the CLI: every benchmarked
//! collective with every output element checked, for 1 to 7 ranks; again with 1% packet loss
//! and reordering injected; and a rank killed mid-collective, which the others must name.

mod common;

use std::process::Command;
use std::time::Duration;

/// The hang guard of the killed-rank test: far above the survivors' three collective timeouts
/// of 3 s, so only a hang reaches it.
const SURVIVORS_BOUND: Duration = Duration::from_secs(60);

const COLLECTIVES: [&str; 8] =
    ["all-reduce", "reduce", "broadcast", "all-gather", "reduce-scatter", "all-to-all", "all-to-allv", "sendrecv"];

fn bench(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_accord"))
        .arg("bench")
        .args(args)
        .envs(env.iter().copied())
        .env("ACCORD_COLL_TIMEOUT_MS", "20000")
        .output()
        .expect("run accord");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

/// Rows of a `--json` table, each with `wrong == 0` in both placements (in place where the
/// collective has one).
fn all_checked(output: &str) -> bool {
    let Some(line) = output.lines().find(|l| l.starts_with('{')) else { return false };
    let v: serde_json::Value = serde_json::from_str(line).expect("one JSON object");
    let rows = v["rows"].as_array().expect("rows");
    let in_place_ok = |r: &serde_json::Value| r["in_place"].is_null() || r["in_place"]["wrong"] == 0;
    !rows.is_empty() && v["out_of_bounds"] == 0 && rows.iter().all(|r| r["wrong"] == 0 && in_place_ok(r))
}

#[test]
fn every_collective_for_one_to_seven_ranks_is_exact() {
    for ranks in 1..=7 {
        for (i, c) in COLLECTIVES.iter().enumerate() {
            // Vary dtype and op across the matrix; sizes not multiples of the rank count.
            let (dtype, op) =
                [("float", "sum"), ("int32", "max"), ("bfloat16", "min"), ("int8", "prod"), ("double", "avg")]
                    [(ranks + i) % 5];
            let n = ranks.to_string();
            let args = [
                "--ranks", &n, "-b", "3000", "-e", "200000", "-f", "60", "-w", "0", "-n", "1", "-d", dtype, "-o", op,
                "-c", "1", "--json",
            ];
            let mut full = vec![*c];
            full.extend_from_slice(&args);
            let (ok, out) = bench(&full, &[]);
            assert!(ok && all_checked(&out), "{c} on {ranks} ranks ({dtype}, {op}) failed:\n{out}");
        }
    }
}

#[test]
fn collectives_stay_exact_under_loss_and_reordering() {
    for c in ["all-reduce", "all-to-all", "all-gather"] {
        let (ok, out) = bench(
            &[c, "--ranks", "4", "-b", "64K", "-e", "4M", "-f", "8", "-w", "1", "-n", "2", "-c", "1", "--json"],
            &[("ACCORD_LOSS", "0.01"), ("ACCORD_REORDER", "0.01")],
        );
        assert!(ok && all_checked(&out), "{c} under 1% loss failed:\n{out}");
    }
}

/// Starts three ranks of a 64 MiB all_reduce loop with `extra` arguments and `envs`, kills
/// rank 2 once they are inside the timed loop, and returns each survivor's stderr after
/// checking that it failed.
fn kill_rank_2_mid_all_reduce(port: u16, extra: &[&str], envs: &[(&str, &str)]) -> Vec<String> {
    let mut spawn = common::three_all_reduce_ranks(port, extra);
    for (k, v) in envs {
        spawn = spawn.env(k, v);
    }
    let mut ranks = spawn.bound(SURVIVORS_BOUND).start().expect("start the ranks");
    std::thread::sleep(Duration::from_millis(1500)); // joined, inside the timed loop
    ranks.kill(2);
    (0..2)
        .map(|rank| {
            let status = ranks.wait(rank).unwrap_or_else(|f| panic!("{f}"));
            assert!(!status.success(), "rank {rank} succeeded although rank 2 died");
            ranks.stderr(rank)
        })
        .collect()
}

#[test]
fn a_rank_killed_mid_collective_is_named_by_the_others() {
    let port = 20_000 + (std::process::id() % 9_000) as u16;
    let envs = [("ACCORD_COLL_TIMEOUT_MS", "3000"), ("ACCORD_IDLE_TIMEOUT_MS", "1000")];
    for (rank, err) in kill_rank_2_mid_all_reduce(port, &["-c", "0"], &envs).iter().enumerate() {
        assert!(err.contains("rank 2") || err.contains("rank(s) [2]"), "rank {rank} did not name rank 2: {err}");
    }
}

/// The host arena's liveness check: a rank killed inside an arena all_reduce (forced, with
/// lanes) is found through its pid, so the others' error says its process exited, long before
/// their 30 s deadline would have named it.
#[test]
fn a_rank_killed_mid_arena_all_reduce_is_found_by_its_pid() {
    let port = 20_000 + (std::process::id() % 9_000) as u16 + 13;
    let envs = [("ACCORD_COLL_TIMEOUT_MS", "30000"), ("ACCORD_COLL_ARENA_LANES", "4")];
    let errs = kill_rank_2_mid_all_reduce(port, &["-c", "0", "--algo", "arena"], &envs);
    for (rank, err) in errs.iter().enumerate() {
        assert!(
            err.contains("rank 2 is dead") && err.contains("exited"),
            "rank {rank} did not find rank 2's exit: {err}"
        );
    }
}
