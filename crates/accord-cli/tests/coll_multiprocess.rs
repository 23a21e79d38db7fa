//! Collectives between real processes over UDP loopback, through the CLI: every benchmarked
//! collective with every output element checked, for 1 to 7 ranks; again with 1% packet loss
//! and reordering injected; and a rank killed mid-collective, which the others must name.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const COLLECTIVES: [&str; 7] =
    ["all-reduce", "reduce", "broadcast", "all-gather", "reduce-scatter", "all-to-all", "sendrecv"];

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

#[test]
fn a_rank_killed_mid_collective_is_named_by_the_others() {
    let port = 20_000 + (std::process::id() % 9_000) as u16;
    let timeout_ms = 3000;
    let mut children: Vec<_> = (0..3)
        .map(|rank| {
            Command::new(env!("CARGO_BIN_EXE_accord"))
                .args([
                    "bench",
                    "all-reduce",
                    "--ranks",
                    "3",
                    "-b",
                    "64M",
                    "-e",
                    "64M",
                    "-w",
                    "0",
                    "-n",
                    "50",
                    "-c",
                    "0",
                ])
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "3")
                .env("LOCAL_RANK", rank.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("ACCORD_BENCH_RANK", "1")
                .env("ACCORD_COLL_TIMEOUT_MS", timeout_ms.to_string())
                .env("ACCORD_IDLE_TIMEOUT_MS", "1000")
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500)); // joined, inside the timed loop
    children[2].kill().expect("kill rank 2");
    let _ = children[2].wait();
    let killed_at = Instant::now();
    for (rank, child) in children.iter_mut().enumerate().take(2) {
        let status = child.wait().expect("wait");
        let mut err = String::new();
        child.stderr.take().expect("piped").read_to_string(&mut err).expect("read stderr");
        assert!(!status.success(), "rank {rank} succeeded although rank 2 died");
        assert!(err.contains("rank 2") || err.contains("rank(s) [2]"), "rank {rank} did not name rank 2: {err}");
    }
    let waited = killed_at.elapsed();
    assert!(waited < Duration::from_millis(3 * timeout_ms + 10_000), "took {waited:?}");
}
