//! Why a peer was declared dead: named by errors, waits and reports, so kept apart from the
//! liveness watcher that decides it.

/// Why a peer was declared dead.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum PeerDeath {
    /// Its process on this host exited (seen through a pidfd).
    Exited {
        /// The process id it had.
        pid: u32,
    },
    /// It answered no keepalive probe for this many milliseconds (dead, stopped, or every
    /// path to it cut).
    Silent {
        /// How long the last probe went unanswered.
        ms: u64,
    },
}

impl std::fmt::Display for PeerDeath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerDeath::Exited { pid } => write!(f, "its process (pid {pid} on this host) exited"),
            PeerDeath::Silent { ms } => {
                write!(f, "it answered no keepalive probe for {ms} ms (dead, stopped or unreachable)")
            }
        }
    }
}
