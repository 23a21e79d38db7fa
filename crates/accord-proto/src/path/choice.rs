//! The selectors a connection can run: the built-ins chosen by name in configuration, and user
//! code. Apart from [`super::selector`] (the hook and the simple policies) and
//! [`super::recycle`] (which builds on the hook's helpers), so neither imports the other back.

use super::recycle::Recycling;
use super::selector::{PathSelector, PowerOfTwoChoices, RoundRobin};
use super::PathTable;
use crate::ids::PathId;
use crate::time::Instant;
use rand_chacha::ChaCha8Rng;

/// Built-in selectors, chosen by name in configuration.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum SelectorKind {
    /// Two random active paths, the one with the lower cost wins (DESIGN §2 default).
    #[default]
    PowerOfTwoChoices,
    /// Active paths in turn (a baseline, and what a flow-hashing fabric would see).
    RoundRobin,
    /// Reuse paths acknowledged without a trim, loss or mark; random when none waits
    /// (see [`super::recycle`]).
    Recycle,
}

impl SelectorKind {
    /// `p2c` / `power-of-two`, or `round-robin` / `rr`.
    pub fn from_name(name: &str) -> Option<SelectorKind> {
        match name.trim().to_ascii_lowercase().as_str() {
            "p2c" | "power-of-two" | "power-of-two-choices" => Some(SelectorKind::PowerOfTwoChoices),
            "rr" | "round-robin" => Some(SelectorKind::RoundRobin),
            "recycle" | "reps" => Some(SelectorKind::Recycle),
            _ => None,
        }
    }

    pub fn build(self) -> Selector {
        match self {
            SelectorKind::PowerOfTwoChoices => Selector::PowerOfTwo(PowerOfTwoChoices),
            SelectorKind::RoundRobin => Selector::RoundRobin(RoundRobin::default()),
            SelectorKind::Recycle => Selector::Recycle(Recycling::default()),
        }
    }
}

/// A connection's selector: built-ins by value, user code boxed.
#[derive(Debug)]
pub enum Selector {
    PowerOfTwo(PowerOfTwoChoices),
    RoundRobin(RoundRobin),
    Recycle(Recycling),
    Custom(Box<dyn PathSelector>),
}

impl PathSelector for Selector {
    fn select(&mut self, now: Instant, paths: &PathTable, rng: &mut ChaCha8Rng, avoid: Option<PathId>) -> PathId {
        match self {
            Selector::PowerOfTwo(s) => s.select(now, paths, rng, avoid),
            Selector::RoundRobin(s) => s.select(now, paths, rng, avoid),
            Selector::Recycle(s) => s.select(now, paths, rng, avoid),
            Selector::Custom(s) => s.select(now, paths, rng, avoid),
        }
    }

    fn on_feedback(&mut self, path: PathId, clean: bool) {
        match self {
            Selector::PowerOfTwo(s) => s.on_feedback(path, clean),
            Selector::RoundRobin(s) => s.on_feedback(path, clean),
            Selector::Recycle(s) => s.on_feedback(path, clean),
            Selector::Custom(s) => s.on_feedback(path, clean),
        }
    }
}
