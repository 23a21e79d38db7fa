//! How many ranks share this host, read from what the common launchers export, so an engine
//! can size its workers to its share of the cores ([`crate::config::workers_for_share`]).
//!
//! Why more than torchrun's `LOCAL_WORLD_SIZE`: NCCL jobs are as often started by `mpirun` or
//! `srun`, and the NCCL plugin cannot ask NCCL how many ranks share the host. Without any of
//! these an engine runs one worker per NIC, which moves a few GB/s at most.
//!
//! The variables are the launchers', not Accord's: a value that does not parse is skipped (and
//! the next variable tried), never an error that would stop the job.

/// The variables read, in the order tried, with the launcher that sets each.
pub const LOCAL_RANKS_VARIABLES: &[(&str, &str)] = &[
    ("LOCAL_WORLD_SIZE", "torchrun and `accord run`"),
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI"),
    ("MPI_LOCALNRANKS", "MPICH (Hydra)"),
    ("MV2_COMM_WORLD_LOCAL_SIZE", "MVAPICH2"),
    ("SLURM_STEP_TASKS_PER_NODE", "Slurm srun (this node's entry, chosen by SLURM_NODEID)"),
];

/// Largest rank count believed (a larger value is taken as malformed).
pub const LOCAL_RANKS_MAX: usize = 4096;

/// What decides an engine's worker count, in order of precedence: an explicit
/// `ACCORD_WORKERS_PER_NIC`, then a launcher's rank count, else nothing (the builder's value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerCountSource {
    /// `ACCORD_WORKERS_PER_NIC` is set: it is the count.
    Explicit,
    /// A launcher says how many ranks share the host: the count is this rank's share.
    Launcher {
        /// The variable that said so.
        variable: &'static str,
        /// Ranks on this host.
        ranks: usize,
    },
    /// Nothing in the environment says.
    Unknown,
}

/// Which of [`WorkerCountSource`] applies, read through `lookup`.
pub fn worker_count_source(lookup: impl Fn(&str) -> Option<String>) -> WorkerCountSource {
    if lookup("ACCORD_WORKERS_PER_NIC").is_some() {
        return WorkerCountSource::Explicit;
    }
    match local_ranks_from(lookup) {
        Some((ranks, variable)) => WorkerCountSource::Launcher { variable, ranks },
        None => WorkerCountSource::Unknown,
    }
}

/// The ranks on this host and the variable that said so, from the first of
/// [`LOCAL_RANKS_VARIABLES`] that holds a usable value; `None` when none does.
pub fn local_ranks_from(lookup: impl Fn(&str) -> Option<String>) -> Option<(usize, &'static str)> {
    for &(name, _) in LOCAL_RANKS_VARIABLES {
        let Some(value) = lookup(name) else { continue };
        let parsed = if name == "SLURM_STEP_TASKS_PER_NODE" {
            let node = lookup("SLURM_NODEID").and_then(|n| n.trim().parse::<usize>().ok()).unwrap_or(0);
            slurm_tasks_on_node(&value, node)
        } else {
            value.trim().parse::<usize>().ok()
        };
        match parsed {
            Some(n) if (1..=LOCAL_RANKS_MAX).contains(&n) => return Some((n, name)),
            _ => tracing::warn!(variable = name, value = %value, "not a rank count; ignored"),
        }
    }
    None
}

/// The task count of node `node` in Slurm's compressed per-node list: comma-separated entries,
/// each `count` or `count(xrepeat)`, e.g. `4(x2),1` is 4, 4, 1.
pub fn slurm_tasks_on_node(list: &str, node: usize) -> Option<usize> {
    let mut first_node = 0usize;
    for entry in list.trim().split(',') {
        let (count, repeat) = match entry.split_once("(x") {
            Some((count, rest)) => (count, rest.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (entry, 1),
        };
        let count = count.parse::<usize>().ok()?;
        if repeat == 0 {
            return None;
        }
        if node < first_node.checked_add(repeat)? {
            return Some(count);
        }
        first_node += repeat;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn ranks(vars: &[(&str, &str)]) -> Option<(usize, &'static str)> {
        let map: HashMap<&str, &str> = vars.iter().copied().collect();
        local_ranks_from(|n| map.get(n).map(|v| v.to_string()))
    }

    #[test]
    fn each_launcher_is_read() {
        assert_eq!(ranks(&[("LOCAL_WORLD_SIZE", "2")]), Some((2, "LOCAL_WORLD_SIZE")));
        assert_eq!(ranks(&[("OMPI_COMM_WORLD_LOCAL_SIZE", "8")]), Some((8, "OMPI_COMM_WORLD_LOCAL_SIZE")));
        assert_eq!(ranks(&[("MPI_LOCALNRANKS", " 4 ")]), Some((4, "MPI_LOCALNRANKS")));
        assert_eq!(ranks(&[("MV2_COMM_WORLD_LOCAL_SIZE", "3")]), Some((3, "MV2_COMM_WORLD_LOCAL_SIZE")));
        assert_eq!(ranks(&[]), None);
    }

    #[test]
    fn torchrun_wins_and_bad_values_fall_through() {
        assert_eq!(ranks(&[("LOCAL_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "8")]).unwrap().0, 2);
        assert_eq!(ranks(&[("LOCAL_WORLD_SIZE", "two"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "8")]).unwrap().0, 8);
        assert_eq!(ranks(&[("LOCAL_WORLD_SIZE", "0")]), None, "zero ranks is not a count");
        assert_eq!(ranks(&[("LOCAL_WORLD_SIZE", "99999")]), None, "beyond LOCAL_RANKS_MAX");
        assert_eq!(ranks(&[("LOCAL_WORLD_SIZE", "-1")]), None);
    }

    #[test]
    fn slurm_lists_pick_this_node() {
        assert_eq!(slurm_tasks_on_node("8", 0), Some(8));
        assert_eq!(slurm_tasks_on_node("4(x2),1", 0), Some(4));
        assert_eq!(slurm_tasks_on_node("4(x2),1", 1), Some(4));
        assert_eq!(slurm_tasks_on_node("4(x2),1", 2), Some(1));
        assert_eq!(slurm_tasks_on_node("4(x2),1", 3), None, "no such node");
        for bad in ["", "x", "4(x", "4(x0)", "4(xa)", "(x2)", "4(x2"] {
            assert_eq!(slurm_tasks_on_node(bad, 0), None, "{bad:?}");
        }
        assert_eq!(slurm_tasks_on_node("4,,1", 1), None, "an empty entry");
        assert_eq!(slurm_tasks_on_node(&format!("1(x{})", usize::MAX), 5), Some(1), "no overflow");
        let on = |node: &str| ranks(&[("SLURM_STEP_TASKS_PER_NODE", "2(x3),6"), ("SLURM_NODEID", node)]);
        assert_eq!(on("0"), Some((2, "SLURM_STEP_TASKS_PER_NODE")));
        assert_eq!(on("3"), Some((6, "SLURM_STEP_TASKS_PER_NODE")));
        assert_eq!(on("4"), None);
    }
}
