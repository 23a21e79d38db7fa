//! `accord-p2p-bench [--json] [--loss P] [--sizes a,b,..] [--no-paged] [--telemetry-ab [--pairs N]]`:
//! Accord writes against TCP between two processes on loopback (the `accord bench p2p` CLI
//! wraps the same library functions); with `--telemetry-ab`, what telemetry costs a write,
//! recording paused and on in alternating blocks of one run.

use accord_bench::p2p::{self, AbOptions, P2pOptions};
use std::process::ExitCode;

const USAGE: &str =
    "usage: accord-p2p-bench [--json] [--loss P] [--sizes BYTES,..] [--no-paged] [--telemetry-ab [--pairs N]]";

fn main() -> ExitCode {
    // The benchmark re-runs this binary as its second process.
    if let Some(code) = p2p::run_child_if_requested() {
        return code;
    }
    let mut opts = P2pOptions::default();
    let mut json = false;
    let mut ab: Option<usize> = None;
    let mut pairs = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--json" => json = true,
            "--loss" => opts.loss = args.next().and_then(|v| v.parse().ok()),
            "--sizes" => {
                opts.sizes = args.next().unwrap_or_default().split(',').filter_map(|v| v.parse().ok()).collect()
            }
            "--no-paged" => opts.paged_page_bytes = None,
            "--telemetry-ab" => ab = Some(p2p::telemetry_ab::PAIRS_DEFAULT),
            "--pairs" => match args.next().and_then(|v| v.parse().ok()) {
                Some(n) => pairs = Some(n),
                None => {
                    eprintln!("--pairs takes a number\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    if pairs.is_some() && ab.is_none() {
        eprintln!("--pairs goes with --telemetry-ab\n{USAGE}");
        return ExitCode::from(2);
    }
    let printed = match ab.map(|default| pairs.unwrap_or(default)) {
        Some(pairs) => p2p::run_telemetry_ab(&AbOptions { p2p: opts, pairs }).map(|r| {
            if json {
                p2p::format_ab_json(&r) + "\n"
            } else {
                p2p::format_ab_table(&r)
            }
        }),
        None => {
            p2p::run(&opts).map(|rows| if json { p2p::format_json(&rows) + "\n" } else { p2p::format_table(&rows) })
        }
    };
    match printed {
        Ok(text) => print!("{text}"),
        Err(e) => {
            eprintln!("accord-p2p-bench: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
