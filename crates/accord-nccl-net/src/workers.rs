//! How many engine workers the plugin runs when nothing else says. NCCL does not tell a net
//! plugin how many ranks share the host. When no launcher variable says it either
//! ([`accord_engine::local_ranks`]: torchrun, Open MPI, MPICH, MVAPICH2, Slurm), the plugin
//! assumes one rank per GPU, the usual NCCL layout, rather than the engine's single worker
//! (which moves a few GB/s: 5.06-5.66 GB/s against 23.84 with 12 workers in the plugin bench on
//! the 2xH200 host, docs/results/2026-11-22-nccl-plugin.md, session 5).

use accord_engine::config::workers_for_share;
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

/// Decides the worker count from the environment (`lookup`), the host's `cores` and the GPU
/// list in `gpu_dir`.
pub fn worker_sizing(lookup: impl Fn(&str) -> Option<String>, cores: usize, gpu_dir: &Path) -> WorkerSizing {
    match worker_count_source(lookup) {
        WorkerCountSource::Explicit => WorkerSizing { workers: None, source: "ACCORD_WORKERS_PER_NIC".into() },
        WorkerCountSource::Launcher { variable, ranks } => {
            WorkerSizing { workers: None, source: format!("{variable}: {ranks} rank(s) on this host") }
        }
        WorkerCountSource::Unknown => match gpu_count(gpu_dir) {
            Some(gpus) => WorkerSizing {
                workers: Some(workers_for_share(cores, gpus)),
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
        assert_eq!(s.workers, Some(workers_for_share(32, 2)));
        assert!(s.source.contains("2 GPU(s)"), "{}", s.source);
    }

    #[test]
    fn explicit_and_launcher_counts_are_left_to_the_engine() {
        let two = fake_gpu_dir(2);
        let s = sizing(&[("ACCORD_WORKERS_PER_NIC", "3")], two.path());
        assert_eq!(s, WorkerSizing { workers: None, source: "ACCORD_WORKERS_PER_NIC".into() });
        let s = sizing(&[("OMPI_COMM_WORLD_LOCAL_SIZE", "8")], two.path());
        assert_eq!(s.workers, None);
        assert!(s.source.starts_with("OMPI_COMM_WORLD_LOCAL_SIZE: 8"), "{}", s.source);
    }

    #[test]
    fn no_gpu_list_keeps_the_engine_default() {
        let empty = fake_gpu_dir(0);
        assert_eq!(sizing(&[], empty.path()).workers, None);
        assert_eq!(sizing(&[], Path::new("/nonexistent/accord-gpus")).workers, None);
        assert_eq!(gpu_count(Path::new("/nonexistent/accord-gpus")), None);
    }
}
