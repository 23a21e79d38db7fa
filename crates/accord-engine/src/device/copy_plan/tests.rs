//! The planner against a table of cases, and plans issued onto a host-memory sink that records
//! its calls and moves the bytes.

use super::*;

const MAX: u64 = (1 << 31) - 1;

/// One row of the planner's table: what, the pieces, the device's max pitch, the plan wanted.
type Case = (&'static str, Vec<(u64, u64, u64)>, u64, CopyPlan);

fn s(dst: u64, dst_pitch: u64, src: u64, src_pitch: u64, width: u64, height: u64) -> Strided {
    Strided { dst, dst_pitch, src, src_pitch, width, height }
}

/// Every byte of every piece is in the plan exactly once (the plan's rows and flat pieces are
/// the pieces, reordered).
fn covers(pieces: &[(u64, u64, u64)], got: &CopyPlan) -> bool {
    let mut planned: Vec<(u64, u64, u64)> = got.strided.iter().flat_map(|c| c.rows().collect::<Vec<_>>()).collect();
    planned.extend_from_slice(&got.flat);
    let mut want = pieces.to_vec();
    planned.sort_unstable();
    want.sort_unstable();
    planned == want
}

#[test]
fn the_planner_makes_runs_of_equal_pieces_at_constant_strides_into_2d_copies() {
    // A block of a KV cache: 4 planes, pieces of 100 bytes, planes 1000 apart here, 3000 there.
    let block = |d: u64, s: u64, planes: u64| -> Vec<(u64, u64, u64)> {
        (0..planes).map(|p| (d + p * 3000, s + p * 1000, 100)).collect()
    };
    let two_blocks: Vec<_> = block(500, 200, 4).into_iter().chain(block(100, 700, 4)).collect();
    let broken = vec![(0, 0, 100), (3000, 1000, 100), (6000, 2000, 100), (9100, 3000, 100), (12_200, 4000, 100)];
    let unequal = vec![(0, 0, 100), (3000, 1000, 100), (6000, 2000, 99)];
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        ("nothing", vec![], MAX, CopyPlan::default()),
        ("a single piece stays flat", vec![(7, 9, 100)], MAX,
            CopyPlan { strided: vec![], flat: vec![(7, 9, 100)] }),
        ("one block's planes: one 2D copy", block(500, 200, 4), MAX,
            CopyPlan { strided: vec![s(500, 3000, 200, 1000, 100, 4)], flat: vec![] }),
        ("two blocks listed block by block: two 2D copies", two_blocks.clone(), MAX,
            CopyPlan { strided: vec![s(500, 3000, 200, 1000, 100, 4), s(100, 3000, 700, 1000, 100, 4)], flat: vec![] }),
        ("a pair is already a 2D copy", block(0, 0, 2), MAX,
            CopyPlan { strided: vec![s(0, 3000, 0, 1000, 100, 2)], flat: vec![] }),
        ("a broken stride ends the run; the rest runs on its own steps", broken.clone(), MAX,
            CopyPlan { strided: vec![s(0, 3000, 0, 1000, 100, 3), s(9100, 3100, 3000, 1000, 100, 2)], flat: vec![] }),
        ("a piece of another size is not a row", unequal.clone(), MAX,
            CopyPlan { strided: vec![s(0, 3000, 0, 1000, 100, 2)], flat: vec![(6000, 2000, 99)] }),
        ("descending addresses stay flat", vec![(6000, 2000, 100), (3000, 1000, 100), (0, 0, 100)], MAX,
            CopyPlan { strided: vec![], flat: vec![(6000, 2000, 100), (3000, 1000, 100), (0, 0, 100)] }),
        ("a source stride below the width (overlapping rows) stays flat",
            vec![(0, 0, 100), (100, 50, 100), (200, 100, 100)], MAX,
            CopyPlan { strided: vec![], flat: vec![(0, 0, 100), (100, 50, 100), (200, 100, 100)] }),
        ("a repeated source (stride 0) stays flat", vec![(0, 64, 100), (100, 64, 100)], MAX,
            CopyPlan { strided: vec![], flat: vec![(0, 64, 100), (100, 64, 100)] }),
        ("contiguous on both sides: pitch = width is allowed", vec![(0, 0, 100), (100, 100, 100)], MAX,
            CopyPlan { strided: vec![s(0, 100, 0, 100, 100, 2)], flat: vec![] }),
        ("a pitch at the device's maximum is allowed", block(0, 0, 3), 3000,
            CopyPlan { strided: vec![s(0, 3000, 0, 1000, 100, 3)], flat: vec![] }),
        ("a pitch past the device's maximum goes flat", block(0, 0, 3), 2999,
            CopyPlan { strided: vec![], flat: block(0, 0, 3) }),
        ("no 2D copies where the maximum is unknown (0)", block(0, 0, 3), 0,
            CopyPlan { strided: vec![], flat: block(0, 0, 3) }),
        ("a single piece between two runs stays flat",
            block(0, 0, 2).into_iter().chain([(50_000, 90_000, 64)]).chain(block(100_000, 100_000, 2)).collect(), MAX,
            CopyPlan { strided: vec![s(0, 3000, 0, 1000, 100, 2), s(100_000, 3000, 100_000, 1000, 100, 2)],
                       flat: vec![(50_000, 90_000, 64)] }),
    ];
    for (what, pieces, max_pitch, want) in cases {
        let got = plan(&pieces, max_pitch);
        assert_eq!(got, want, "{what}");
        assert!(covers(&pieces, &got), "{what}: the plan moves exactly the pieces");
    }
}

/// A sink over one host arena (addresses are offsets into it) that records every call and
/// moves the bytes as the copy engine would; it can refuse 2D copies, as a driver might, and
/// stop a 2D batch after some copies (`batch_stops_after`), as a driver refusing part-way.
struct HostSink {
    memory: Vec<u8>,
    refuse_2d: bool,
    batch_stops_after: Option<usize>,
    calls: Vec<String>,
}

impl HostSink {
    fn new(memory: Vec<u8>) -> HostSink {
        HostSink { memory, refuse_2d: false, batch_stops_after: None, calls: vec![] }
    }

    fn move_rows(&mut self, c: &Strided) {
        for (dst, src, len) in c.rows().collect::<Vec<_>>() {
            self.copy(dst, src, len);
        }
    }
}

impl HostSink {
    fn copy(&mut self, dst: u64, src: u64, len: u64) {
        let (d, s, n) = (dst as usize, src as usize, len as usize);
        self.memory.copy_within(s..s + n, d);
    }
}

impl CopySink for HostSink {
    fn copy_flat(&mut self, pieces: &[(u64, u64, u64)]) -> Result<usize, String> {
        self.calls.push(format!("flat x{}", pieces.len()));
        for &(dst, src, len) in pieces {
            self.copy(dst, src, len);
        }
        Ok(1)
    }

    fn copy_2d(&mut self, c: &Strided) -> Result<(), String> {
        if self.refuse_2d {
            self.calls.push("2d refused".into());
            return Err("refused by the test".into());
        }
        self.calls.push(format!("2d {}x{}", c.width, c.height));
        self.move_rows(c);
        Ok(())
    }

    fn copy_2d_batch(&mut self, copies: &[Strided]) -> Result<usize, (usize, String)> {
        let take = self.batch_stops_after.unwrap_or(copies.len()).min(copies.len());
        for c in &copies[..take] {
            self.move_rows(c);
        }
        self.calls.push(format!("2d batch x{take}"));
        if take < copies.len() {
            return Err((take, "the test's driver stopped the batch".into()));
        }
        Ok(1)
    }
}

/// A KV-like move on host memory: `planes` planes of `blocks` blocks of `page` bytes in each
/// cache, the source cache at 0 and the destination after it; pieces listed block by block, as
/// `accord.kv` and a batched READ's geometry list them.
fn kv_pieces(page: u64, planes: u64, blocks: u64, ids: &[(u64, u64)]) -> (Vec<(u64, u64, u64)>, u64) {
    let cache = page * planes * blocks;
    let pieces = ids
        .iter()
        .flat_map(|&(s, d)| (0..planes).map(move |p| (cache + (p * blocks + d) * page, (p * blocks + s) * page, page)))
        .collect();
    (pieces, cache)
}

fn arena(cache: u64) -> Vec<u8> {
    (0..2 * cache).map(|i| if i < cache { (i * 7 % 251) as u8 } else { 0 }).collect()
}

#[test]
fn a_planned_kv_batch_moves_the_same_bytes_as_piece_by_piece_in_one_2d_copy_a_block() {
    let (page, planes, blocks) = (64, 10, 16);
    let ids = [(3, 0), (9, 5), (0, 15), (14, 7)];
    let (pieces, cache) = kv_pieces(page, planes, blocks, &ids);
    let mut want = arena(cache);
    for &(d, s, l) in &pieces {
        want.copy_within(s as usize..(s + l) as usize, d as usize);
    }
    let mut sink = HostSink::new(arena(cache));
    let issued = issue(&plan(&pieces, MAX), &mut sink, false).unwrap();
    assert_eq!(issued, Issued { flat_calls: 0, strided: ids.len(), strided_calls: ids.len(), strided_as_rows: 0 });
    assert_eq!(sink.calls, vec!["2d 64x10"; ids.len()], "one 2D copy per block, nothing flat");
    assert!(sink.memory == want, "the 2D copies moved exactly the pieces' bytes");

    // A driver that refuses 2D copies: the same bytes, row by row in one flat batch.
    let mut refusing = HostSink { refuse_2d: true, ..HostSink::new(arena(cache)) };
    let issued = issue(&plan(&pieces, MAX), &mut refusing, false).unwrap();
    assert_eq!(issued, Issued { flat_calls: 1, strided: 0, strided_calls: 0, strided_as_rows: ids.len() });
    assert_eq!(refusing.calls.last().map(String::as_str), Some("flat x40"));
    assert!(refusing.memory == want, "refused 2D copies still move every byte");
}

#[test]
fn mixed_batches_issue_2d_copies_and_one_flat_batch_and_lose_no_byte() {
    let (page, planes, blocks) = (32, 6, 12);
    let (mut pieces, cache) = kv_pieces(page, planes, blocks, &[(1, 2), (4, 4)]);
    // A lone piece of another size, and a block whose planes are listed last plane first.
    pieces.push((cache + 5, 3, 17));
    let (backwards, _) = kv_pieces(page, planes, blocks, &[(7, 9)]);
    pieces.extend(backwards.into_iter().rev());
    let mut want = arena(cache);
    for &(d, s, l) in &pieces {
        want.copy_within(s as usize..(s + l) as usize, d as usize);
    }
    let got = plan(&pieces, MAX);
    assert!(covers(&pieces, &got));
    let mut sink = HostSink::new(arena(cache));
    let issued = issue(&got, &mut sink, false).unwrap();
    assert_eq!(issued.strided, 2, "the two ordered blocks: {:?}", sink.calls);
    assert_eq!(issued.flat_calls, 1, "everything else in one flat batch");
    assert_eq!(sink.calls.last().map(String::as_str), Some("flat x7"));
    assert!(sink.memory == want);
}

#[test]
fn batched_2d_copies_take_one_call_and_a_batch_stopped_part_way_loses_and_repeats_no_copy() {
    let (page, planes, blocks) = (64, 10, 16);
    let ids = [(3, 0), (9, 5), (0, 15), (14, 7), (6, 6)];
    let (pieces, cache) = kv_pieces(page, planes, blocks, &ids);
    let mut want = arena(cache);
    for &(d, s, l) in &pieces {
        want.copy_within(s as usize..(s + l) as usize, d as usize);
    }
    let mut sink = HostSink::new(arena(cache));
    let issued = issue(&plan(&pieces, MAX), &mut sink, true).unwrap();
    assert_eq!(issued, Issued { flat_calls: 0, strided: 5, strided_calls: 1, strided_as_rows: 0 });
    assert_eq!(sink.calls, vec!["2d batch x5"]);
    assert!(sink.memory == want);

    // The batch stops after 2 copies: the other 3 go one call each, none twice.
    let mut stopping = HostSink { batch_stops_after: Some(2), ..HostSink::new(arena(cache)) };
    let issued = issue(&plan(&pieces, MAX), &mut stopping, true).unwrap();
    assert_eq!(issued, Issued { flat_calls: 0, strided: 5, strided_calls: 3, strided_as_rows: 0 });
    assert_eq!(stopping.calls, vec!["2d batch x2", "2d 64x10", "2d 64x10", "2d 64x10"]);
    assert!(stopping.memory == want);

    // Stopped at once, and every single 2D copy refused too: all rows in one flat batch.
    let mut refusing = HostSink { batch_stops_after: Some(0), refuse_2d: true, ..HostSink::new(arena(cache)) };
    let issued = issue(&plan(&pieces, MAX), &mut refusing, true).unwrap();
    assert_eq!(issued, Issued { flat_calls: 1, strided: 0, strided_calls: 0, strided_as_rows: 5 });
    assert!(refusing.memory == want);

    // One 2D copy is never batched (a batch of one saves no call).
    let (one, cache) = kv_pieces(page, planes, blocks, &[(2, 2)]);
    let mut single = HostSink::new(arena(cache));
    issue(&plan(&one, MAX), &mut single, true).unwrap();
    assert_eq!(single.calls, vec!["2d 64x10"]);
}

/// Every copy of `whole` is in exactly one share, and nothing else is.
fn partitions(whole: &CopyPlan, shares: &[CopyPlan]) -> bool {
    let mut strided: Vec<Strided> = shares.iter().flat_map(|p| p.strided.clone()).collect();
    let mut flat: Vec<(u64, u64, u64)> = shares.iter().flat_map(|p| p.flat.clone()).collect();
    let key = |c: &Strided| (c.dst, c.src, c.width, c.height, c.dst_pitch, c.src_pitch);
    let mut want_strided = whole.strided.clone();
    strided.sort_by_key(key);
    want_strided.sort_by_key(key);
    let mut want_flat = whole.flat.clone();
    flat.sort_unstable();
    want_flat.sort_unstable();
    strided == want_strided && flat == want_flat
}

fn share_bytes(p: &CopyPlan) -> u64 {
    p.strided.iter().map(Strided::bytes).sum::<u64>() + p.flat.iter().map(|f| f.2).sum::<u64>()
}

#[test]
fn spreading_a_plan_gives_every_copy_to_one_share_and_balances_bytes() {
    // KV-like blocks of 160 rows of 32 KiB (5 MiB each).
    let blocks =
        |n: u64| -> Vec<Strided> { (0..n).map(|i| s(i << 15, 1 << 30, i << 15, 1 << 29, 32 << 10, 160)).collect() };
    let mib = 1u64 << 20;
    let uneven = CopyPlan {
        strided: vec![s(0, 4 * mib, 0, 4 * mib, 2 * mib, 5), s(1 << 40, mib, 1 << 40, mib, 1 << 10, 3)],
        flat: (0..40).map(|i| (i * 8 * mib, (1 << 41) + i * 8 * mib, mib + i)).collect(),
    };
    let small = CopyPlan { strided: vec![], flat: (0..64).map(|i| (i * 4096, (1 << 30) + i * 4096, 4096)).collect() };
    #[rustfmt::skip]
    let cases: Vec<(&str, CopyPlan, usize, usize)> = vec![
        // (what, plan, shares asked, shares wanted)
        ("an empty plan is one empty share", CopyPlan::default(), 4, 1),
        ("one share asked: the plan as it is", CopyPlan { strided: blocks(8), flat: vec![] }, 1, 1),
        ("2,048 equal blocks over 4 streams", CopyPlan { strided: blocks(2048), flat: vec![] }, 4, 4),
        ("fewer copies than streams: one share each", CopyPlan { strided: blocks(5), flat: vec![] }, 8, 5),
        ("a single flat piece is one share", CopyPlan { strided: vec![], flat: vec![(0, 64, 100)] }, 4, 1),
        ("2D copies and flat pieces of many sizes", uneven, 3, 3),
        ("0 shares asked is one", CopyPlan { strided: blocks(5), flat: vec![] }, 0, 1),
        ("a small write (256 KiB) stays on one stream", small, 4, 1),
        ("3 blocks (15 MiB): no share under SHARE_BYTES_MIN", CopyPlan { strided: blocks(3), flat: vec![] }, 4, 3),
        ("1 block (5 MiB): one share", CopyPlan { strided: blocks(1), flat: vec![] }, 4, 1),
    ];
    for (what, whole, asked, wanted) in cases {
        let shares = spread(whole.clone(), asked, SHARE_BYTES_MIN);
        assert_eq!(shares.len(), wanted, "{what}");
        assert!(partitions(&whole, &shares), "{what}: every copy in exactly one share");
        let largest = whole.strided.iter().map(Strided::bytes).chain(whole.flat.iter().map(|f| f.2)).max().unwrap_or(0);
        let (lo, hi) = shares.iter().map(share_bytes).fold((u64::MAX, 0), |(lo, hi), b| (lo.min(b), hi.max(b)));
        assert!(
            hi - lo.min(hi) <= largest,
            "{what}: shares within one copy of each other ({lo}..{hi}, largest {largest})"
        );
    }
    let even = spread(CopyPlan { strided: blocks(2048), flat: vec![] }, 4, SHARE_BYTES_MIN);
    assert!(even.iter().all(|p| p.strided.len() == 512), "equal blocks split evenly");
}

#[test]
fn a_spread_kv_batch_issued_share_by_share_moves_the_same_bytes() {
    let (page, planes, blocks) = (32, 8, 24);
    let ids: Vec<(u64, u64)> = (0..11).map(|i| ((i * 7) % 24, (i * 5 + 3) % 24)).collect();
    let (mut pieces, cache) = kv_pieces(page, planes, blocks, &ids);
    pieces.push((cache + 3, 1, 29));
    let mut want = arena(cache);
    for &(d, s, l) in &pieces {
        want.copy_within(s as usize..(s + l) as usize, d as usize);
    }
    let mut sink = HostSink::new(arena(cache));
    let shares = spread(plan(&pieces, MAX), 4, 1); // host pages are small: any size a share
    assert_eq!(shares.len(), 4);
    let mut total = Issued::default();
    for share in &shares {
        let i = issue(share, &mut sink, true).unwrap();
        total.strided += i.strided;
        total.flat_calls += i.flat_calls;
    }
    assert_eq!(total.strided, ids.len(), "every block a 2D copy in some share");
    assert_eq!(total.flat_calls, 1, "the lone piece in one share's flat call");
    assert!(sink.memory == want, "the shares together moved exactly the pieces' bytes");
}

/// A lane over a shared log: its copies, marks and waits are lines `"<lane> <what>"`; marks are
/// named `m<lane>.<n>`; `fail_mark_after` makes its marks fail after that many.
struct LogLane {
    id: usize,
    log: std::rc::Rc<std::cell::RefCell<Vec<String>>>,
    marks: usize,
    fail_mark_after: Option<usize>,
    refuse_flat: bool,
}

impl LogLane {
    fn lanes(n: usize) -> (Vec<LogLane>, std::rc::Rc<std::cell::RefCell<Vec<String>>>) {
        let log = std::rc::Rc::new(std::cell::RefCell::new(vec![]));
        let lanes = (0..n)
            .map(|id| LogLane { id, log: log.clone(), marks: 0, fail_mark_after: None, refuse_flat: false })
            .collect();
        (lanes, log)
    }

    fn say(&self, what: String) {
        self.log.borrow_mut().push(format!("{} {what}", self.id));
    }
}

impl CopySink for LogLane {
    fn copy_flat(&mut self, pieces: &[(u64, u64, u64)]) -> Result<usize, String> {
        if self.refuse_flat {
            return Err("flat refused by the test".into());
        }
        self.say(format!("copy flat x{}", pieces.len()));
        Ok(1)
    }

    fn copy_2d(&mut self, _: &Strided) -> Result<(), String> {
        self.say("copy 2d".into());
        Ok(())
    }

    fn copy_2d_batch(&mut self, copies: &[Strided]) -> Result<usize, (usize, String)> {
        self.say(format!("copy 2d batch x{}", copies.len()));
        Ok(1)
    }
}

impl SpreadLane for LogLane {
    type Mark = String;

    fn mark(&mut self) -> Result<String, String> {
        if self.fail_mark_after.is_some_and(|n| self.marks >= n) {
            return Err(format!("lane {} cannot mark", self.id));
        }
        self.marks += 1;
        let mark = format!("m{}.{}", self.id, self.marks);
        self.say(format!("mark {mark}"));
        Ok(mark)
    }

    fn wait_for(&mut self, mark: &String) -> Result<(), String> {
        self.say(format!("wait {mark}"));
        Ok(())
    }
}

fn position(log: &[String], line: &str) -> usize {
    log.iter().position(|l| l == line).unwrap_or_else(|| panic!("{line:?} not in {log:?}"))
}

#[test]
fn a_spread_write_forks_from_the_first_stream_and_joins_every_other_back_into_it() {
    let blocks: Vec<Strided> = (0..12).map(|i| s(i << 15, 1 << 30, i << 15, 1 << 29, 32 << 10, 160)).collect();
    let shares = spread(CopyPlan { strided: blocks, flat: vec![(1 << 40, 1 << 41, 100)] }, 3, SHARE_BYTES_MIN);
    assert_eq!(shares.len(), 3);
    let (mut lanes, log) = LogLane::lanes(3);
    issue_spread(&mut lanes, &shares, true).unwrap();
    let log = log.borrow().clone();
    let fork = position(&log, "0 mark m0.1");
    for lane in 1..3 {
        let waited = position(&log, &format!("{lane} wait m0.1"));
        let first_copy = log.iter().position(|l| l.starts_with(&format!("{lane} copy"))).unwrap();
        let last_copy = log.iter().rposition(|l| l.starts_with(&format!("{lane} copy"))).unwrap();
        let marked = position(&log, &format!("{lane} mark m{lane}.1"));
        let joined = position(&log, &format!("0 wait m{lane}.1"));
        assert!(fork < waited && waited < first_copy, "lane {lane} starts after the fork: {log:?}");
        assert!(last_copy < marked && marked < joined, "lane {lane} joins after its copies: {log:?}");
    }
    let last_copy_anywhere = log.iter().rposition(|l| l.contains(" copy")).unwrap();
    let first_join = log.iter().position(|l| l.starts_with("0 wait")).unwrap();
    assert!(last_copy_anywhere < first_join, "every copy is queued before the first stream's joins: {log:?}");

    // One lane: no fork, no join, just its copies.
    let (mut one, log) = LogLane::lanes(1);
    issue_spread(&mut one, &spread(CopyPlan { strided: vec![], flat: vec![(0, 64, 8)] }, 4, SHARE_BYTES_MIN), true)
        .unwrap();
    assert_eq!(*log.borrow(), vec!["0 copy flat x1"]);
}

#[test]
fn a_failed_share_is_still_joined_and_a_failed_join_says_its_copies_are_untracked() {
    let blocks: Vec<Strided> = (0..8).map(|i| s(i << 15, 1 << 30, i << 15, 1 << 29, 32 << 10, 160)).collect();
    let flat: Vec<(u64, u64, u64)> = (0..4).map(|i| ((1 << 40) + (i << 20), (1 << 41) + (i << 20), 1 << 20)).collect();
    let shares = spread(CopyPlan { strided: blocks, flat }, 2, SHARE_BYTES_MIN);
    assert!(shares.iter().all(|p| !p.flat.is_empty()), "both shares have flat pieces: {shares:?}");

    // Lane 1's flat copies fail: the error is returned, lane 1 is still joined, nothing untracked.
    let (mut lanes, log) = LogLane::lanes(2);
    lanes[1].refuse_flat = true;
    let e = issue_spread(&mut lanes, &shares, true).unwrap_err();
    assert!(e.reason.contains("flat refused") && !e.untracked, "{e:?}");
    assert!(log.borrow().contains(&"0 wait m1.1".to_string()), "{:?}", log.borrow());

    // Lane 1 cannot mark its end: untracked.
    let (mut lanes, _) = LogLane::lanes(2);
    lanes[1].fail_mark_after = Some(0);
    let e = issue_spread(&mut lanes, &shares, true).unwrap_err();
    assert!(e.untracked && e.reason.contains("lane 1 cannot mark"), "{e:?}");

    // The first lane cannot mark the fork: nothing is queued at all, nothing untracked.
    let (mut lanes, log) = LogLane::lanes(2);
    lanes[0].fail_mark_after = Some(0);
    let e = issue_spread(&mut lanes, &shares, true).unwrap_err();
    assert!(!e.untracked && log.borrow().is_empty(), "{e:?} {:?}", log.borrow());

    // Shares and lanes that do not pair are refused before anything is queued.
    let (mut lanes, log) = LogLane::lanes(3);
    assert!(issue_spread(&mut lanes, &shares, true).is_err() && log.borrow().is_empty());
}

/// The planner as it was before [`Planner`] (a look-ahead over the slice), kept as the reference
/// the streaming planner must agree with, copy for copy.
pub(crate) fn plan_before(pieces: &[(u64, u64, u64)], max_pitch: u64) -> CopyPlan {
    let mut out = CopyPlan::default();
    let mut i = 0;
    while i < pieces.len() {
        let (dst, src, width) = pieces[i];
        let step = pieces.get(i + 1).and_then(|&(d, s, l)| {
            let (dst_pitch, src_pitch) = (d.checked_sub(dst)?, s.checked_sub(src)?);
            let fits = |p: u64| p >= width && p <= max_pitch && p > 0;
            (l == width && fits(dst_pitch) && fits(src_pitch)).then_some((dst_pitch, src_pitch))
        });
        let Some((dst_pitch, src_pitch)) = step else {
            out.flat.push(pieces[i]);
            i += 1;
            continue;
        };
        let mut end = i + 1;
        while let Some(&(d, s, l)) = pieces.get(end + 1) {
            let (pd, ps, _) = pieces[end];
            if l != width || d.checked_sub(pd) != Some(dst_pitch) || s.checked_sub(ps) != Some(src_pitch) {
                break;
            }
            end += 1;
        }
        let height = (end - i + 1) as u64;
        if height >= ROWS_MIN {
            out.strided.push(Strided { dst, dst_pitch, src, src_pitch, width, height });
        } else {
            out.flat.extend_from_slice(&pieces[i..=end]);
        }
        i = end + 1;
    }
    out
}

/// A deterministic generator for the randomized cases (no dependency for a few numbers).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

/// Random batches that mix what the planner must tell apart: KV blocks (runs of planes),
/// broken and repeated strides, pieces of other sizes, descending and overlapping steps.
fn random_batch(rng: &mut Lcg) -> Vec<(u64, u64, u64)> {
    let mut pieces = vec![];
    for _ in 0..rng.below(12) {
        let (d, s, w) = (rng.below(1 << 20), rng.below(1 << 20), [64, 100, 4096][rng.below(3) as usize]);
        match rng.below(5) {
            0 => pieces.push((d, s, w)),
            1 | 2 => {
                let (dp, sp) = (w + rng.below(3) * 1000, w + rng.below(3) * 700);
                pieces.extend((0..rng.below(6) + 1).map(|r| (d + r * dp, s + r * sp, w)));
            }
            3 => pieces.extend((0..rng.below(4) + 1).map(|r| (d.saturating_sub(r * 3 * w), s + r * w, w))),
            _ => pieces.extend((0..rng.below(4) + 1).map(|r| (d + r * w / 2, s, w))),
        }
    }
    pieces
}

#[test]
fn the_streaming_planner_makes_exactly_the_copies_of_the_look_ahead_planner() {
    let mut rng = Lcg(7);
    for case in 0..2000 {
        let pieces = random_batch(&mut rng);
        let max_pitch = [MAX, 0, 3000, 4096][case % 4];
        assert_eq!(plan(&pieces, max_pitch), plan_before(&pieces, max_pitch), "case {case}: {pieces:?}");
    }
    // And the issue's layout: 2,048 scattered blocks of 160 planes, one 2D copy a block.
    let ids: Vec<(u64, u64)> = (0..2048).map(|i| ((i * 769) % 4096, (i * 1543 + 11) % 4096)).collect();
    let (pieces, _) = kv_pieces(32 << 10, 160, 4096, &ids);
    let got = plan(&pieces, MAX);
    assert_eq!(got, plan_before(&pieces, MAX));
    assert_eq!((got.strided.len(), got.flat.len()), (2048, 0));
}

#[test]
fn streamed_issue_queues_the_same_copies_in_the_same_order_and_moves_the_same_bytes() {
    let (page, planes, blocks) = (32, 6, 24);
    let ids: Vec<(u64, u64)> = (0..13).map(|i| ((i * 7) % 24, (i * 5 + 3) % 24)).collect();
    let (mut pieces, cache) = kv_pieces(page, planes, blocks, &ids[..7]);
    // Flat pieces in the middle and at the end (they still go last, in one call), into
    // destination blocks 1 and 2, which no block of the batch writes.
    pieces.push((cache + page + 5, 3, 17));
    pieces.extend(kv_pieces(page, planes, blocks, &ids[7..]).0);
    pieces.push((cache + 2 * page + 3, 400, 9));
    let mut want = arena(cache);
    for &(d, s, l) in &pieces {
        want.copy_within(s as usize..(s + l) as usize, d as usize);
    }
    let mut whole = HostSink::new(arena(cache));
    let before = issue(&plan_before(&pieces, MAX), &mut whole, false).unwrap();
    for per_step in [1, 2, 5, 13, 64] {
        let mut sink = HostSink::new(arena(cache));
        let issued = issue_streamed(pieces.iter().copied(), MAX, &mut sink, per_step).unwrap();
        assert_eq!(issued, before, "per_step {per_step}");
        assert_eq!(sink.calls, whole.calls, "per_step {per_step}: the same calls in the same order");
        assert_eq!(sink.calls.last().map(String::as_str), Some("flat x2"));
        assert!(sink.memory == want, "per_step {per_step}: every piece's bytes, exactly");
    }
    // A driver refusing 2D copies: each step's rows go flat, and still every byte lands once.
    let mut refusing = HostSink { refuse_2d: true, ..HostSink::new(arena(cache)) };
    let issued = issue_streamed(pieces.iter().copied(), MAX, &mut refusing, 5).unwrap();
    assert_eq!(issued.strided_as_rows, ids.len());
    assert!(refusing.memory == want, "refused 2D copies still move every byte");
    // Offsets shifted on the way in plan as the shifted list does.
    let shifted: Vec<(u64, u64, u64)> = pieces.iter().map(|&(d, s, l)| (d + 4096, s + 8192, l)).collect();
    let mut log = HostSink::new(vec![0; 3 * cache as usize + 8192]);
    let mut log_whole = HostSink::new(vec![0; 3 * cache as usize + 8192]);
    issue_streamed(pieces.iter().map(|&(d, s, l)| (d + 4096, s + 8192, l)), MAX, &mut log, 3).unwrap();
    issue(&plan(&shifted, MAX), &mut log_whole, false).unwrap();
    assert_eq!(log.calls, log_whole.calls);
    assert!(log.memory == log_whole.memory);
}

#[test]
fn a_streamed_batch_with_nothing_in_it_queues_nothing() {
    let mut sink = HostSink::new(vec![0; 16]);
    assert_eq!(issue_streamed(std::iter::empty(), MAX, &mut sink, 4).unwrap(), Issued::default());
    assert!(sink.calls.is_empty());
}
