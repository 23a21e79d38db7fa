//! What one stream-lane batch costs the proxy's thread on the host alone, without a GPU: the
//! inline values turned into copies and the batch merged and handed to a sink that only counts
//! (`accord-device-bench --host-batch`).
//!
//! Why: at 10 million puts a second one proxy thread has 100 ns a put for everything, and the
//! device host's figures move between runs more than a change of 10 ns does. This measures the
//! Rust part of queueing on any machine, the same batch every time, so two builds can be
//! compared on a quiet core before device time is spent.

use crate::lane::{queue_batch, values_as_copies, BatchScratch, BatchStores, LaneItem, LaneSink, LaneWork};
use crate::layout::SignalOp;
use std::time::Instant;

/// The host cost of one batch shape, per item.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct LaneHostCost {
    /// Items a batch.
    pub items: usize,
    /// Batches timed.
    pub batches: usize,
    /// Copies the sink received per batch after merging.
    pub copies_per_batch: f64,
    /// ns per item writing the values into their cells and turning them into copies.
    pub values_ns: f64,
    /// ns per item sorting, merging and handing the copies and stores to the sink.
    pub queue_ns: f64,
}

/// A sink that takes every call and only counts copies.
#[derive(Default)]
struct CountingSink {
    copies: usize,
}

impl LaneSink for CountingSink {
    fn copy(&mut self, _: u64, _: u64, _: u64) -> Result<(), String> {
        self.copies += 1;
        Ok(())
    }
    fn copy_many(&mut self, copies: &[(u64, u64, u64)]) -> Result<usize, String> {
        self.copies += copies.len();
        Ok(1)
    }
    fn write_value(&mut self, _: u64, _: u64) -> Result<(), String> {
        Ok(())
    }
    fn write_values(&mut self, _: &[(u64, u64)]) -> Result<usize, String> {
        Ok(1)
    }
}

/// A batch like the one `accord-device-bench --only rate` gives a proxy at stride 8: `items`
/// 8-byte inline values with consecutive tickets from `first_ticket`, warps of 32 writing 256
/// contiguous bytes each, the warps in a scrambled order (as their ring slots are claimed).
fn rate_batch(items: usize, first_ticket: u64, out: &mut Vec<LaneItem>) {
    const WARP: usize = 32;
    let warps = items.div_ceil(WARP);
    out.clear();
    for slot in 0..items {
        let (w, lane) = (slot / WARP, slot % WARP);
        // A fixed scramble of the warp order: multiplying by an odd number permutes the warps
        // of the next power of two, and close enough to arbitrary for the sort. Below that power
        // the destinations stay distinct but leave gaps (fewer copies merge): use a
        // power-of-two multiple of 32 items (stop 45 timed `--host-batch 1024`) for the rate
        // kernel's contiguous layout.
        let warp_at = (w * 37 + 11) % warps.next_power_of_two();
        let dst = 0x7000_0000 + ((warp_at * WARP + lane) as u64) * 8;
        out.push(LaneItem {
            ticket: first_ticket + slot as u64,
            work: LaneWork::Value { dst, value: slot as u64 },
            signal_op: SignalOp::None,
            signal_id: 0,
            signal_value: 0,
        });
    }
}

/// Times `batches` batches of `items` inline values through the proxy's host steps; the cells
/// are a plain buffer of `slots` words (a ring slot's cell, as the proxy's mapped cells are).
pub fn lane_batch_host_cost(items: usize, batches: usize) -> LaneHostCost {
    let slots = (items * 16).next_power_of_two();
    let mut cells = vec![0u64; slots];
    let cell_base = 0x1000_0000u64;
    let mut batch = Vec::with_capacity(items);
    let mut scratch = BatchScratch::default();
    let mut sink = CountingSink::default();
    let (mut values_ns, mut queue_ns) = (0u128, 0u128);
    let mut signal = |_: u32, _: SignalOp, _: u64| 0u64;
    for b in 0..batches.max(1) {
        rate_batch(items, (b * items) as u64, &mut batch);
        let mask = slots as u64 - 1;
        let start = Instant::now();
        values_as_copies(&mut batch, &mut scratch, &|t| cell_base + (t & mask) * 8, &mut |t, v| {
            cells[(t & mask) as usize] = v;
        });
        let converted = Instant::now();
        let how = BatchStores {
            advance: &mut signal,
            signal_slot: &|_| 0,
            done_word: 0x2000_0000,
            done_value: b as u64 + 1,
            aside_from_bytes: 0,
        };
        let queued = queue_batch(&mut sink, &mut scratch, &batch, how);
        let end = Instant::now();
        assert!(queued.is_ok(), "the counting sink takes every call");
        values_ns += (converted - start).as_nanos();
        queue_ns += (end - converted).as_nanos();
    }
    std::hint::black_box(&cells);
    let n = (items * batches.max(1)) as f64;
    LaneHostCost {
        items,
        batches: batches.max(1),
        copies_per_batch: sink.copies as f64 / batches.max(1) as f64,
        values_ns: values_ns as f64 / n,
        queue_ns: queue_ns as f64 / n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_batch_covers_one_contiguous_range_so_it_merges_into_one_copy() {
        let cost = lane_batch_host_cost(1024, 3);
        assert_eq!(cost.copies_per_batch, 1.0, "{cost:?}");
        assert!(cost.values_ns > 0.0 && cost.queue_ns > 0.0);
    }
}
