//! `accord-p2p-bench [--json] [--loss P] [--sizes a,b,..]`: Accord writes against TCP between
//! two processes on loopback (the `accord bench p2p` CLI wraps the same library function).

use accord_bench::p2p::{format_json, format_table, run, run_child_if_requested, P2pOptions};
use std::process::ExitCode;

fn main() -> ExitCode {
    // The benchmark re-runs this binary as its second process.
    if let Some(code) = run_child_if_requested() {
        return code;
    }
    let mut opts = P2pOptions::default();
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--json" => json = true,
            "--loss" => opts.loss = args.next().and_then(|v| v.parse().ok()),
            "--sizes" => {
                opts.sizes = args.next().unwrap_or_default().split(',').filter_map(|v| v.parse().ok()).collect()
            }
            "--no-paged" => opts.paged_page_bytes = None,
            _ => {
                eprintln!("usage: accord-p2p-bench [--json] [--loss P] [--sizes BYTES,..] [--no-paged]");
                return ExitCode::from(2);
            }
        }
    }
    match run(&opts) {
        Ok(rows) if json => println!("{}", format_json(&rows)),
        Ok(rows) => print!("{}", format_table(&rows)),
        Err(e) => {
            eprintln!("accord-p2p-bench: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
