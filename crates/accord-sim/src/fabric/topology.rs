//! Topologies: which nodes exist, which links join them, and every switch's equal-cost next
//! hops towards every host.
//!
//! Nodes are numbered hosts first (`0..hosts`), then switches. Every link is two directed
//! [`PortSpec`]s, one per direction; a port belongs to the node that transmits on it. Routes
//! are all shortest paths, which for a fat-tree is exactly up-down routing with ECMP over every
//! uplink. Every host hangs off one switch, so a switch's next hops towards a host are its next
//! hops towards that host's switch: one breadth-first search per host-facing switch, a table of
//! switches x host-facing switches (small enough to stay in cache), and identical next-hop sets
//! stored once.

use core::time::Duration;
use std::collections::{HashMap, VecDeque};

/// Largest topology built, in nodes (hosts plus switches); bounds every per-node table.
pub const NODES_MAX: u32 = 1 << 20;

/// The shapes the fabric can be built in.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum TopologyKind {
    /// Two hosts joined by one link, no switch.
    Pair,
    /// Two switches joined by one link, half the hosts on each.
    Dumbbell,
    /// Every host on one switch (the incast shape).
    Star,
    /// Leaf-spine: radix-`k` leaves with `k/2` hosts and `k/2` uplinks, `k/2` spines (`k²/2`
    /// hosts at most).
    FatTree2,
    /// The k-ary fat-tree of Al-Fares et al.: `k` pods of `k/2` edge and `k/2` aggregation
    /// switches, `(k/2)²` cores (`k³/4` hosts at most; k=16 gives 1024).
    FatTree3,
}

/// An unknown topology name.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown topology {0:?}: use one of pair, dumbbell, star, fat-tree-2, fat-tree-3")]
pub struct UnknownTopologyError(pub String);

impl TopologyKind {
    /// Parses `pair`, `dumbbell`, `star`, `fat-tree-2` (`leaf-spine`), `fat-tree-3` (`fat-tree`).
    pub fn from_name(name: &str) -> Result<Self, UnknownTopologyError> {
        match name.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "pair" => Ok(TopologyKind::Pair),
            "dumbbell" => Ok(TopologyKind::Dumbbell),
            "star" => Ok(TopologyKind::Star),
            "fat-tree-2" | "fattree2" | "leaf-spine" | "2-tier" => Ok(TopologyKind::FatTree2),
            "fat-tree-3" | "fattree3" | "fat-tree" | "3-tier" => Ok(TopologyKind::FatTree3),
            other => Err(UnknownTopologyError(other.to_string())),
        }
    }

    /// Smallest even radix whose fat-tree holds `hosts` (fat-trees only; 0 otherwise).
    pub fn radix_for(self, hosts: u32) -> u32 {
        let capacity = |k: u64| match self {
            TopologyKind::FatTree2 => k * k / 2,
            TopologyKind::FatTree3 => k * k * k / 4,
            _ => u64::MAX,
        };
        match self {
            TopologyKind::FatTree2 | TopologyKind::FatTree3 => {
                let mut k = 2u64;
                while capacity(k) < hosts as u64 {
                    k += 2;
                }
                k as u32
            }
            _ => 0,
        }
    }
}

/// One direction of a link: `from` transmits, `to` receives.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PortSpec {
    pub from: u32,
    pub to: u32,
    pub rate_bps: u64,
    pub latency: Duration,
}

/// Rates and delays of a topology's links.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct LinkSpec {
    /// Line rate of every link, bits per second.
    pub rate_bps: u64,
    /// Propagation delay of every link.
    pub latency: Duration,
}

/// Why a topology could not be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TopologyError {
    #[error("{kind:?} needs {need} hosts, got {got}")]
    HostCount { kind: TopologyKind, need: &'static str, got: u32 },
    #[error("topology of {0} nodes exceeds NODES_MAX ({NODES_MAX}): use fewer hosts")]
    TooLarge(u64),
    #[error("host {0} cannot reach host {1}: the topology is disconnected")]
    Disconnected(u32, u32),
}

/// A built topology with its routes.
#[derive(Clone, Debug)]
pub struct Topology {
    /// The shape it was built as.
    pub kind: TopologyKind,
    /// Fat-tree radix (0 for the others).
    pub radix: u32,
    hosts: u32,
    switches: u32,
    ports: Vec<PortSpec>,
    /// The single port each host transmits on (its NIC).
    host_ports: Vec<u32>,
    /// Switch each host hangs off (for `Pair`, the other host).
    attach: Vec<u32>,
    /// Dense index of each host's switch among the host-facing switches.
    attach_index: Vec<u32>,
    /// Port from each host's switch down to the host.
    down_ports: Vec<u32>,
    /// Host-facing switches.
    attach_count: u32,
    /// Per switch, per host-facing switch: index into `route_sets`.
    routes: Vec<u32>,
    /// Interned next-hop sets: (start, len) into `route_ports`.
    route_sets: Vec<(u32, u32)>,
    route_ports: Vec<u32>,
}

struct Builder {
    hosts: u32,
    switches: u32,
    link: LinkSpec,
    ports: Vec<PortSpec>,
}

impl Builder {
    fn switch(&mut self) -> u32 {
        self.switches += 1;
        self.hosts + self.switches - 1
    }
    fn link(&mut self, a: u32, b: u32) {
        for (from, to) in [(a, b), (b, a)] {
            self.ports.push(PortSpec { from, to, rate_bps: self.link.rate_bps, latency: self.link.latency });
        }
    }
}

impl Topology {
    /// Builds `kind` with `hosts` hosts. Fat-trees use the smallest radix that holds them and
    /// leave the remaining host slots empty.
    pub fn build(kind: TopologyKind, hosts: u32, link: LinkSpec) -> Result<Self, TopologyError> {
        let need = |need| Err(TopologyError::HostCount { kind, need, got: hosts });
        match kind {
            TopologyKind::Pair if hosts != 2 => return need("exactly 2"),
            TopologyKind::Dumbbell if hosts < 2 => return need("at least 2"),
            _ if hosts < 2 => return need("at least 2"),
            _ => {}
        }
        let mut b = Builder { hosts, switches: 0, link, ports: Vec::new() };
        let mut radix = 0;
        match kind {
            TopologyKind::Pair => b.link(0, 1),
            TopologyKind::Star => {
                let s = b.switch();
                (0..hosts).for_each(|h| b.link(h, s));
            }
            TopologyKind::Dumbbell => {
                let (left, right) = (b.switch(), b.switch());
                b.link(left, right);
                (0..hosts).for_each(|h| b.link(h, if h < hosts / 2 { left } else { right }));
            }
            TopologyKind::FatTree2 => {
                radix = kind.radix_for(hosts);
                let half = radix / 2;
                let leaves = hosts.div_ceil(half);
                let spines: Vec<u32> = (0..half).map(|_| b.switch()).collect();
                for leaf_index in 0..leaves {
                    let leaf = b.switch();
                    spines.iter().for_each(|&s| b.link(leaf, s));
                    (leaf_index * half..((leaf_index + 1) * half).min(hosts)).for_each(|h| b.link(h, leaf));
                }
            }
            TopologyKind::FatTree3 => {
                radix = kind.radix_for(hosts);
                let half = radix / 2;
                let pods = hosts.div_ceil(half * half);
                let cores: Vec<u32> = (0..half * half).map(|_| b.switch()).collect();
                for pod in 0..pods {
                    let aggs: Vec<u32> = (0..half).map(|_| b.switch()).collect();
                    for (j, &agg) in aggs.iter().enumerate() {
                        (0..half).for_each(|c| b.link(agg, cores[j * half as usize + c as usize]));
                    }
                    for e in 0..half {
                        let first = (pod * half + e) * half;
                        if first >= hosts {
                            break;
                        }
                        let edge = b.switch();
                        aggs.iter().for_each(|&a| b.link(edge, a));
                        (first..(first + half).min(hosts)).for_each(|h| b.link(h, edge));
                    }
                }
            }
        }
        let nodes = hosts as u64 + b.switches as u64;
        if nodes > NODES_MAX as u64 {
            return Err(TopologyError::TooLarge(nodes));
        }
        let mut topo = Topology {
            kind,
            radix,
            hosts,
            switches: b.switches,
            ports: b.ports,
            host_ports: Vec::new(),
            attach: Vec::new(),
            attach_index: Vec::new(),
            down_ports: Vec::new(),
            attach_count: 0,
            routes: Vec::new(),
            route_sets: Vec::new(),
            route_ports: Vec::new(),
        };
        topo.compute_routes()?;
        Ok(topo)
    }

    /// All shortest paths towards every host-facing switch, one BFS each. Hosts do not forward.
    fn compute_routes(&mut self) -> Result<(), TopologyError> {
        let nodes = (self.hosts + self.switches) as usize;
        let mut out: Vec<Vec<u32>> = vec![Vec::new(); nodes];
        for (i, p) in self.ports.iter().enumerate() {
            out[p.from as usize].push(i as u32);
        }
        self.host_ports = (0..self.hosts as usize).map(|h| out[h][0]).collect();
        self.attach = self.host_ports.iter().map(|&p| self.ports[p as usize].to).collect();
        let mut targets: Vec<u32> = Vec::new();
        let mut index_of = vec![u32::MAX; nodes];
        for &a in &self.attach {
            if index_of[a as usize] == u32::MAX {
                index_of[a as usize] = targets.len() as u32;
                targets.push(a);
            }
        }
        self.attach_index = self.attach.iter().map(|&a| index_of[a as usize]).collect();
        self.attach_count = targets.len() as u32;
        self.down_ports = (0..self.hosts)
            .map(|h| {
                let a = self.attach[h as usize];
                out[a as usize].iter().copied().find(|&p| self.ports[p as usize].to == h).unwrap_or(0)
            })
            .collect();
        self.routes = vec![0; self.switches as usize * targets.len()];
        let mut interned: HashMap<Vec<u32>, u32> = HashMap::new();
        let mut dist = vec![u32::MAX; nodes];
        let mut frontier = VecDeque::new();
        for (t, &target) in targets.iter().enumerate() {
            dist.fill(u32::MAX);
            dist[target as usize] = 0;
            frontier.clear();
            frontier.push_back(target);
            while let Some(n) = frontier.pop_front() {
                if n < self.hosts && n != target {
                    continue; // hosts do not forward (a pair's target is a host)
                }
                for &p in &out[n as usize] {
                    let to = self.ports[p as usize].to as usize;
                    if dist[to] == u32::MAX {
                        dist[to] = dist[n as usize] + 1;
                        frontier.push_back(to as u32);
                    }
                }
            }
            if let Some(src) = (0..self.hosts).find(|&h| dist[h as usize] == u32::MAX) {
                let dst = (0..self.hosts).find(|&h| self.attach[h as usize] == target).unwrap_or(0);
                return Err(TopologyError::Disconnected(src, dst));
            }
            for s in 0..self.switches {
                let node = (self.hosts + s) as usize;
                let next: Vec<u32> = out[node]
                    .iter()
                    .copied()
                    .filter(|&p| {
                        let to = self.ports[p as usize].to;
                        to >= self.hosts && dist[to as usize] + 1 == dist[node]
                    })
                    .collect();
                let set = match interned.get(&next) {
                    Some(&set) => set,
                    None => {
                        let set = self.route_sets.len() as u32;
                        self.route_sets.push((self.route_ports.len() as u32, next.len() as u32));
                        self.route_ports.extend_from_slice(&next);
                        interned.insert(next, set);
                        set
                    }
                };
                self.routes[s as usize * targets.len() + t] = set;
            }
        }
        Ok(())
    }

    /// Hosts, numbered `0..hosts`.
    pub fn hosts(&self) -> u32 {
        self.hosts
    }

    /// Switches, numbered `hosts..hosts + switches` as nodes.
    pub fn switches(&self) -> u32 {
        self.switches
    }

    /// Every directed link; a port's index is its id.
    pub fn ports(&self) -> &[PortSpec] {
        &self.ports
    }

    /// The port host `host` transmits on.
    pub fn host_port(&self, host: u32) -> u32 {
        self.host_ports[host as usize]
    }

    /// Whether node `node` is a host.
    pub fn is_host(&self, node: u32) -> bool {
        node < self.hosts
    }

    /// Equal-cost output ports of switch node `switch_node` towards host `dst`.
    pub fn next_hops(&self, switch_node: u32, dst: u32) -> &[u32] {
        if self.attach[dst as usize] == switch_node {
            return core::slice::from_ref(&self.down_ports[dst as usize]);
        }
        let s = (switch_node - self.hosts) as usize;
        let t = self.attach_index[dst as usize] as usize;
        let (start, len) = self.route_sets[self.routes[s * self.attach_count as usize + t] as usize];
        &self.route_ports[start as usize..(start + len) as usize]
    }

    /// Links on the shortest path between two hosts (for the base RTT).
    pub fn hop_count(&self, src: u32, dst: u32) -> u32 {
        let mut node = self.ports[self.host_port(src) as usize].to;
        let mut hops = 1;
        while node != dst {
            let p = self.next_hops(node, dst)[0];
            node = self.ports[p as usize].to;
            hops += 1;
        }
        hops
    }

    /// Largest host-to-host hop count (the diameter in links).
    pub fn diameter_hops(&self) -> u32 {
        match self.kind {
            TopologyKind::Pair => 1,
            TopologyKind::Star => 2,
            TopologyKind::Dumbbell => 3,
            TopologyKind::FatTree2 => {
                if self.hosts <= self.radix / 2 {
                    2
                } else {
                    4
                }
            }
            TopologyKind::FatTree3 => (0..self.hosts).map(|h| self.hop_count(0, h)).max().unwrap_or(1),
        }
    }
}

/// The ECMP hash of a switch: mixes (source host, destination host, path entropy, salt).
/// SplitMix64's finaliser applied twice; a per-switch salt decorrelates tiers.
pub fn ecmp_hash(src: u32, dst: u32, path: u16, salt: u64) -> u64 {
    let x = mix64(salt ^ ((src as u64) << 32 | dst as u64));
    mix64(x ^ path as u64)
}

/// SplitMix64's output function.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
