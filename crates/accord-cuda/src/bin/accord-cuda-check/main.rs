//! `accord-cuda-check`: runs every GPU path of `accord-cuda` on this host and
//! prints a table, or measures copy bandwidth with `--bench`.
//!
//! ```text
//! accord-cuda-check                 # all checks, table; exit 1 if any failed
//! accord-cuda-check --json          # the same as JSON
//! accord-cuda-check --bench [--json] # GB/s of D2D, peer (64/256 MiB, both ways, bidirectional), H2D/D2H pinned
//! accord-cuda-check --print-nvrtc-dirs   # folders for LD_LIBRARY_PATH
//! accord-cuda-check --print-include-dirs # folders NVRTC gets as include paths
//! ```
//! Without a CUDA driver it prints `skipped: no CUDA driver` and exits 0.
#![forbid(unsafe_code)]

mod bench;
mod check_kit;
mod checks;
mod checks_gpu_work;
mod ipc_child;

use std::process::ExitCode;

/// Environment marker under which this binary runs as the IPC child.
pub const IPC_CHILD_ENV: &str = "ACCORD_CUDA_CHECK_IPC_CHILD";
/// GPU ordinal the IPC child opens the handle on.
pub const IPC_CHILD_GPU_ENV: &str = "ACCORD_CUDA_CHECK_IPC_GPU";

struct Args {
    bench: bool,
    json: bool,
}

const USAGE: &str = "usage: accord-cuda-check [--bench] [--json] | --print-nvrtc-dirs | --print-include-dirs";

fn main() -> ExitCode {
    if let Ok(handle_hex) = std::env::var(IPC_CHILD_ENV) {
        return ipc_child::run(&handle_hex);
    }
    let mut args = Args { bench: false, json: false };
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--bench" => args.bench = true,
            "--json" => args.json = true,
            "--print-nvrtc-dirs" => {
                println!("{}", accord_cuda::nvrtc_library_path());
                return ExitCode::SUCCESS;
            }
            "--print-include-dirs" => {
                println!("{}", accord_cuda::paths::join_paths(&accord_cuda::cuda_include_dirs()));
                return ExitCode::SUCCESS;
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("unknown argument {other:?}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let availability = accord_cuda::probe();
    if let Some(reason) = availability.skip_reason(1, false) {
        println!("skipped: {reason}");
        return ExitCode::SUCCESS;
    }
    if args.bench {
        bench::run(&availability, args.json)
    } else {
        checks::run(&availability, args.json)
    }
}
