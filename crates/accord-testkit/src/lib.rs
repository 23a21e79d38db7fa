//! `accord-testkit`: the one way Accord's tests run several processes.
//!
//! Why: multi-process tests (engines in separate processes, the NCCL plugin's two ranks, the
//! GPU collectives' second rank) used to re-run their own test binary under a role variable of
//! their own, each with its own spawning, line relaying, waiting and clean-up, and not all of
//! them bounded every wait or killed their children when the parent panicked. Here that is
//! written once:
//!
//! * the parent builds a [`Spawn`] naming one test of the current binary and a number of ranks,
//!   and [`Spawn::start`]s a [`Group`]: each child runs only that test, with its rank, the
//!   group's role, key/value context and a temporary directory in one variable
//!   ([`CHILD_ENV`]);
//! * the child's test reads them with [`child`] (`None` in an ordinary run, so the test returns
//!   at once), talks to the parent with [`say`] (a marked stdout line) and [`hear`] (a stdin
//!   line);
//! * every wait of the parent ([`Group::said`], [`Group::finish`]) ends by the group's bound,
//!   and a child that overran it, failed or ended early is named with its rank, pid, exit
//!   status and the tail of its stderr ([`Failure`]);
//! * [`Spawn::program`] starts another program (the `accord` binary, say) the same way, for
//!   tests whose processes are not this test binary;
//! * dropping the group (the test returned, failed or panicked) kills and reaps every child
//!   still running, and each child is also killed by the kernel if the spawning thread dies
//!   (`PR_SET_PDEATHSIG`), so no test leaves a process behind.
//!
//! This crate is a dev-dependency only; no library links it.

mod context;
mod group;
mod member;
mod spawn;
mod tail;

pub use context::{child, hear, say, Context, CHILD_ENV, MARK};
pub use group::{Failure, Group};
pub use member::Event;
pub use spawn::{Spawn, DEFAULT_BOUND};
