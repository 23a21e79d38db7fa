//! The stream lane: how a proxy runs descriptors for a peer whose window and signal slots GPU
//! code of this rank can reach by address (a same-host peer through CUDA IPC, or a peer in
//! this process), without an engine write per descriptor.
//!
//! Why: through the engine, every descriptor costs a copy, an event, a poller thread's query, a
//! completion thread's callback and a channel hop back to the proxy, and its signal costs the
//! same again once the put completed; on the 2xH200 host that was about 10 us per put
//! (docs/results/2026-11-26-device-api.md). Here a batch of descriptors to one peer becomes, on
//! one CUDA stream of this rank's GPU and in this order:
//! 1. the batch's puts, sorted by destination and merged where both ends are contiguous, the
//!    merged runs in one `cuMemcpyBatchAsync` (copy engine, no SM; one `cuMemcpyDtoDAsync`
//!    each where the driver lacks it); `put_value`s of 8 aligned bytes (and 8-byte puts, which
//!    the header sends inline as values) as `cuStreamWriteValue64` when a batch holds one,
//!    else as copies from host cells that merge like the puts ([`values_as_copies`]); copies
//!    that overlap an earlier put's bytes wait for it ([`ticket_ordered_segments`]);
//! 2. each signal the batch touched, once, with its newest running value, as a
//!    `cuStreamWriteValue64` into this rank's slot at the peer (the stream orders it after every
//!    byte above, with a memory barrier first, so a signal is never seen before its data);
//! 3. a `cuStreamWriteValue64` of the batch's last ticket plus one into a mapped host word the
//!    proxy polls: that word passing a ticket is its completion (counters, flush), with no
//!    event, no poller thread and no callback.
//!
//! A batch whose copies move at least the communicator's `lane_stores_aside_bytes` (0 by
//! default: [`DEFAULT_STORES_ASIDE_BYTES`] says why) queues steps 2 and 3 on a second stream
//! instead, behind an event recorded after its copies: the stores' memory barrier then no longer
//! holds the copy stream, and the next batch's copy starts while the stores wait. A later small
//! batch makes the copy stream wait for the stores set aside before its own, so a signal's
//! values still land in order.
//!
//! The lane's streams and signal values are per peer and shared by every ring's proxy under one
//! lock, so the order in which values are computed is the order in which they are written.
//! Puts of one batch may run in any order among themselves (puts are unordered, as in the rest
//! of the device API), except that puts whose destination bytes overlap keep their ticket order.

use crate::layout::SignalOp;
use accord_cuda::{DevicePtr, Event, EventKind, Stream};
use accord_engine::DeviceRegionMapping;
use std::sync::{Mutex, RwLock};

mod order;

use order::{merge_sorted, sort_by_dst};
pub(crate) use order::{sort_by_dst_within, ticket_ordered_segments, DstBounds};

/// Where a lane item's bytes come from and go to (device addresses in this rank's context).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum LaneWork {
    /// Copy `len` bytes from `src` to `dst`.
    Copy { dst: u64, src: u64, len: u64 },
    /// Store the 8-byte `value` at `dst` (8-byte aligned).
    Value { dst: u64, value: u64 },
    /// No data: only the signal action.
    SignalOnly,
}

/// One descriptor the lane runs: its work and its signal action.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct LaneItem {
    pub(crate) ticket: u64,
    pub(crate) work: LaneWork,
    pub(crate) signal_op: SignalOp,
    pub(crate) signal_id: u32,
    pub(crate) signal_value: u64,
}

/// What a lane queues its work on (a CUDA stream; a recorder in tests).
pub(crate) trait LaneSink {
    /// Queues a copy.
    fn copy(&mut self, dst: u64, src: u64, len: u64) -> Result<(), String>;
    /// Queues several copies that may run in any order among themselves; returns the driver
    /// calls it took.
    fn copy_many(&mut self, copies: &[(u64, u64, u64)]) -> Result<usize, String> {
        for &(dst, src, len) in copies {
            self.copy(dst, src, len)?;
        }
        Ok(copies.len())
    }
    /// Queues an 8-byte store after everything queued before it.
    fn write_value(&mut self, dst: u64, value: u64) -> Result<(), String>;
    /// Queues several stores, in this order; returns the driver calls it took.
    fn write_values(&mut self, stores: &[(u64, u64)]) -> Result<usize, String> {
        for &(dst, value) in stores {
            self.write_value(dst, value)?;
        }
        Ok(stores.len())
    }
    /// Where the stores queued next go: `aside` on a second stream, after everything queued so
    /// far (so the copy stream goes on without waiting for them), else on the copy stream,
    /// after every store set aside before. Returns the driver calls it took. A sink with one
    /// queue has nothing to do.
    fn route_stores(&mut self, aside: bool) -> Result<usize, String> {
        let _ = aside;
        Ok(0)
    }
}

/// Copies a batch must move for its stores to go aside by default: 0, never. On 2xH200 (a
/// 4,096-token expert-parallel dispatch, docs/results/2026-11-26-ep.md, stop 37) aside cut the
/// copy engine's gaps between chunks from 7-13 us to 3-4 us, but each chunk's signal then
/// crossed to the second stream before it landed, and the dispatch, which waits for every
/// chunk's signal, was no faster (num_worst_tokens 348 and 344 us against 340 and 338 without,
/// alternated). So it is opt-in (`DeviceCommConfig::lane_stores_aside_bytes`), for streams of
/// large puts whose signals matter less than the copy engine's throughput.
pub const DEFAULT_STORES_ASIDE_BYTES: u64 = 0;

/// The streams of one peer's lane: copies, the stores of small batches, and (created on first
/// use) a second stream for the stores of large ones, with the events that order the two.
pub(crate) struct LaneStreams {
    copy: Stream,
    aside: Option<AsideStores>,
    /// Whether the last batch's stores went aside.
    stores_aside: bool,
}

struct AsideStores {
    stream: Stream,
    /// Recorded on the copy stream after a batch's copies; the aside stream waits for it.
    copies_queued: Event,
    /// Recorded on the aside stream before a small batch's stores; the copy stream waits for it.
    stores_queued: Event,
}

impl LaneStreams {
    /// The lane's streams; with `aside`, the second stream and its events are made now, at
    /// start-up, rather than by the proxy on the first large batch (where making them stays
    /// the fallback if this fails).
    pub(crate) fn new(copy: Stream, aside: bool) -> LaneStreams {
        let mut lane = LaneStreams { copy, aside: None, stores_aside: false };
        if aside {
            if let Err(e) = lane.make_aside() {
                tracing::debug!(error = %e, "the lane's store stream is made on its first large batch instead");
            }
        }
        lane
    }

    /// Makes the second stream and its events, once.
    fn make_aside(&mut self) -> Result<(), String> {
        if self.aside.is_some() {
            return Ok(());
        }
        let gpu = self.copy.gpu().clone();
        let made = Stream::new(&gpu).and_then(|stream| {
            Ok(AsideStores {
                stream,
                copies_queued: Event::new(&gpu, EventKind::SyncOnly)?,
                stores_queued: Event::new(&gpu, EventKind::SyncOnly)?,
            })
        });
        self.aside = Some(made.map_err(|e| format!("lane store stream: {e}"))?);
        Ok(())
    }

    /// Whether both streams are idle; an error when either met a fault.
    pub(crate) fn query(&self) -> Result<bool, String> {
        let copy_idle = self.copy.query().map_err(|e| e.to_string())?;
        let aside_idle = match &self.aside {
            Some(a) => a.stream.query().map_err(|e| e.to_string())?,
            None => true,
        };
        Ok(copy_idle && aside_idle)
    }

    fn store_stream(&self) -> &Stream {
        match (&self.aside, self.stores_aside) {
            (Some(a), true) => &a.stream,
            _ => &self.copy,
        }
    }
}

/// The lane's CUDA streams as a [`LaneSink`].
pub(crate) struct StreamSink<'a>(pub(crate) &'a mut LaneStreams);

impl LaneSink for StreamSink<'_> {
    fn copy(&mut self, dst: u64, src: u64, len: u64) -> Result<(), String> {
        let len = usize::try_from(len).map_err(|_| "length does not fit this machine".to_string())?;
        // Safety: `src` lies in a window of this rank on this GPU, or in the proxy's mapped
        // host cells (a value), and `dst` in the peer's window as mapped here, both checked
        // against their lengths by the proxy before the item was made; the windows and cells
        // stay until the communicator closes, which stops the proxies (draining these streams)
        // first.
        #[allow(unsafe_code)]
        unsafe { self.0.copy.copy_unchecked(DevicePtr(dst), DevicePtr(src), len) }
            .map_err(|e| format!("lane copy: {e}"))
    }

    fn write_value(&mut self, dst: u64, value: u64) -> Result<(), String> {
        self.0.store_stream().write_value_u64(DevicePtr(dst), value).map_err(|e| format!("lane store: {e}"))
    }

    /// The batch's stores in as few calls as the driver allows (`Stream::write_values_u64`).
    fn write_values(&mut self, stores: &[(u64, u64)]) -> Result<usize, String> {
        let list: Vec<(DevicePtr, u64)> = stores.iter().map(|&(d, v)| (DevicePtr(d), v)).collect();
        self.0.store_stream().write_values_u64(&list).map_err(|e| format!("lane stores: {e}"))
    }

    fn route_stores(&mut self, aside: bool) -> Result<usize, String> {
        let lane = &mut *self.0;
        if aside {
            lane.make_aside()?;
            let Some(a) = lane.aside.as_ref() else { return Ok(0) };
            a.copies_queued.record(&lane.copy).map_err(|e| format!("lane event: {e}"))?;
            a.stream.wait_event(&a.copies_queued).map_err(|e| format!("lane event wait: {e}"))?;
            lane.stores_aside = true;
            return Ok(2);
        }
        match (&lane.aside, lane.stores_aside) {
            (Some(a), true) => {
                a.stores_queued.record(&a.stream).map_err(|e| format!("lane event: {e}"))?;
                lane.copy.wait_event(&a.stores_queued).map_err(|e| format!("lane event wait: {e}"))?;
                lane.stores_aside = false;
                Ok(2)
            }
            _ => Ok(0),
        }
    }

    /// The batch's copies in as few calls as the driver allows (`Stream::copy_many_unchecked`).
    fn copy_many(&mut self, copies: &[(u64, u64, u64)]) -> Result<usize, String> {
        let mut list = Vec::with_capacity(copies.len());
        for &(dst, src, len) in copies {
            let len = usize::try_from(len).map_err(|_| "length does not fit this machine".to_string())?;
            list.push((DevicePtr(dst), DevicePtr(src), len));
        }
        // Safety: as in `copy`, for every copy of the batch.
        #[allow(unsafe_code)]
        unsafe { self.0.copy.copy_many_unchecked(&list) }.map_err(|e| format!("lane copies: {e}"))
    }
}

/// Buffers one proxy's batches reuse from turn to turn, so that once they have grown a batch
/// allocates nothing. Why: a 1,024-put batch used to allocate about ten vectors (values, their
/// cells, two sorts' outputs and counts, the copies, their sorted and merged lists), at a few
/// hundred nanoseconds each, when the whole batch has about 100 us (`lane_cost` measures it).
#[derive(Default)]
pub(crate) struct BatchScratch {
    /// A batch's values.
    values: Vec<BatchValue>,
    values_spare: Vec<BatchValue>,
    /// The tickets whose cells the values take, ascending.
    cells: Vec<u64>,
    /// Copies in ticket order, then sorted and merged.
    copies: Vec<(u64, u64, u64)>,
    sorted: Vec<(u64, u64, u64)>,
    sorted_spare: Vec<(u64, u64, u64)>,
    merged: Vec<(u64, u64, u64)>,
    /// Value, signal and done stores.
    stores: Vec<(u64, u64)>,
    /// Counting sort counts.
    counts: Vec<u32>,
}

/// How many `put_value`s (8 bytes each) a batch must hold for them to be copied from host cells
/// instead of stored one by one: 2. (A value whose destination is not 8-byte aligned is always
/// copied: a stream store needs an aligned address.) Why: a stream store is one driver operation each
/// (at most 255 a call, and the GPU runs them one at a time); with ACCORD_DEVICE_PUT_INLINE every
/// aligned 8-byte put is a value, and a grid of them as stream stores fell from 6.6 to 0.38 M
/// puts/s on the 2xH200 host (stop 43), while copies from contiguous cells merge. One value
/// alone (the ping-pong's) stays a store: it rides in the batch's one store call.
pub const VALUES_AS_COPIES_MIN: usize = 2;

/// Turns a batch's value stores into 8-byte copies from host cells when it holds at least
/// [`VALUES_AS_COPIES_MIN`] of them. The cells used are those of the values' own tickets
/// (`cell_of(ticket)`: the device address of a ticket's cell, free until that ticket completes,
/// and a batch's tickets complete together), handed out in ascending order to the values sorted
/// by destination, so values to contiguous destinations sit in contiguous cells and merge into
/// one copy; `write_cell(ticket, value)` fills the cell of `ticket`.
///
/// A batch of values alone, none with a signal (a grid's 8-byte puts, the rate that matters
/// most), also comes back reordered by destination, so that [`queue_batch`] finds its copies
/// sorted and does not sort them again. Nothing else depends on the order of such a batch:
/// values to one destination keep their ticket order (the sort is stable) and no signal value
/// is computed from it.
pub(crate) fn values_as_copies(
    items: &mut [LaneItem],
    scratch: &mut BatchScratch,
    cell_of: &dyn Fn(u64) -> u64,
    write_cell: &mut dyn FnMut(u64, u64),
) {
    let BatchScratch { values, values_spare, cells, counts, .. } = scratch;
    values.clear();
    // One pass: the values, their destinations' bounds for the sort, and whether their tickets
    // run on one by one (then the cell of the i-th value after the sort is the first's + i).
    let mut bounds = DstBounds::default();
    let mut tickets_in_a_run = true;
    let mut signals = false;
    for (k, i) in items.iter().enumerate() {
        signals |= i.signal_op != SignalOp::None;
        if let LaneWork::Value { dst, value } = i.work {
            if let Some(first) = values.first() {
                tickets_in_a_run &= i.ticket == first.ticket.wrapping_add(values.len() as u64);
            }
            bounds.add(dst);
            values.push(BatchValue { dst, ticket: i.ticket, value, item: k });
        }
    }
    if values.len() < VALUES_AS_COPIES_MIN && bounds.all_aligned() {
        return;
    }
    let first_ticket = values.first().map_or(0, |v| v.ticket);
    cells.clear();
    if !tickets_in_a_run {
        cells.extend(values.iter().map(|v| v.ticket));
        if !cells.is_sorted() {
            cells.sort_unstable();
        }
    }
    // Stable by destination: values to one destination stay in item (ticket) order.
    sort_by_dst_within(values, values_spare, counts, |v| v.dst, bounds);
    // Every item a value without a signal: the items are rewritten in the sorted order, from
    // `values` alone (in order, with no reads of the items scattered by the sort).
    let reorder = values.len() == items.len() && !signals;
    for (i, v) in values.iter().enumerate() {
        let cell_ticket = if tickets_in_a_run { first_ticket.wrapping_add(i as u64) } else { cells[i] };
        write_cell(cell_ticket, v.value);
        let work = LaneWork::Copy { dst: v.dst, src: cell_of(cell_ticket), len: 8 };
        if reorder {
            items[i] = LaneItem { ticket: v.ticket, work, signal_op: SignalOp::None, signal_id: 0, signal_value: 0 };
        } else {
            items[v.item].work = work;
        }
    }
}

/// One value of a batch, as [`values_as_copies`] sorts them.
#[derive(Copy, Clone, Debug)]
pub(crate) struct BatchValue {
    dst: u64,
    ticket: u64,
    value: u64,
    /// Its index among the batch's items.
    item: usize,
}

/// Where a lane batch's stores go and what they say.
pub(crate) struct BatchStores<'a> {
    /// The value of a signal after the batch's action on it (called in ticket order).
    pub(crate) advance: &'a mut dyn FnMut(u32, SignalOp, u64) -> u64,
    /// The address of a signal's slot at the peer.
    pub(crate) signal_slot: &'a dyn Fn(u32) -> u64,
    pub(crate) done_word: u64,
    pub(crate) done_value: u64,
    /// Copies of at least this many bytes in all put the stores aside (0: never).
    pub(crate) aside_from_bytes: u64,
}

/// Queues one batch for one peer on `sink`: data, then each touched signal once with the value
/// `advance` gives for it after the batch, then `done_value` into `done_word`; the stores aside
/// when the batch copies at least `aside_from_bytes` and holds no `put_value` (whose store must
/// keep its place among the copies).
pub(crate) fn queue_batch(
    sink: &mut dyn LaneSink,
    scratch: &mut BatchScratch,
    items: &[LaneItem],
    how: BatchStores<'_>,
) -> Result<Queued, String> {
    let BatchStores { advance, signal_slot, done_word, done_value, aside_from_bytes } = how;
    let mut ops = 0;
    let mut copies_queued = 0;
    // Copies run before the value stores they are queued with, so a copy that overlaps a value
    // store of an earlier ticket first queues what came before it (copies, then those stores):
    // an 8-byte put travels as a value (the header's ACCORD_DEVICE_PUT_INLINE), and a later
    // larger put to the same bytes must land after it.
    scratch.copies.clear();
    scratch.stores.clear();
    let mut copy_bytes = 0u64;
    // A put_value is data: its store belongs on the copy stream, behind the stores an earlier
    // batch set aside (so rejoin them first), and never aside itself, where a later batch's
    // copy to the same bytes could land before it.
    let has_values = items.iter().any(|i| matches!(i.work, LaneWork::Value { .. }));
    if has_values {
        ops += sink.route_stores(false)?;
    }
    for item in items {
        match item.work {
            LaneWork::Copy { dst, src, len } => {
                if scratch.stores.iter().any(|&(at, _)| at < dst + len && dst < at + 8) {
                    let (calls, queued) = queue_copies(sink, scratch)?;
                    ops += calls;
                    copies_queued += queued;
                    ops += sink.write_values(&scratch.stores)?;
                    scratch.copies.clear();
                    scratch.stores.clear();
                }
                scratch.copies.push((dst, src, len));
                copy_bytes += len;
            }
            LaneWork::Value { dst, value } => scratch.stores.push((dst, value)),
            LaneWork::SignalOnly => {}
        }
    }
    let (calls, queued) = queue_copies(sink, scratch)?;
    ops += calls;
    copies_queued += queued;
    // Only signal and done stores go aside, and only in a batch without values.
    if !has_values {
        ops += sink.route_stores(aside_from_bytes > 0 && copy_bytes >= aside_from_bytes)?;
    }
    // Newest value per signal, in the order the signals were first touched.
    let mut touched: Vec<(u32, u64)> = Vec::new();
    for item in items.iter().filter(|i| i.signal_op != SignalOp::None) {
        let value = advance(item.signal_id, item.signal_op, item.signal_value);
        match touched.iter_mut().find(|(s, _)| *s == item.signal_id) {
            Some(entry) => entry.1 = value,
            None => touched.push((item.signal_id, value)),
        }
    }
    let signal_stores = touched.len();
    scratch.stores.extend(touched.into_iter().map(|(signal, value)| (signal_slot(signal), value)));
    scratch.stores.push((done_word, done_value));
    ops += sink.write_values(&scratch.stores)?;
    Ok(Queued { calls: ops, signal_stores, copies: copies_queued })
}

/// What [`queue_batch`] queued.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Queued {
    /// Driver calls.
    pub(crate) calls: usize,
    /// Signal stores among the stores.
    pub(crate) signal_stores: usize,
    /// Copies after merging: what the copy engine runs (each costs it about a microsecond
    /// whatever its size, so copies per batch say how well a batch's puts merged).
    pub(crate) copies: usize,
}

/// Queues `scratch.copies` (in ticket order) merged, segment by segment
/// ([`ticket_ordered_segments`]); returns the driver calls it took and the copies after merging.
fn queue_copies(sink: &mut dyn LaneSink, scratch: &mut BatchScratch) -> Result<(usize, usize), String> {
    let BatchScratch { copies, sorted, sorted_spare, merged, counts, .. } = scratch;
    if copies.is_empty() {
        return Ok((0, 0));
    }
    merged.clear();
    // In destination order and disjoint already (a batch of values alone, which
    // `values_as_copies` sorted): merged as they are.
    if in_order_and_disjoint(copies) {
        merge_sorted(copies, merged);
        return Ok((sink.copy_many(merged)?, merged.len()));
    }
    // Nothing overlaps (the common case): one sort, no segment map.
    sorted.clear();
    sorted.extend_from_slice(copies);
    sort_by_dst(sorted, sorted_spare, counts, |c| c.0);
    if in_order_and_disjoint(sorted) {
        merge_sorted(sorted, merged);
        return Ok((sink.copy_many(merged)?, merged.len()));
    }
    let (mut calls, mut queued) = (0, 0);
    for segment in ticket_ordered_segments(copies) {
        sorted.clear();
        sorted.extend_from_slice(segment);
        sort_by_dst(sorted, sorted_spare, counts, |c| c.0);
        merged.clear();
        merge_sorted(sorted, merged);
        calls += sink.copy_many(merged)?;
        queued += merged.len();
    }
    Ok((calls, queued))
}

/// Whether each copy's destination ends at or before the next one's starts.
fn in_order_and_disjoint(copies: &[(u64, u64, u64)]) -> bool {
    copies.windows(2).all(|w| w[0].0.saturating_add(w[0].2) <= w[1].0)
}

/// One peer's lane: the streams every ring's proxy queues on (under the lock), the peer's
/// signal slots and windows as this rank's GPU reaches them.
pub(crate) struct PeerLane {
    pub(crate) streams: Mutex<LaneStreams>,
    /// Device address (here) of the peer's incoming slots, `u64[signal_count][world]`.
    pub(crate) signal_slots: u64,
    /// Device address (here) of the peer's window `w`, 0 where it cannot be reached.
    pub(crate) windows: RwLock<Vec<u64>>,
    /// The mappings behind those addresses (kept open while the lane lives).
    pub(crate) mappings: Mutex<Vec<DeviceRegionMapping>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorder(Vec<String>);

    impl LaneSink for Recorder {
        fn copy(&mut self, dst: u64, src: u64, len: u64) -> Result<(), String> {
            self.0.push(format!("copy {dst}<-{src} {len}"));
            Ok(())
        }
        fn write_value(&mut self, dst: u64, value: u64) -> Result<(), String> {
            self.0.push(format!("store {dst}={value}"));
            Ok(())
        }
        fn route_stores(&mut self, aside: bool) -> Result<usize, String> {
            // Only the routing a stream sink acts on: aside, or back after an aside batch.
            let back =
                !aside && self.0.iter().rev().find(|l| l.starts_with("stores")).is_some_and(|l| l == "stores aside");
            if aside || back {
                self.0.push(if aside { "stores aside" } else { "stores inline" }.into());
                return Ok(2);
            }
            Ok(0)
        }
    }

    /// Signal values as the proxy's board keeps them: a running value per signal.
    fn board() -> impl FnMut(u32, SignalOp, u64) -> u64 {
        let mut running = std::collections::HashMap::new();
        move |s, op, v| {
            let e = running.entry(s).or_insert(0u64);
            match op {
                SignalOp::Add => *e += v,
                SignalOp::Set => *e = v,
                SignalOp::None => {}
            }
            *e
        }
    }

    fn stores<'a>(
        advance: &'a mut dyn FnMut(u32, SignalOp, u64) -> u64,
        done_value: u64,
        aside_from_bytes: u64,
    ) -> BatchStores<'a> {
        BatchStores {
            advance,
            signal_slot: &|s| 50_000 + u64::from(s) * 8,
            done_word: 90_000,
            done_value,
            aside_from_bytes,
        }
    }

    /// `queue_batch` with fresh buffers, as a proxy's first batch has them.
    fn queue(sink: &mut dyn LaneSink, items: &[LaneItem], how: BatchStores<'_>) -> Result<Queued, String> {
        queue_batch(sink, &mut BatchScratch::default(), items, how)
    }

    fn value_item(ticket: u64, dst: u64, value: u64) -> LaneItem {
        LaneItem { ticket, work: LaneWork::Value { dst, value }, ..put(ticket, 0, 0, 0) }
    }

    fn put(ticket: u64, dst: u64, src: u64, len: u64) -> LaneItem {
        LaneItem {
            ticket,
            work: LaneWork::Copy { dst, src, len },
            signal_op: SignalOp::None,
            signal_id: 0,
            signal_value: 0,
        }
    }

    #[test]
    fn values_of_a_batch_become_copies_from_their_cells_sorted_by_destination() {
        // Tickets 10..13 put values to 24, 8, 16 and (a copy) 0: cells of 10, 11, 12 in order
        // go to the destinations 8, 16, 24.
        let mut items = vec![value_item(10, 24, 3), value_item(11, 8, 1), value_item(12, 16, 2), put(13, 64, 5000, 8)];
        let mut cells = std::collections::BTreeMap::new();
        values_as_copies(&mut items, &mut BatchScratch::default(), &|t| 1000 + t * 8, &mut |t, v| {
            cells.insert(t, v);
        });
        let works: Vec<LaneWork> = items.iter().map(|i| i.work).collect();
        assert_eq!(
            works,
            vec![
                LaneWork::Copy { dst: 24, src: 1096, len: 8 },
                LaneWork::Copy { dst: 8, src: 1080, len: 8 },
                LaneWork::Copy { dst: 16, src: 1088, len: 8 },
                LaneWork::Copy { dst: 64, src: 5000, len: 8 },
            ]
        );
        assert_eq!(cells.into_iter().collect::<Vec<_>>(), vec![(10, 1), (11, 2), (12, 3)]);
        let mut rec = Recorder::default();
        let mut advance = board();
        queue(&mut rec, &items, stores(&mut advance, 14, 0)).unwrap();
        assert_eq!(rec.0[0], "copy 8<-1080 24", "contiguous destinations in contiguous cells: one copy");
        // One value alone stays a store, unless its destination is not aligned for one.
        let mut one = vec![value_item(20, 8, 9)];
        values_as_copies(&mut one, &mut BatchScratch::default(), &|t| t, &mut |_, _| {
            panic!("no cell for a lone value")
        });
        assert_eq!(one[0].work, LaneWork::Value { dst: 8, value: 9 });
        let mut odd = vec![value_item(20, 12, 9)];
        let mut cell = None;
        values_as_copies(&mut odd, &mut BatchScratch::default(), &|t| 1000 + t * 8, &mut |t, v| cell = Some((t, v)));
        assert_eq!((odd[0].work, cell), (LaneWork::Copy { dst: 12, src: 1160, len: 8 }, Some((20, 9))));
    }

    #[test]
    fn a_batch_of_values_alone_comes_back_sorted_by_destination_and_one_with_a_signal_does_not() {
        // Tickets 10..13 to 24, 8, 16, 0: sorted by destination, cells of 10..13 in that order.
        let values = [value_item(10, 24, 3), value_item(11, 8, 1), value_item(12, 16, 2), value_item(13, 0, 0)];
        let mut items = values.to_vec();
        let mut cells = std::collections::BTreeMap::new();
        values_as_copies(&mut items, &mut BatchScratch::default(), &|t| 1000 + t * 8, &mut |t, v| {
            cells.insert(t, v);
        });
        let order: Vec<(u64, LaneWork)> = items.iter().map(|i| (i.ticket, i.work)).collect();
        assert_eq!(
            order,
            vec![
                (13, LaneWork::Copy { dst: 0, src: 1080, len: 8 }),
                (11, LaneWork::Copy { dst: 8, src: 1088, len: 8 }),
                (12, LaneWork::Copy { dst: 16, src: 1096, len: 8 }),
                (10, LaneWork::Copy { dst: 24, src: 1104, len: 8 }),
            ]
        );
        assert_eq!(cells.into_iter().collect::<Vec<_>>(), vec![(10, 0), (11, 1), (12, 2), (13, 3)]);
        // Tickets with gaps (other peers' descriptors between them): cells still ascending.
        let mut gaps = vec![value_item(10, 16, 3), value_item(12, 0, 1), value_item(15, 8, 2)];
        let mut written = Vec::new();
        values_as_copies(&mut gaps, &mut BatchScratch::default(), &|t| 1000 + t * 8, &mut |t, v| written.push((t, v)));
        let srcs: Vec<(u64, u64)> = gaps
            .iter()
            .map(|i| if let LaneWork::Copy { dst, src, .. } = i.work { (dst, src) } else { (0, 0) })
            .collect();
        assert_eq!(srcs, vec![(0, 1080), (8, 1096), (16, 1120)]);
        assert_eq!(written, vec![(10, 1), (12, 2), (15, 3)]);
        // A signal's value depends on the order of its batch's items: that batch keeps it.
        let mut signalled = values.to_vec();
        signalled[1].signal_op = SignalOp::Set;
        values_as_copies(&mut signalled, &mut BatchScratch::default(), &|t| 1000 + t * 8, &mut |_, _| {});
        let tickets: Vec<u64> = signalled.iter().map(|i| i.ticket).collect();
        assert_eq!(tickets, vec![10, 11, 12, 13]);
        assert_eq!(signalled[0].work, LaneWork::Copy { dst: 24, src: 1104, len: 8 });
    }

    #[test]
    fn buffers_kept_from_batch_to_batch_give_what_fresh_ones_give() {
        // Batches of every kind through one scratch, then each through fresh buffers: values
        // alone, values with a signal, overlapping copies, a lone value, contiguous puts.
        let batches: Vec<Vec<LaneItem>> = vec![
            (0..64u64).map(|i| value_item(100 + i, 8 * ((i * 37) % 64), i)).collect(),
            vec![
                value_item(200, 16, 1),
                LaneItem { signal_op: SignalOp::Add, signal_value: 1, ..value_item(201, 8, 2) },
            ],
            vec![put(300, 0, 5000, 16), put(301, 8, 6000, 16), put(302, 64, 7000, 8)],
            vec![value_item(400, 24, 9)],
            (0..32u64).map(|i| put(500 + i, 4096 + 8 * i, 9000 + 8 * i, 8)).collect(),
        ];
        let cell_of = |t: u64| (1 << 32) + t * 8;
        let run = |scratch: &mut BatchScratch, batch: &[LaneItem], n: u64| {
            let mut items = batch.to_vec();
            let mut cells = Vec::new();
            values_as_copies(&mut items, scratch, &cell_of, &mut |t, v| cells.push((t, v)));
            let mut rec = Recorder::default();
            let mut advance = board();
            let queued = queue_batch(&mut rec, scratch, &items, stores(&mut advance, n, 0)).unwrap();
            (items, cells, rec.0, queued)
        };
        let mut kept = BatchScratch::default();
        for (n, batch) in batches.iter().enumerate() {
            let reused = run(&mut kept, batch, n as u64 + 1);
            let fresh = run(&mut BatchScratch::default(), batch, n as u64 + 1);
            assert_eq!(reused, fresh, "batch {n}");
        }
    }

    #[test]
    fn two_values_to_one_destination_land_in_ticket_order() {
        let mut items = vec![value_item(1, 8, 111), value_item(2, 8, 222)];
        let mut cells = std::collections::BTreeMap::new();
        values_as_copies(&mut items, &mut BatchScratch::default(), &|t| 1000 + t * 8, &mut |t, v| {
            cells.insert(t, v);
        });
        let mut rec = Recorder::default();
        let mut advance = board();
        queue(&mut rec, &items, stores(&mut advance, 3, 0)).unwrap();
        let last_copy = rec.0.iter().rev().find(|l| l.starts_with("copy 8<-")).unwrap().clone();
        let src: u64 = last_copy.split("<-").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
        assert_eq!(cells[&((src - 1000) / 8)], 222, "the later ticket's value lands last: {:?}", rec.0);
    }

    #[test]
    fn a_batch_queues_data_then_each_signal_once_with_its_newest_value_then_the_done_word() {
        let mut items = vec![put(10, 1000, 2000, 8), put(11, 1008, 2008, 8)];
        items[0].signal_op = SignalOp::Add;
        items[0].signal_id = 3;
        items[0].signal_value = 1;
        items[1].signal_op = SignalOp::Add;
        items[1].signal_id = 3;
        items[1].signal_value = 1;
        items.push(LaneItem {
            ticket: 12,
            work: LaneWork::Value { dst: 4096, value: 77 },
            signal_op: SignalOp::Set,
            signal_id: 5,
            signal_value: 9,
        });
        let mut advance = board();
        let mut rec = Recorder::default();
        let ops = queue(&mut rec, &items, stores(&mut advance, 13, 1 << 20)).unwrap();
        assert_eq!(
            rec.0,
            vec![
                "copy 1000<-2000 16".to_string(),
                "store 4096=77".into(),
                "store 50024=2".into(),
                "store 50040=9".into(),
                "store 90000=13".into(),
            ]
        );
        assert_eq!(ops, Queued { calls: 5, signal_stores: 2, copies: 1 });
    }

    #[test]
    fn a_copy_over_an_earlier_value_store_lands_after_it() {
        let mut advance = board();
        let mut rec = Recorder::default();
        let items = [value_item(1, 64, 5), put(2, 0, 4096, 128), put(3, 1024, 8192, 8), value_item(4, 2048, 6)];
        let ops = queue(&mut rec, &items, stores(&mut advance, 5, 0)).unwrap();
        assert_eq!(
            rec.0,
            vec![
                "store 64=5".to_string(),
                "copy 0<-4096 128".into(),
                "copy 1024<-8192 8".into(),
                "store 2048=6".into(),
                "store 90000=5".into(),
            ],
            "the value to 64..72 first, then the copy over it; unrelated work keeps one call each"
        );
        assert_eq!((ops.calls, ops.copies), (5, 2));
        let mut rec = Recorder::default();
        queue(&mut rec, &[put(1, 0, 4096, 64), value_item(2, 8, 7)], stores(&mut advance, 3, 0)).unwrap();
        assert_eq!(rec.0[..2], ["copy 0<-4096 64".to_string(), "store 8=7".into()], "a later value: after the copy");
    }

    #[test]
    fn a_value_after_an_aside_batch_goes_on_the_copy_stream_before_a_later_copy_over_it() {
        let mut advance = board();
        let mut rec = Recorder::default();
        queue(&mut rec, &[put(1, 1 << 20, 1 << 30, 4 << 20)], stores(&mut advance, 2, 1 << 20)).unwrap();
        assert!(rec.0.contains(&"stores aside".to_string()), "the large batch's stores went aside");
        let batch = [value_item(2, 64, 5), put(3, 64, (1 << 30) + 64, 64)];
        queue(&mut rec, &batch, stores(&mut advance, 4, 1 << 20)).unwrap();
        let back = rec.0.iter().position(|l| l == "stores inline").expect("rejoined");
        let value = rec.0.iter().position(|l| l == "store 64=5").unwrap();
        let copy = rec.0.iter().position(|l| l == "copy 64<-1073741888 64").unwrap();
        assert!(back < value && value < copy, "rejoin, the value, then the copy over it: {:?}", rec.0);
    }

    #[test]
    fn a_failing_sink_stops_the_batch_before_its_signals_and_done_word() {
        struct Failing(usize);
        impl LaneSink for Failing {
            fn copy(&mut self, _: u64, _: u64, _: u64) -> Result<(), String> {
                Err("copy refused".into())
            }
            fn write_value(&mut self, _: u64, _: u64) -> Result<(), String> {
                self.0 += 1;
                Ok(())
            }
        }
        let mut item = put(1, 0, 8, 8);
        item.signal_op = SignalOp::Add;
        let mut sink = Failing(0);
        let mut advance = |_: u32, _: SignalOp, v: u64| v;
        let how = BatchStores {
            advance: &mut advance,
            signal_slot: &|_| 0,
            done_word: 1,
            done_value: 2,
            aside_from_bytes: 0,
        };
        let err = queue(&mut sink, &[item], how).unwrap_err();
        assert!(err.contains("copy refused"));
        assert_eq!(sink.0, 0, "no signal and no done word after a failed copy");
    }
    #[test]
    fn a_large_batch_puts_its_stores_aside_and_the_next_small_one_brings_them_back_in_order() {
        let mut advance = board();
        let mut rec = Recorder::default();
        let mut big = put(1, 0, 1 << 30, 4 << 20);
        big.signal_op = SignalOp::Add;
        big.signal_value = 1;
        let mut small = put(2, 8 << 20, (1 << 30) + (8 << 20), 64);
        small.signal_op = SignalOp::Add;
        small.signal_value = 1;
        let ops_big = queue(&mut rec, &[big], stores(&mut advance, 2, 1 << 20)).unwrap();
        let ops_big_again =
            queue(&mut rec, &[LaneItem { ticket: 3, ..big }], stores(&mut advance, 4, 1 << 20)).unwrap();
        let ops_small = queue(&mut rec, &[LaneItem { ticket: 4, ..small }], stores(&mut advance, 5, 1 << 20)).unwrap();
        assert_eq!(
            rec.0,
            vec![
                "copy 0<-1073741824 4194304".to_string(),
                "stores aside".into(),
                "store 50000=1".into(),
                "store 90000=2".into(),
                "copy 0<-1073741824 4194304".into(),
                "stores aside".into(),
                "store 50000=2".into(),
                "store 90000=4".into(),
                "copy 8388608<-1082130432 64".into(),
                "stores inline".into(),
                "store 50000=3".into(),
                "store 90000=5".into(),
            ],
            "each large batch's stores after its copies, aside; the small one's after those, inline"
        );
        assert_eq!(
            (ops_big.calls, ops_big_again.calls, ops_small.calls),
            (5, 5, 5),
            "a copy, two routing calls, two stores"
        );
        let mut rec = Recorder::default();
        queue(&mut rec, &[big], stores(&mut advance, 6, 0)).unwrap();
        assert!(!rec.0.iter().any(|l| l.starts_with("stores")), "0: never aside");
    }

    #[test]
    fn a_large_batch_with_a_put_value_keeps_its_stores_behind_its_copies_on_one_stream() {
        // Set aside, the value store could land after a later batch's copy to the same bytes.
        let mut advance = board();
        let mut rec = Recorder::default();
        let value = LaneItem { ticket: 2, work: LaneWork::Value { dst: 64, value: 5 }, ..put(2, 0, 0, 0) };
        queue(&mut rec, &[put(1, 4096, 1 << 30, 4 << 20), value], stores(&mut advance, 3, 1 << 20)).unwrap();
        queue(&mut rec, &[put(3, 64, (1 << 30) + 64, 8)], stores(&mut advance, 4, 1 << 20)).unwrap();
        assert!(!rec.0.iter().any(|l| l.starts_with("stores")), "nothing aside: {:?}", rec.0);
        let store = rec.0.iter().position(|l| l == "store 64=5").unwrap();
        let later_copy = rec.0.iter().position(|l| l == "copy 64<-1073741888 8").unwrap();
        assert!(store < later_copy, "the value lands before the later copy to the same bytes: {:?}", rec.0);
    }
}
