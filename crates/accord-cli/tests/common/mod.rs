//! What the CLI's multi-process tests share: three ranks of one bench, started through
//! `accord_testkit` (bounded waits, every rank killed when the test ends).

use accord_testkit::Spawn;

/// Three ranks of `accord bench all-reduce` on 64 MiB for 200 iterations, joined through the
/// torchrun-style variables on loopback
/// `port`; each runs only its own rank (`ACCORD_BENCH_RANK`). `extra` are further bench
/// arguments. The tests stop or kill a rank 1.5 s after the start, which must land inside the
/// timed loop. 50 iterations took about 3 s on an idle 2-core machine (setup included), and
/// a faster or less loaded machine could finish them before the kill. 200 leave that margin
/// four times wider and cost nothing, since every user ends the run early.
pub fn three_all_reduce_ranks(port: u16, extra: &[&str]) -> Spawn {
    let mut args = vec!["bench", "all-reduce", "--ranks", "3", "-b", "64M", "-e", "64M", "-w", "0", "-n", "200"];
    args.extend_from_slice(extra);
    Spawn::program(env!("CARGO_BIN_EXE_accord"), &args, 3)
        .env_rank("RANK")
        .env_rank("LOCAL_RANK")
        .env("WORLD_SIZE", "3")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("ACCORD_BENCH_RANK", "1")
}
