//! The order of a lane batch's copies: sorted by destination (by counting, where a grid's small
//! puts make that cheap), merged where both ends continue, and split in ticket order where
//! destinations overlap. Apart from `mod.rs` (what a batch queues on its streams) as the part a
//! proxy thread runs for every put, at millions of puts a second.

/// Destinations a counting sort handles per element at most: beyond this span (in 8-byte
/// steps) per element, a comparison sort is cheaper than the counts.
const DENSE_SPAN_PER_ELEMENT: u64 = 4;

/// Sorts `v` stably by the destination `dst_of` gives. A batch of small puts from a grid
/// writes a narrow, 8-byte-aligned range, so it is sorted by counting, in linear time, where
/// the destinations are 8-byte steps from the lowest and span at most
/// [`DENSE_SPAN_PER_ELEMENT`] steps per element; else by comparison. Why: at millions of puts a
/// second a proxy thread has about 100 ns per put, and a comparison sort of a 1,024-put batch
/// took 15-30 ns of it per put (stop 44, the 2xH200 host). `spare` and `counts` are the
/// counting sort's buffers, kept by the caller from batch to batch (their contents do not
/// matter); `v` and `spare` may trade places.
pub(crate) fn sort_by_dst<T: Copy>(
    v: &mut Vec<T>,
    spare: &mut Vec<T>,
    counts: &mut Vec<u32>,
    dst_of: impl Fn(&T) -> u64,
) {
    let mut bounds = DstBounds::default();
    for x in v.iter() {
        bounds.add(dst_of(x));
    }
    sort_by_dst_within(v, spare, counts, dst_of, bounds);
}

/// What one pass over a batch's destinations tells its sort: their range, whether they are
/// in order already, and whether they all sit on one 8-byte grid. Gathered by the caller's own
/// pass over the batch, it spares the sort three passes of its own.
#[derive(Copy, Clone, Debug)]
pub(crate) struct DstBounds {
    lo: u64,
    hi: u64,
    last: u64,
    /// The first destination's offset in its 8 bytes.
    phase: Option<u64>,
    sorted: bool,
    one_grid: bool,
}

impl Default for DstBounds {
    fn default() -> Self {
        DstBounds { lo: u64::MAX, hi: 0, last: 0, phase: None, sorted: true, one_grid: true }
    }
}

impl DstBounds {
    /// Takes the next destination, in the batch's order.
    pub(crate) fn add(&mut self, dst: u64) {
        self.lo = self.lo.min(dst);
        self.hi = self.hi.max(dst);
        self.sorted &= dst >= self.last;
        self.last = dst;
        let phase = *self.phase.get_or_insert(dst % 8);
        self.one_grid &= dst % 8 == phase;
    }

    /// Whether every destination taken is 8-byte aligned (so also when none was).
    pub(crate) fn all_aligned(&self) -> bool {
        self.one_grid && self.phase.is_none_or(|p| p == 0)
    }
}

/// [`sort_by_dst`] with the destinations' bounds gathered already (`bounds` must be those of
/// `v`, in `v`'s order).
pub(crate) fn sort_by_dst_within<T: Copy>(
    v: &mut Vec<T>,
    spare: &mut Vec<T>,
    counts: &mut Vec<u32>,
    dst_of: impl Fn(&T) -> u64,
    bounds: DstBounds,
) {
    if v.len() < 2 || bounds.sorted {
        return;
    }
    let DstBounds { lo, hi, .. } = bounds;
    let dense = bounds.one_grid && (hi - lo) / 8 <= DENSE_SPAN_PER_ELEMENT * v.len() as u64;
    if !dense {
        v.sort_by_key(|x| dst_of(x));
        return;
    }
    counts.clear();
    counts.resize(((hi - lo) / 8) as usize + 2, 0);
    for x in v.iter() {
        counts[((dst_of(x) - lo) / 8) as usize + 1] += 1;
    }
    for k in 1..counts.len() {
        counts[k] += counts[k - 1];
    }
    spare.clear();
    spare.resize(v.len(), v[0]);
    for x in v.iter() {
        let slot = &mut counts[((dst_of(x) - lo) / 8) as usize];
        spare[*slot as usize] = *x;
        *slot += 1;
    }
    std::mem::swap(v, spare);
}

/// Appends to `merged` the copies of `sorted` (sorted by destination, stably), each merged
/// into the one before when both its source and its destination continue that one. A put
/// repeated within one batch is copied each time: folding it into its twin would be correct
/// (both read the same source bytes) but would make throughput figures count bytes never moved.
pub(super) fn merge_sorted(sorted: &[(u64, u64, u64)], merged: &mut Vec<(u64, u64, u64)>) {
    let first = merged.len();
    for &(dst, src, len) in sorted {
        match merged[first..].last_mut() {
            Some((d, s, l)) if *d + *l == dst && *s + *l == src => *l += len,
            _ => merged.push((dst, src, len)),
        }
    }
}

/// The copies merged as [`merge_sorted`] does, after a stable sort by destination (so copies to
/// one destination offset keep their order).
#[cfg(test)]
pub(crate) fn merge_copies(mut copies: Vec<(u64, u64, u64)>) -> Vec<(u64, u64, u64)> {
    sort_by_dst(&mut copies, &mut Vec::new(), &mut Vec::new(), |c| c.0);
    let mut merged = Vec::with_capacity(copies.len());
    merge_sorted(&copies, &mut merged);
    merged
}

/// Splits copies, in ticket order, into consecutive segments within which no two destinations
/// overlap: the copies of one segment may run in any order (and merge), the segments run one
/// after the other, so puts to overlapping bytes keep their ticket order, however their ranges
/// start. One segment when nothing overlaps (the common case); O(n log n).
pub(crate) fn ticket_ordered_segments(copies: &[(u64, u64, u64)]) -> Vec<&[(u64, u64, u64)]> {
    let mut segments = Vec::new();
    let mut start = 0usize;
    // The destination ranges of the current segment, start -> end; disjoint, so the one with
    // the greatest start below a new range's end is the only one that can overlap it.
    let mut taken: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
    for (i, &(dst, _, len)) in copies.iter().enumerate() {
        let end = dst.saturating_add(len.max(1));
        if taken.range(..end).next_back().is_some_and(|(_, &e)| e > dst) {
            segments.push(&copies[start..i]);
            start = i;
            taken.clear();
        }
        taken.insert(dst, end);
    }
    if start < copies.len() {
        segments.push(&copies[start..]);
    }
    segments
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sort_by_dst` against the standard library's stable sort, on the inputs its two paths
    /// take: dense 8-byte steps (counting, with repeats whose order must hold), spans too wide
    /// or off the 8-byte grid (comparison), and sorted input.
    #[test]
    fn sort_by_dst_is_a_stable_sort_by_destination_on_both_paths() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        let mut cases: Vec<Vec<(u64, u64)>> = vec![
            vec![],
            vec![(8, 0)],
            (0..64).map(|i| (1000 + i * 8, i)).collect(),
            (0..64).rev().map(|i| (1000 + i * 8, i)).collect(),
            vec![(3, 0), (1, 1), (2, 2), (1, 3)],
            vec![(1 << 40, 0), (0, 1), (1 << 20, 2)],
        ];
        for n in [2u64, 17, 256, 1024] {
            // Dense: a warp-interleaved grid's destinations, with repeats (second field: order).
            cases.push((0..n).map(|i| (4096 + next(n) * 8, i)).collect());
            // Wide: random destinations over a span far beyond 4 steps an element.
            cases.push((0..n).map(|i| (next(1 << 30) * 8, i)).collect());
            // Off the grid: one destination 4 bytes off the others.
            let mut odd: Vec<(u64, u64)> = (0..n).map(|i| (next(n) * 8, i)).collect();
            odd[0].0 += 4;
            cases.push(odd);
        }
        for case in cases {
            let mut ours = case.clone();
            sort_by_dst(&mut ours, &mut Vec::new(), &mut Vec::new(), |x| x.0);
            let mut std_sorted = case.clone();
            std_sorted.sort_by_key(|x| x.0);
            assert_eq!(ours, std_sorted, "input {case:?}");
        }
    }

    #[test]
    fn contiguous_puts_merge_in_any_ticket_order_and_gaps_or_other_sources_do_not() {
        let merged = merge_copies(vec![(1016, 2016, 8), (1000, 2000, 8), (1008, 2008, 8), (1032, 2032, 8)]);
        assert_eq!(merged, vec![(1000, 2000, 24), (1032, 2032, 8)], "a gap at 1024 splits the run");
        let merged = merge_copies(vec![(0, 100, 8), (8, 300, 8)]);
        assert_eq!(merged.len(), 2, "destinations continue but sources do not");
        let merged = merge_copies(vec![(0, 100, 8), (8, 108, 8), (0, 100, 8), (8, 108, 8)]);
        assert_eq!(merged, vec![(0, 100, 8), (0, 100, 16), (8, 108, 8)], "a repeated put is copied again");
        let merged = merge_copies(vec![(0, 100, 8), (0, 200, 8)]);
        assert_eq!(merged, vec![(0, 100, 8), (0, 200, 8)], "same destination, other source: both, in order");
    }

    #[test]
    fn overlapping_destinations_split_the_copies_into_segments_in_ticket_order() {
        // Tickets in this order: 8..16 (ticket 3) must land before 4..12 (ticket 4), though 4 < 8.
        let copies = [(0, 100, 8), (0, 200, 8), (8, 300, 8), (4, 400, 8), (64, 500, 8)];
        let segments = ticket_ordered_segments(&copies);
        let want: Vec<&[(u64, u64, u64)]> =
            vec![&[(0, 100, 8)], &[(0, 200, 8), (8, 300, 8)], &[(4, 400, 8), (64, 500, 8)]];
        assert_eq!(segments, want);
        let disjoint = [(32, 300, 8), (0, 100, 8), (16, 200, 8)];
        assert_eq!(ticket_ordered_segments(&disjoint).len(), 1, "disjoint copies share one segment");
        assert!(ticket_ordered_segments(&[]).is_empty());
        let touching = [(0, 0, 8), (8, 8, 8), (4, 4, 2)];
        assert_eq!(ticket_ordered_segments(&touching).len(), 2, "4..6 lies inside 0..8");
    }
}
