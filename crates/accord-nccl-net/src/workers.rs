//! How many engine workers the plugin runs when nothing else says. NCCL does not tell a net
//! plugin how many ranks share the host. When no launcher variable says it either
//! ([`accord_engine::local_ranks`]: torchrun, Open MPI, MPICH, MVAPICH2, Slurm), the plugin
//! assumes one rank per GPU, the usual NCCL layout, rather than the engine's single worker
//! (which moves a few GB/s: 5.06-5.66 GB/s against 23.84 with 12 workers in the plugin bench on
//! the 2xH200 host, docs/results/2026-11-22-nccl-plugin.md, session 5).
//!
//! The plugin gives its engine three quarters of the rank's share of the cores
//! ([`plugin_workers`]), more than the engine's own rule (half, at most 8): an NCCL rank's own
//! threads are few (its main thread and proxy thread), and the workers are what copies every
//! byte of the host path twice. On the 2xH200 host's 32 cores, with one process per GPU,
//! nccl-tests' all_reduce at 256 MiB went from 14.37-16.16 GB/s busbw with 8 workers a rank to
//! 17.55-17.81 with 12, in three paired runs of one call; 16 (every core taken) fell to 12.71
//! (docs/results/2026-11-27-plugin-workers.md).

use accord_engine::local_ranks::{worker_count_source, WorkerCountSource};
use std::path::Path;

/// Where the NVIDIA driver lists the host's GPUs, one directory each (all of them, whatever
/// `CUDA_VISIBLE_DEVICES` hides from this process).
pub const NVIDIA_GPU_DIR: &str = "/proc/driver/nvidia/gpus";

/// The worker count the plugin sets on the engine builder (None: leave it to the engine, whose
/// own rules and `ACCORD_*` overrides then apply), and what decided it, for the init log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSizing {
    /// Workers per device to ask the builder for.
    pub workers: Option<usize>,
    /// What decided the count.
    pub source: String,
}

/// Most workers [`plugin_workers`] gives one engine.
pub const PLUGIN_AUTO_WORKERS_MAX: usize = 12;

/// Workers for a plugin engine sharing `cores` with `local_ranks` ranks like it: three quarters
/// of its share, at least one, at most [`PLUGIN_AUTO_WORKERS_MAX`] (12 a rank for 2 ranks on
/// 32 cores, or for 8 ranks on 128 cores; 1 on a 2-core machine).
pub fn plugin_workers(cores: usize, local_ranks: usize) -> usize {
    (cores / local_ranks.max(1) * 3 / 4).clamp(1, PLUGIN_AUTO_WORKERS_MAX)
}

/// Decides the worker count from the environment (`lookup`), the host's `cores` and the GPU
/// list in `gpu_dir`.
pub fn worker_sizing(lookup: impl Fn(&str) -> Option<String>, cores: usize, gpu_dir: &Path) -> WorkerSizing {
    match worker_count_source(lookup) {
        WorkerCountSource::Explicit => WorkerSizing { workers: None, source: "ACCORD_WORKERS_PER_NIC".into() },
        WorkerCountSource::Launcher { variable, ranks } => WorkerSizing {
            workers: Some(plugin_workers(cores, ranks)),
            source: format!("{variable}: {ranks} rank(s) on this host"),
        },
        WorkerCountSource::Unknown => match gpu_count(gpu_dir) {
            Some(gpus) => WorkerSizing {
                workers: Some(plugin_workers(cores, gpus)),
                source: format!("no launcher variable: one rank per GPU, {gpus} GPU(s)"),
            },
            None => WorkerSizing {
                workers: None,
                source: "no launcher variable and no GPU list: the engine default".into(),
            },
        },
    }
}

/// Entries of the driver's GPU list, when it exists and is not empty.
pub fn gpu_count(dir: &Path) -> Option<usize> {
    let count = std::fs::read_dir(dir).ok()?.filter_map(|e| e.ok()).count();
    (count > 0).then_some(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn sizing(vars: &[(&str, &str)], gpu_dir: &Path) -> WorkerSizing {
        let vars: HashMap<&str, &str> = vars.iter().copied().collect();
        worker_sizing(|n| vars.get(n).map(|v| v.to_string()), 32, gpu_dir)
    }

    /// A directory shaped like the driver's GPU list, removed on drop.
    struct FakeGpuDir(std::path::PathBuf);

    impl FakeGpuDir {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for FakeGpuDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn fake_gpu_dir(gpus: usize) -> FakeGpuDir {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("accord-fake-gpus-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..gpus {
            std::fs::create_dir(dir.join(format!("0000:00:0{i}.0"))).unwrap();
        }
        FakeGpuDir(dir)
    }

    #[test]
    fn one_rank_per_gpu_when_nothing_says() {
        let two = fake_gpu_dir(2);
        let s = sizing(&[], two.path());
        assert_eq!(s.workers, Some(12));
        assert!(s.source.contains("2 GPU(s)"), "{}", s.source);
    }

    #[test]
    fn an_explicit_count_is_left_to_the_engine() {
        let two = fake_gpu_dir(2);
        let s = sizing(&[("ACCORD_WORKERS_PER_NIC", "3")], two.path());
        assert_eq!(s, WorkerSizing { workers: None, source: "ACCORD_WORKERS_PER_NIC".into() });
    }

    #[test]
    fn a_launcher_count_sizes_the_plugin_share() {
        let two = fake_gpu_dir(2);
        let s = sizing(&[("OMPI_COMM_WORLD_LOCAL_SIZE", "8")], two.path());
        assert_eq!(s.workers, Some(3)); // 32 cores / 8 ranks = 4, three quarters of it
        assert!(s.source.starts_with("OMPI_COMM_WORLD_LOCAL_SIZE: 8"), "{}", s.source);
    }

    #[test]
    fn plugin_workers_take_three_quarters_of_the_share_within_bounds() {
        assert_eq!(plugin_workers(32, 2), 12);
        assert_eq!(plugin_workers(128, 8), 12);
        assert_eq!(plugin_workers(64, 8), 6);
        assert_eq!(plugin_workers(2, 2), 1);
        assert_eq!(plugin_workers(256, 1), PLUGIN_AUTO_WORKERS_MAX);
        assert_eq!(plugin_workers(8, 0), 6); // no rank count: the whole host is the share
    }

    #[test]
    fn no_gpu_list_keeps_the_engine_default() {
        let empty = fake_gpu_dir(0);
        assert_eq!(sizing(&[], empty.path()).workers, None);
        assert_eq!(sizing(&[], Path::new("/nonexistent/accord-gpus")).workers, None);
        assert_eq!(gpu_count(Path::new("/nonexistent/accord-gpus")), None);
    }
}
