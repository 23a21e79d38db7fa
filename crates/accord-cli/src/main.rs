//! `accord`: benchmarks, simulations and the local launcher. Every subcommand prints a
//! readable table and, with `--json`, exactly one JSON object on stdout.
#![deny(unsafe_code)]

mod bench;
mod doctor;
mod launch;
mod logging;
mod plot;
mod progress;
mod signal;
mod sim;
mod size;
mod table;
mod validate;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "accord", version, about = "Accord: a software transport and collectives for GPU clusters")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Deterministic simulations of the transport (same protocol code as on sockets).
    #[command(subcommand)]
    Sim(sim::SimCommand),
    /// Start N local ranks of a command with the torchrun variables.
    Run(launch::RunArgs),
    /// nccl-tests-compatible benchmarks (same flags and output); no arguments: the main suite.
    Bench(bench::BenchArgs),
    /// Merge the stuck reports of a job's ranks (ACCORD_REPORT_DIR) and name the cause.
    Doctor(doctor::DoctorArgs),
}

fn main() -> ExitCode {
    // First, so that the p2p benchmark's second process (just below) logs too.
    logging::init();
    // The p2p benchmark re-runs this binary as its second process.
    if let Some(code) = accord_bench::p2p::run_child_if_requested() {
        return code;
    }
    // `accord run` re-runs this binary as its watchdog.
    launch::run_watchdog_if_requested();
    accord_knobs::warn_unknown_once();
    let raw_args: Vec<String> = std::env::args().skip(1).collect();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Sim(cmd) => sim::run(cmd),
        Command::Doctor(args) => doctor::run(args),
        Command::Run(args) => match launch::run(args) {
            Ok(code) => return ExitCode::from(code.clamp(0, 255) as u8),
            Err(e) => Err(e),
        },
        Command::Bench(args) => match bench::run(args, raw_args) {
            Ok(code) => return ExitCode::from(code.clamp(0, 255) as u8),
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("accord: {message}");
            ExitCode::FAILURE
        }
    }
}
