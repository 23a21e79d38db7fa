//! Traffic patterns: which host writes how many bytes to which, and when.

use core::time::Duration;
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// What a flow is part of, for reporting.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FlowClass {
    /// Background or permutation traffic.
    Bulk,
    /// One of the N senders of an incast.
    Incast,
    /// Traffic that merely shares the fabric with an incast.
    Victim,
}

/// One write of `bytes` from `src` to `dst`, submitted at `start`.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowSpec {
    pub src: u32,
    pub dst: u32,
    pub bytes: u64,
    pub start: Duration,
    pub class: FlowClass,
}

/// Each host sends `bytes` to a distinct host, none to itself (a random derangement).
pub fn permutation(hosts: u32, bytes: u64, rng: &mut ChaCha8Rng) -> Vec<FlowSpec> {
    assert!(hosts >= 2, "a permutation needs two hosts");
    let mut dst: Vec<u32> = (0..hosts).collect();
    dst.shuffle(rng);
    // Remove fixed points by swapping each with its neighbour: still a permutation.
    for i in 0..hosts as usize {
        if dst[i] == i as u32 {
            let j = (i + 1) % hosts as usize;
            dst.swap(i, j);
        }
    }
    debug_assert!(dst.iter().enumerate().all(|(i, &d)| d != i as u32));
    (0..hosts)
        .map(|src| FlowSpec { src, dst: dst[src as usize], bytes, start: Duration::ZERO, class: FlowClass::Bulk })
        .collect()
}

/// `fan_in` distinct random senders each write `bytes` to host `dst`.
pub fn incast(hosts: u32, fan_in: u32, dst: u32, bytes: u64, rng: &mut ChaCha8Rng) -> Vec<FlowSpec> {
    let mut senders: Vec<u32> = (0..hosts).filter(|&h| h != dst).collect();
    senders.shuffle(rng);
    senders.truncate(fan_in as usize);
    senders.sort_unstable();
    senders
        .into_iter()
        .map(|src| FlowSpec { src, dst, bytes, start: Duration::ZERO, class: FlowClass::Incast })
        .collect()
}

/// An `fan_in`:1 incast into host 0 of `incast_bytes` per sender, plus a permutation of
/// `victim_bytes` flows among all other hosts; the victims start first by `victim_lead`, so
/// the incast hits flows already at speed.
pub fn incast_with_victims(
    hosts: u32,
    fan_in: u32,
    incast_bytes: u64,
    victim_bytes: u64,
    victim_lead: Duration,
    rng: &mut ChaCha8Rng,
) -> Vec<FlowSpec> {
    let mut flows = incast(hosts, fan_in, 0, incast_bytes, rng);
    for f in &mut flows {
        f.start = victim_lead;
    }
    let others = hosts - 1;
    if others >= 2 {
        for v in permutation(others, victim_bytes, rng) {
            flows.push(FlowSpec { src: v.src + 1, dst: v.dst + 1, class: FlowClass::Victim, ..v });
        }
    }
    flows
}

/// The victims of an incast as streams of messages: a permutation among hosts
/// `0..victim_hosts` (the incast's receiver, host 0, among them, as in MoE serving where the hot
/// expert's host also takes part in the all-to-all), each pair sending `messages` messages of
/// `bytes`, message `i` submitted at `i * interval`. Each message is one flow, so percentiles
/// are over message latencies.
pub fn victim_messages(
    victim_hosts: u32,
    bytes: u64,
    messages: u32,
    interval: Duration,
    rng: &mut ChaCha8Rng,
) -> Vec<FlowSpec> {
    let mut flows = Vec::with_capacity(victim_hosts as usize * messages as usize);
    if victim_hosts < 2 {
        return flows;
    }
    let pairs = permutation(victim_hosts, bytes, rng);
    for i in 0..messages {
        for p in &pairs {
            flows.push(FlowSpec { start: interval * i, class: FlowClass::Victim, ..p.clone() });
        }
    }
    flows
}

/// Every host writes `bytes` to every other host; starts jittered by up to `jitter`.
pub fn all_to_all(hosts: u32, bytes: u64, jitter: Duration, rng: &mut ChaCha8Rng) -> Vec<FlowSpec> {
    let mut flows = Vec::with_capacity(hosts as usize * (hosts as usize - 1));
    for src in 0..hosts {
        for dst in (0..hosts).filter(|&d| d != src) {
            let start = if jitter.is_zero() {
                Duration::ZERO
            } else {
                Duration::from_nanos(rng.gen_range(0..jitter.as_nanos() as u64))
            };
            flows.push(FlowSpec { src, dst, bytes, start, class: FlowClass::Bulk });
        }
    }
    flows
}
