//! Go-back-N: the loss recovery RDMA NICs implement in hardware (RoCE), as a baseline on the
//! same links as Accord. One path (a queue pair hashes to one), cumulative ACKs, a NAK at the
//! first sequence error, and on a NAK or a timeout the sender rewinds to the first unacked
//! packet and sends everything after it again. Payloads are virtual: only sizes move.

use crate::events::EventQueue;
use crate::link::{Fate, FaultConfig, LinkConfig, Nic};
use accord_proto::Instant;
use core::time::Duration;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Bytes of an ACK or NAK on the wire (before framing).
const ACK_BYTES: u64 = 32;
/// Bytes of our data header, to match Accord's packets size for size.
const DATA_HEADER_BYTES: u64 = accord_proto::wire::DATA_HEADER_LEN as u64;

/// A go-back-N transfer's settings.
#[derive(Clone, Debug)]
pub struct GbnConfig {
    pub seed: u64,
    pub link: LinkConfig,
    pub faults: FaultConfig,
    pub mss_bytes: u64,
    /// Packets in flight at most (a NIC's outstanding-request limit).
    pub window_packets: u64,
    /// Retransmission timeout (no progress for this long: rewind).
    pub rto: Duration,
    pub time_limit: Duration,
}

/// What a transfer measured.
#[derive(Clone, Debug, PartialEq)]
pub struct GbnResult {
    pub completion: Duration,
    pub packets_sent: u64,
    pub rewinds: u64,
}

enum Ev {
    DataArrives { psn: u64 },
    AckArrives { cum: u64, nak: bool },
    SenderNicFree { bytes: u64 },
    Timeout { generation: u64 },
}

/// Moves `bytes` from one host to the other with go-back-N.
pub fn transfer(cfg: &GbnConfig, bytes: u64) -> Result<GbnResult, String> {
    let total = bytes.div_ceil(cfg.mss_bytes).max(1);
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mut queue: EventQueue<Ev> = EventQueue::default();
    let (mut sender_nic, mut receiver_nic) = (Nic::default(), Nic::default());
    let (mut base, mut next, mut expected) = (0u64, 0u64, 0u64);
    let mut nak_outstanding = false;
    let (mut packets_sent, mut rewinds, mut timer_generation) = (0u64, 0u64, 0u64);
    let mut now = Instant::ZERO;
    let limit = Instant::ZERO + cfg.time_limit;
    let packet_len = |psn: u64| DATA_HEADER_BYTES + (bytes - psn * cfg.mss_bytes).min(cfg.mss_bytes);
    queue.push(now, Ev::SenderNicFree { bytes: 0 });
    while base < total {
        let Some((at, ev)) = queue.pop() else { return Err("go-back-N stalled".into()) };
        now = at;
        if now > limit {
            return Err(format!("seed {}: go-back-N did not finish within {:?}", cfg.seed, cfg.time_limit));
        }
        match ev {
            Ev::DataArrives { psn } => {
                // The receiver: in order only.
                let reply = if psn == expected {
                    expected += 1;
                    nak_outstanding = false;
                    Some((expected, false))
                } else if psn > expected && !nak_outstanding {
                    nak_outstanding = true;
                    Some((expected, true))
                } else if psn < expected {
                    Some((expected, false))
                } else {
                    None
                };
                if let Some((cum, nak)) = reply {
                    let departs = receiver_nic.enqueue(now, ACK_BYTES, &cfg.link);
                    if let Fate::Deliver(delays) = cfg.faults.decide(&mut rng) {
                        queue.push(departs + cfg.link.propagation + delays[0], Ev::AckArrives { cum, nak });
                    }
                }
            }
            Ev::AckArrives { cum, nak } => {
                if cum > base {
                    base = cum;
                    timer_generation += 1;
                    queue.push(now + cfg.rto, Ev::Timeout { generation: timer_generation });
                }
                if nak && cum >= base && next > cum {
                    next = cum;
                    rewinds += 1;
                }
            }
            Ev::SenderNicFree { bytes } => sender_nic.dequeued(bytes),
            Ev::Timeout { generation } => {
                if generation == timer_generation && base < total {
                    next = base;
                    rewinds += 1;
                    timer_generation += 1;
                    queue.push(now + cfg.rto, Ev::Timeout { generation: timer_generation });
                }
            }
        }
        // The sender: fill the window while the NIC queue has room.
        while next < total
            && next < base + cfg.window_packets
            && sender_nic.queued_bytes() < cfg.link.nic_queue_bytes_max
        {
            let len = packet_len(next);
            let departs = sender_nic.enqueue(now, len, &cfg.link);
            queue.push(departs, Ev::SenderNicFree { bytes: len });
            packets_sent += 1;
            if let Fate::Deliver(delays) = cfg.faults.decide(&mut rng) {
                queue.push(departs + cfg.link.propagation + delays[0], Ev::DataArrives { psn: next });
            }
            if next == base {
                timer_generation += 1;
                queue.push(now + cfg.rto, Ev::Timeout { generation: timer_generation });
            }
            next += 1;
        }
    }
    Ok(GbnResult { completion: now - Instant::ZERO, packets_sent, rewinds })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(loss: f64) -> GbnConfig {
        GbnConfig {
            seed: 1,
            link: LinkConfig::datacenter_100g(),
            faults: FaultConfig { loss, ..Default::default() },
            mss_bytes: 4096,
            window_packets: 64,
            rto: Duration::from_micros(100),
            time_limit: Duration::from_secs(5),
        }
    }

    #[test]
    fn lossless_transfer_runs_at_line_rate() {
        let r = transfer(&cfg(0.0), 8 << 20).unwrap();
        let ideal = LinkConfig::datacenter_100g().serialisation(4096 + 96) * 2048;
        assert!(r.completion >= ideal);
        assert_eq!(r.rewinds, 0);
        assert_eq!(r.packets_sent, 2048);
    }

    #[test]
    fn loss_forces_rewinds_and_resends() {
        let r = transfer(&cfg(0.01), 8 << 20).unwrap();
        assert!(r.rewinds > 0);
        assert!(r.packets_sent > 2048 + r.rewinds);
    }
}
