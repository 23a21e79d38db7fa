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
/// moves the bytes as the copy engine would; it can refuse 2D copies, as a driver might.
struct HostSink {
    memory: Vec<u8>,
    refuse_2d: bool,
    calls: Vec<String>,
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
        for (dst, src, len) in c.rows().collect::<Vec<_>>() {
            self.copy(dst, src, len);
        }
        Ok(())
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
    let mut sink = HostSink { memory: arena(cache), refuse_2d: false, calls: vec![] };
    let issued = issue(&plan(&pieces, MAX), &mut sink).unwrap();
    assert_eq!(issued, Issued { flat_calls: 0, strided: ids.len(), strided_as_rows: 0 });
    assert_eq!(sink.calls, vec!["2d 64x10"; ids.len()], "one 2D copy per block, nothing flat");
    assert!(sink.memory == want, "the 2D copies moved exactly the pieces' bytes");

    // A driver that refuses 2D copies: the same bytes, row by row in one flat batch.
    let mut refusing = HostSink { memory: arena(cache), refuse_2d: true, calls: vec![] };
    let issued = issue(&plan(&pieces, MAX), &mut refusing).unwrap();
    assert_eq!(issued, Issued { flat_calls: 1, strided: 0, strided_as_rows: ids.len() });
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
    let mut sink = HostSink { memory: arena(cache), refuse_2d: false, calls: vec![] };
    let issued = issue(&got, &mut sink).unwrap();
    assert_eq!(issued.strided, 2, "the two ordered blocks: {:?}", sink.calls);
    assert_eq!(issued.flat_calls, 1, "everything else in one flat batch");
    assert_eq!(sink.calls.last().map(String::as_str), Some("flat x7"));
    assert!(sink.memory == want);
}
