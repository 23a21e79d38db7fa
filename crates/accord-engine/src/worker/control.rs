//! How a worker hands the engine's control frames to the routes that own them.
//!
//! Why a table: a route that talks to its counterpart in a peer engine (the landing rendezvous,
//! the pull route, and whatever route comes next) sends frames of the one control codec
//! ([`crate::engine::control`]) into the peer's control region. The receiving worker must not
//! place them, and it must not know what they mean either: the engine registers each route's
//! handler here when it starts its workers, and the worker only looks up the frame's tag.

use std::sync::Arc;

use crate::engine::control::{ControlFrame, RouteTag};
use crate::engine::part::Part;
use crate::engine::shared::Shared;

/// A route's handler for one frame sent to it (placed at `offset` of the control region). It
/// runs on the worker thread, after the receive batch and outside the region table's lock, so
/// it may take that lock itself; it returns the reply to send, if any (the worker queues it on
/// its own lane).
pub(crate) type ControlHandler = fn(&Arc<Shared>, u64, &[u8]) -> Option<Part>;

/// A route's periodic check, run once per worker turn: expires what a quiet peer left
/// outstanding. Must be cheap when the route has nothing in flight (one atomic load).
pub(crate) type RouteSweep = fn(&Arc<Shared>);

/// What became of one control message.
pub(crate) enum Delivery {
    /// A route took it and answers with this part.
    Reply(Part),
    /// A route took it (or it was empty: a zero-byte write carries only its immediate).
    Taken,
    /// No route claims it: not a whole frame of a known route. Counted, never acted on.
    Unrouted,
}

/// The routes' handlers, by tag, and their sweeps.
#[derive(Clone, Default)]
pub(crate) struct ControlRoutes {
    handlers: Vec<(RouteTag, ControlHandler)>,
    sweeps: Vec<RouteSweep>,
}

impl ControlRoutes {
    /// Adds the handler of `tag`'s frames (a later one for the same tag replaces it).
    pub(crate) fn on(mut self, tag: RouteTag, handler: ControlHandler) -> Self {
        self.handlers.retain(|(t, _)| *t != tag);
        self.handlers.push((tag, handler));
        self
    }

    /// Adds a sweep run every worker turn.
    pub(crate) fn sweep_with(mut self, sweep: RouteSweep) -> Self {
        self.sweeps.push(sweep);
        self
    }

    /// Hands `message` (placed at `offset` of the control region) to the route it names.
    pub(crate) fn deliver(&self, shared: &Arc<Shared>, offset: u64, message: &[u8]) -> Delivery {
        if message.is_empty() {
            return Delivery::Taken;
        }
        let Some(tag) = ControlFrame::route_of(offset, message) else { return Delivery::Unrouted };
        match self.handlers.iter().find(|(t, _)| *t == tag) {
            Some((_, handler)) => handler(shared, offset, message).map_or(Delivery::Taken, Delivery::Reply),
            None => Delivery::Unrouted,
        }
    }

    /// Runs every route's sweep.
    pub(crate) fn sweep(&self, shared: &Arc<Shared>) {
        for sweep in &self.sweeps {
            sweep(shared);
        }
    }
}
