//! A host thread that produces descriptors exactly as a GPU thread does, for tests and for
//! host-driven use of the proxy.
#![allow(unsafe_code)]

use super::Ring;
use crate::error::{DeviceError, ProducerError};
use crate::layout::Descriptor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Writes descriptors into a host-placed [`Ring`] with the GPU producers' protocol. Cheap to
/// clone; any number may produce into one ring at once.
#[derive(Clone, Debug)]
pub struct HostProducer {
    ring: Arc<Ring>,
    timeout: Duration,
    ring_full_events: Arc<AtomicU64>,
}

impl HostProducer {
    /// A producer into `ring` that gives up after `timeout` of a full ring; `ring_full_events`
    /// counts pushes that found the ring full.
    pub fn new(ring: Arc<Ring>, timeout: Duration, ring_full_events: Arc<AtomicU64>) -> Result<Self, DeviceError> {
        if ring.producer_words().is_none() {
            return Err(DeviceError::NotHostPlacement { ring: ring.index() });
        }
        Ok(HostProducer { ring, timeout, ring_full_events })
    }

    /// Publishes `desc` (its `seq` is ignored and set by the protocol); returns its ticket.
    /// Blocks while the ring is full, at most the producer's timeout.
    pub fn push(&self, desc: &Descriptor) -> Result<u64, ProducerError> {
        let (reserved, cached_consumed) = self.ring.producer_words().expect("checked in new");
        let slots = u64::from(self.ring.slot_count());
        let ticket = reserved.fetch_add(1, Ordering::AcqRel);
        if ticket.wrapping_sub(cached_consumed.load(Ordering::Acquire)) >= slots {
            self.ring_full_events.fetch_add(1, Ordering::Relaxed);
            let start = Instant::now();
            let mut polls = 0u32;
            loop {
                let consumed = self.ring.consumed().load(Ordering::Acquire);
                // A stale, smaller value from a slower producer is harmless: it only makes
                // the next producer refresh once more.
                cached_consumed.store(consumed, Ordering::Release);
                if ticket.wrapping_sub(consumed) < slots {
                    break;
                }
                if start.elapsed() >= self.timeout {
                    return Err(ProducerError::RingFull {
                        ring: self.ring.index(),
                        ticket,
                        consumed,
                        slot_count: self.ring.slot_count(),
                        waited: start.elapsed(),
                    });
                }
                polls += 1;
                if polls < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        let slot = self.ring.slot_ptr(ticket) as *mut u8;
        let body = desc as *const Descriptor as *const u8;
        // Safety: the slot is in bounds and ours: `consumed > ticket - slots`, so the consumer
        // is done with its previous lap and will not read past `seq` until we store it. Bytes
        // 8..64 are every field but `seq`, which we store last, atomically.
        unsafe { std::ptr::copy_nonoverlapping(body.add(8), slot.add(8), std::mem::size_of::<Descriptor>() - 8) };
        self.ring.seq(ticket).store(ticket + 1, Ordering::Release);
        Ok(ticket)
    }
}
