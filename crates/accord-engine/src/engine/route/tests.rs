//! The route table as data: every combination of [`choose`]'s inputs is matched against the
//! rows below (first match wins), and the route the row names must be the one chosen. The rows
//! are the specification, written apart from `choose`'s code: a change of either shows here.

use super::*;
use std::collections::HashSet;

/// One row; `None` matches anything.
struct Row {
    operation: Option<Operation>,
    source: Option<SourceMemory>,
    destinations: &'static [Destination],
    /// Peer as seen (before `force_network` applies).
    peer: Option<Locality>,
    force_network: Option<bool>,
    shm: Option<bool>,
    cma: Option<bool>,
    /// The part is at least `cma_min_bytes` long.
    long: Option<bool>,
    device_ipc: Option<bool>,
    device_shared_host: Option<bool>,
    route: Route,
}

const ANY_DEST: &[Destination] = &[Destination::Host, Destination::SharedHost, Destination::Device];
const HOST_DEST: &[Destination] = &[Destination::Host, Destination::SharedHost];
const DEVICE_DEST: &[Destination] = &[Destination::Device];
const SHARED_DEST: &[Destination] = &[Destination::SharedHost];

const fn row(route: Route) -> Row {
    Row {
        operation: None,
        source: None,
        destinations: ANY_DEST,
        peer: None,
        force_network: None,
        shm: None,
        cma: None,
        long: None,
        device_ipc: None,
        device_shared_host: None,
        route,
    }
}

use Destination as D;
use Locality::{OtherHost, SameHost, SameProcess};
use Operation::{Send, Write};
use SourceMemory::{Device, Host};

/// The table, first match wins.
fn table() -> Vec<Row> {
    vec![
        // Sends: host routes only, never pulled.
        Row { operation: Some(Send), peer: Some(SameProcess), force_network: Some(false), ..row(Route::Memcpy) },
        Row { operation: Some(Send), peer: Some(OtherHost), ..row(Route::Udp) },
        Row { operation: Some(Send), shm: Some(true), ..row(Route::SharedMemory) },
        Row { operation: Some(Send), ..row(Route::Udp) },
        // Host to host writes.
        Row {
            operation: Some(Write),
            source: Some(Host),
            destinations: HOST_DEST,
            peer: Some(SameProcess),
            force_network: Some(false),
            ..row(Route::Memcpy)
        },
        Row {
            operation: Some(Write),
            source: Some(Host),
            destinations: HOST_DEST,
            peer: Some(OtherHost),
            ..row(Route::Udp)
        },
        Row {
            operation: Some(Write),
            source: Some(Host),
            destinations: HOST_DEST,
            cma: Some(true),
            long: Some(true),
            ..row(Route::Pull)
        },
        Row {
            operation: Some(Write),
            source: Some(Host),
            destinations: HOST_DEST,
            shm: Some(true),
            ..row(Route::SharedMemory)
        },
        Row { operation: Some(Write), source: Some(Host), destinations: HOST_DEST, ..row(Route::Udp) },
        // Writes that touch device memory (from here on the source or the destination is one).
        Row { operation: Some(Write), peer: Some(SameProcess), force_network: Some(false), ..row(Route::CopyEngine) },
        Row { operation: Some(Write), destinations: DEVICE_DEST, peer: Some(OtherHost), ..row(Route::Landing) },
        Row { operation: Some(Write), destinations: DEVICE_DEST, device_ipc: Some(true), ..row(Route::CopyEngineIpc) },
        Row { operation: Some(Write), destinations: DEVICE_DEST, ..row(Route::Landing) },
        Row {
            operation: Some(Write),
            source: Some(Device),
            destinations: SHARED_DEST,
            peer: Some(OtherHost),
            ..row(Route::Staged)
        },
        Row {
            operation: Some(Write),
            source: Some(Device),
            destinations: SHARED_DEST,
            device_shared_host: Some(true),
            ..row(Route::CopyIntoSharedHost)
        },
        Row { operation: Some(Write), source: Some(Device), destinations: HOST_DEST, ..row(Route::Staged) },
    ]
}

fn matches<T: PartialEq>(pattern: Option<T>, value: T) -> bool {
    pattern.is_none_or(|p| p == value)
}

impl Row {
    fn matches(&self, inputs: &RouteInputs) -> bool {
        let s = inputs.switches;
        matches(self.operation, inputs.operation)
            && matches(self.source, inputs.source)
            && self.destinations.contains(&inputs.destination)
            && matches(self.peer, inputs.locality)
            && matches(self.force_network, s.force_network)
            && matches(self.shm, s.shm)
            && matches(self.cma, s.cma)
            && matches(self.long, inputs.len >= s.cma_min_bytes)
            && matches(self.device_ipc, s.device_ipc)
            && matches(self.device_shared_host, s.device_shared_host)
    }
}

/// Every combination of the inputs (lengths just below and at the pull threshold).
fn every_input() -> Vec<RouteInputs> {
    const MIN: u64 = 64 << 10;
    let bools = [false, true];
    let mut all = Vec::new();
    for operation in [Write, Send] {
        for source in [Host, Device] {
            for destination in [D::Host, D::SharedHost, D::Device] {
                for locality in [SameProcess, SameHost, OtherHost] {
                    for len in [MIN - 1, MIN] {
                        for force_network in bools {
                            for shm in bools {
                                for cma in bools {
                                    for device_ipc in bools {
                                        for device_shared_host in bools {
                                            let switches = RouteSwitches {
                                                force_network,
                                                shm,
                                                cma,
                                                cma_min_bytes: MIN,
                                                device_ipc,
                                                device_shared_host,
                                            };
                                            all.push(RouteInputs {
                                                operation,
                                                source,
                                                destination,
                                                locality,
                                                len,
                                                switches,
                                            });
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    all
}

#[test]
fn choose_follows_the_route_table_for_every_input() {
    let table = table();
    let inputs = every_input();
    assert_eq!(inputs.len(), 2 * 2 * 3 * 3 * 2 * 32);
    let mut rows_used = HashSet::new();
    let mut routes_seen = HashSet::new();
    for input in &inputs {
        let (index, row) = table
            .iter()
            .enumerate()
            .find(|(_, row)| row.matches(input))
            .unwrap_or_else(|| panic!("no row of the table covers {input:?}"));
        rows_used.insert(index);
        let chosen = choose(*input);
        assert_eq!(chosen, row.route, "row {index} says {:?} for {input:?}", row.route);
        routes_seen.insert(chosen);
    }
    let unused: Vec<usize> = (0..table.len()).filter(|i| !rows_used.contains(i)).collect();
    assert!(unused.is_empty(), "rows {unused:?} are shadowed by earlier rows");
    let every_route = [
        Route::Memcpy,
        Route::Pull,
        Route::SharedMemory,
        Route::Udp,
        Route::CopyEngine,
        Route::CopyEngineIpc,
        Route::CopyIntoSharedHost,
        Route::Staged,
        Route::Landing,
    ];
    for route in every_route {
        assert!(routes_seen.contains(&route), "{route:?} is never chosen");
    }
}

#[test]
fn force_network_makes_a_peer_in_this_process_a_peer_of_this_host() {
    for input in every_input() {
        let forced = RouteSwitches { force_network: true, ..input.switches };
        let here = RouteInputs { locality: SameProcess, switches: forced, ..input };
        let next_door = RouteInputs { locality: SameHost, switches: forced, ..input };
        assert_eq!(choose(here), choose(next_door), "{input:?}");
    }
}

#[test]
fn device_routes_are_exactly_those_of_writes_touching_device_memory() {
    for input in every_input() {
        let touches_device = input.operation == Write && (input.source == Device || input.destination == D::Device);
        assert_eq!(choose(input).is_device_route(), touches_device, "{input:?}");
    }
}
