//! Dispatch of parts whose bytes are in host memory: the one place a host part's route is
//! chosen ([`super::choose`]) and run. Device writes are split into such parts by their own
//! routes (staging's chunks, the landing rendezvous' chunks and control frames, every
//! immediate that follows a copy), so they all end here.

use std::sync::Arc;

use super::memcpy::dispatch_local;
use super::{choose, Destination, Locality, Operation, Route, RouteInputs, RouteSwitches, SourceMemory};
use crate::address::EngineId;
use crate::completion::TransferState;
use crate::engine::part::{Part, PartKind};
use crate::engine::route::cma;
use crate::engine::shared::{local_engine, Shared};
use crate::memory::Source;

/// A part before it is routed: what it does at which peer, its bytes, and the lane it should
/// take (`None`: the next live one).
pub(crate) struct PartSpec {
    pub(crate) peer: EngineId,
    pub(crate) kind: PartKind,
    pub(crate) source: Source,
    pub(crate) lane: Option<usize>,
}

/// Runs `spec` on its route; `transfer` learns the outcome.
pub(crate) fn dispatch_part(shared: &Arc<Shared>, spec: PartSpec, transfer: Arc<TransferState>) {
    let switches = RouteSwitches::of(&shared.config);
    let local = match () {
        _ if switches.force_network => None,
        _ if spec.peer == shared.id => Some(shared.clone()),
        _ => local_engine(spec.peer),
    };
    let operation = match spec.kind {
        PartKind::Write { .. } => Operation::Write,
        PartKind::Send { .. } => Operation::Send,
    };
    let len = spec.source.len();
    // Between a host part's other routes (rings or UDP) the lane's datapath decides, so whether
    // the peer shares this host matters only where a pull could apply: the peer table is read
    // for those parts alone, as before the route layer, not on every small write's path.
    let pull_possible = operation == Operation::Write && switches.cma && len >= switches.cma_min_bytes;
    let locality = match local {
        Some(_) => Locality::SameProcess,
        None if pull_possible && shared.peer_on_this_host(spec.peer) => Locality::SameHost,
        None => Locality::OtherHost,
    };
    let inputs =
        RouteInputs { operation, source: SourceMemory::Host, destination: Destination::Host, locality, len, switches };
    let route = choose(inputs);
    if let (Route::Memcpy, Some(peer)) = (route, local) {
        dispatch_local(shared, peer, spec.kind, spec.source, transfer);
        return;
    }
    debug_assert!(!route.is_device_route(), "a host part was routed to {route:?}");
    let tag = shared.tags.next();
    let part = Part {
        peer: spec.peer,
        kind: spec.kind,
        source: spec.source,
        transfer,
        tag,
        attempts: 0,
        stranded_since: None,
    };
    match route {
        // Falls back to the transport until the peer verified us (see `cma`).
        Route::Pull => {
            if let Some(part) = cma::try_pull(shared, part, spec.lane) {
                shared.route(part, spec.lane);
            }
        }
        // The lane's datapath carries it: shared-memory rings where they are up, else UDP.
        _ => shared.route(part, spec.lane),
    }
}
