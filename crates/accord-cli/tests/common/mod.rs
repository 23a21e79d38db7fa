//! What the CLI's multi-process tests share: three ranks of one bench, started through
//! `accord_testkit` (bounded waits, every rank killed when the test ends).

use accord_testkit::Spawn;

/// Three ranks of `accord bench all-reduce` on 64 MiB for 50 iterations (long enough to
/// stop or kill one mid-collective), joined through the torchrun-style variables on loopback
/// `port`; each runs only its own rank (`ACCORD_BENCH_RANK`). `extra` are further bench
/// arguments.
pub fn three_all_reduce_ranks(port: u16, extra: &[&str]) -> Spawn {
    let mut args = vec!["bench", "all-reduce", "--ranks", "3", "-b", "64M", "-e", "64M", "-w", "0", "-n", "50"];
    args.extend_from_slice(extra);
    Spawn::program(env!("CARGO_BIN_EXE_accord"), &args, 3)
        .env_rank("RANK")
        .env_rank("LOCAL_RANK")
        .env("WORLD_SIZE", "3")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("ACCORD_BENCH_RANK", "1")
}
