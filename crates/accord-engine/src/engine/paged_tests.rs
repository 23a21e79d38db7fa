//! Strided paged writes: byte-exact placement with offsets and strides on both sides, in
//! process and over a lossy network, and refusals that place nothing.

use super::*;
use crate::{FaultConfig, TransferError};

const WAIT: Duration = Duration::from_secs(20);
const PAGE: u64 = 512;

use crate::engine::tests::{pair_of, pattern};

/// Where page `i` must land and what it must hold: (destination offset, source offset).
fn expected(op: &StridedPagedWriteOp<'_>) -> Vec<(usize, usize)> {
    op.src_pages
        .iter()
        .zip(op.dst_pages)
        .map(|(&s, &d)| ((op.dst_offset + d * op.dst_stride) as usize, (op.src_offset + s * op.src_stride) as usize))
        .collect()
}

/// Writes 12 pages taken as the middle third of 3-page blocks of the source into every other
/// page slot (offset 5) of the destination, in a shuffled order, and checks every byte of the
/// destination: the pages, and zeros everywhere else.
fn strided_write_lands_exactly(writer: &Engine, receiver: &Engine, imm: u32) {
    let (src_len, dst_len) = (40 * 3 * PAGE as usize, 2 * 40 * PAGE as usize + 5);
    let src = writer.alloc(src_len).unwrap();
    let data = pattern(imm as u64, src_len);
    src.write_at(0, &data).unwrap();
    let dst = receiver.alloc(dst_len).unwrap();
    let (h, d) = (src.handle(), dst.descriptor());
    let src_pages: Vec<u64> = vec![0, 1, 2, 3, 7, 8, 9, 30, 31, 39, 20, 21];
    let dst_pages: Vec<u64> = vec![4, 5, 6, 7, 0, 1, 39, 10, 11, 12, 2, 3];
    let op = StridedPagedWriteOp {
        src: &h,
        src_offset: PAGE,
        src_stride: 3 * PAGE,
        dst: &d,
        dst_offset: 5,
        dst_stride: 2 * PAGE,
        page_bytes: PAGE,
        src_pages: &src_pages,
        dst_pages: &dst_pages,
        imm: Some(imm),
    };
    writer.write_paged_strided(&op).unwrap().wait_timeout(WAIT).unwrap();
    assert_eq!(receiver.imm_counter(imm).wait(1, WAIT), 1);
    let mut want = vec![0u8; dst_len];
    for (doff, so) in expected(&op) {
        want[doff..doff + PAGE as usize].copy_from_slice(&data[so..so + PAGE as usize]);
    }
    assert!(dst.to_vec() == want, "strided pages differ");
}

#[test]
fn strided_pages_land_exactly_in_process() {
    let (a, b) = pair_of(|| Engine::builder().ignore_env().build().unwrap());
    strided_write_lands_exactly(&a, &b, 21);
}

#[test]
fn strided_pages_land_exactly_over_a_lossy_network() {
    let fault = FaultConfig { drop: 0.02, reorder: 0.05, duplicate: 0.01, ..Default::default() };
    let make = || Engine::builder().ignore_env().force_network(true).fault_injection(fault.clone(), 3).build().unwrap();
    let (a, b) = pair_of(make);
    for imm in 30..33 {
        strided_write_lands_exactly(&a, &b, imm);
    }
    assert_eq!(b.imm_counter(30).value(), 1, "counted once");
}

/// A scatter from one source into two regions of one peer and one of another, over a network
/// that drops, reorders and duplicates datagrams: every range byte-exact, nothing outside them
/// touched, the immediate counted once per destination at each receiver and never more.
#[test]
fn a_scatter_lands_exactly_over_a_lossy_network() {
    let fault = FaultConfig { drop: 0.02, reorder: 0.05, duplicate: 0.01, ..Default::default() };
    let make = || Engine::builder().ignore_env().force_network(true).fault_injection(fault.clone(), 5).build().unwrap();
    let (a, b) = pair_of(make);
    let c = make();
    a.add_peer(&c.address()).unwrap();
    c.add_peer(&a.address()).unwrap();
    let len = 600_000;
    let src = a.alloc(len).unwrap();
    let data = pattern(8, len);
    src.write_at(0, &data).unwrap();
    let (b1, b2, c1) = (b.alloc(300_000).unwrap(), b.alloc(4096).unwrap(), c.alloc(250_000).unwrap());
    let dsts = [
        ScatterDst { dst: b1.descriptor(), dst_offset: 7, src_offset: 0, len: 200_001 },
        ScatterDst { dst: b2.descriptor(), dst_offset: 0, src_offset: 200_001, len: 4096 },
        ScatterDst { dst: c1.descriptor(), dst_offset: 1000, src_offset: 350_000, len: 249_000 },
    ];
    for _ in 0..3 {
        a.scatter(&src.handle(), &dsts, Some(40)).unwrap().wait_timeout(WAIT).unwrap();
    }
    assert_eq!(b.imm_counter(40).wait(6, WAIT), 6, "two destinations at b, three scatters");
    assert_eq!(c.imm_counter(40).wait(3, WAIT), 3, "one destination at c, three scatters");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!((b.imm_counter(40).value(), c.imm_counter(40).value()), (6, 3), "no late duplicate counted");
    for (region, d) in [(&b1, &dsts[0]), (&b2, &dsts[1]), (&c1, &dsts[2])] {
        let mut want = vec![0u8; region.len()];
        let (at, from, n) = (d.dst_offset as usize, d.src_offset as usize, d.len as usize);
        want[at..at + n].copy_from_slice(&data[from..from + n]);
        assert!(region.to_vec() == want, "scattered range at {at} differs");
    }
}

#[test]
fn the_plain_paged_write_is_the_strided_one_with_page_strides() {
    let (src, dst) = (
        MrHandle { engine: EngineId(1), region: accord_proto::RegionId(2), len: 9 },
        MrDescriptor { engine: EngineId(1), region: 3, key: 4, len: 9, device: None, shared: None },
    );
    let plain =
        PagedWriteOp { src: &src, dst: &dst, page_bytes: 3, src_pages: &[1, 2], dst_pages: &[0, 1], imm: Some(5) };
    let strided = StridedPagedWriteOp::from(&plain);
    assert_eq!((strided.src_offset, strided.src_stride, strided.dst_offset, strided.dst_stride), (0, 3, 0, 3));
    assert_eq!((strided.src_pages, strided.dst_pages, strided.imm), (&[1u64, 2][..], &[0u64, 1][..], Some(5)));
}

#[test]
fn bad_strides_pages_and_overflow_are_refused_and_place_nothing() {
    for force_network in [false, true] {
        let (a, b) = pair_of(|| Engine::builder().ignore_env().force_network(force_network).build().unwrap());
        let src = a.alloc(8 * PAGE as usize).unwrap();
        src.write_at(0, &pattern(1, 8 * PAGE as usize)).unwrap();
        let dst = b.alloc(8 * PAGE as usize).unwrap();
        let (h, d) = (src.handle(), dst.descriptor());
        let base = StridedPagedWriteOp {
            src: &h,
            src_offset: 0,
            src_stride: PAGE,
            dst: &d,
            dst_offset: 0,
            dst_stride: PAGE,
            page_bytes: PAGE,
            src_pages: &[0, 1],
            dst_pages: &[0, 1],
            imm: Some(9),
        };
        let cases: Vec<(&str, StridedPagedWriteOp<'_>)> = vec![
            ("destination stride below the page", StridedPagedWriteOp { dst_stride: PAGE - 1, ..base }),
            ("destination page out of bounds", StridedPagedWriteOp { dst_pages: &[0, 8], ..base }),
            (
                "destination offset pushes the last page out",
                StridedPagedWriteOp { dst_offset: 1, dst_pages: &[0, 7], ..base },
            ),
            ("source page out of bounds", StridedPagedWriteOp { src_pages: &[0, 8], ..base }),
            ("source stride pushes a page out", StridedPagedWriteOp { src_stride: 8 * PAGE, ..base }),
            (
                "destination offset overflows",
                StridedPagedWriteOp { dst_pages: &[0, u64::MAX / 2], dst_stride: 4 * PAGE, ..base },
            ),
            ("source offset overflows", StridedPagedWriteOp { src_offset: u64::MAX, src_pages: &[0, 1], ..base }),
            ("page lists of different length", StridedPagedWriteOp { dst_pages: &[0], ..base }),
            ("zero page", StridedPagedWriteOp { page_bytes: 0, ..base }),
        ];
        for (what, op) in cases {
            let got = a.write_paged_strided(&op);
            assert!(
                matches!(
                    got,
                    Err(SubmitError::Invalid(_)
                        | SubmitError::DestinationOutOfBounds { .. }
                        | SubmitError::SourceOutOfBounds { .. })
                ),
                "{what}: {got:?}"
            );
        }
        // A good write afterwards still lands, and is the only thing counted.
        a.write_paged_strided(&base).unwrap().wait_timeout(WAIT).unwrap();
        assert_eq!(b.imm_counter(9).wait(1, WAIT), 1);
        assert_eq!(b.imm_counter(9).value(), 1, "refused writes counted nothing");
        let got = dst.to_vec();
        assert!(got[2 * PAGE as usize..].iter().all(|&x| x == 0), "refused writes placed nothing");
        // A destination that refuses at the receiver (a forged key): rejected, nothing placed.
        let mut forged = d;
        forged.key ^= 1;
        let op = StridedPagedWriteOp { dst: &forged, dst_pages: &[4, 5], imm: None, ..base };
        let got = a.write_paged_strided(&op).unwrap().wait_timeout(WAIT);
        assert!(matches!(got, Err(TransferError::Rejected(_))), "{got:?}");
        assert!(dst.to_vec()[2 * PAGE as usize..].iter().all(|&x| x == 0), "the forged write placed nothing");
    }
}

/// A KV push's page map as `accord.kv` lists it (each group of consecutive blocks in every
/// plane before the next group) becomes, on the copy-engine route, one 2D copy per group: the
/// runs of one group are equal pieces at the plane strides of each side, nothing stays flat.
#[test]
fn a_block_by_block_kv_page_map_is_one_2d_copy_per_block_group() {
    use crate::device::copy_plan::plan;
    let (planes, src_blocks, dst_blocks) = (160u64, 64u64, 100u64);
    let page = 32u64 << 10;
    // Blocks 7, 8 -> 30, 31 (one group), then 50 -> 2 and 1 -> 99.
    let groups: [&[(u64, u64)]; 3] = [&[(7, 30), (8, 31)], &[(50, 2)], &[(1, 99)]];
    let (mut src_pages, mut dst_pages) = (vec![], vec![]);
    for group in groups {
        for p in 0..planes {
            for &(s, d) in group {
                src_pages.push(p * src_blocks + s);
                dst_pages.push(p * dst_blocks + d);
            }
        }
    }
    // Only the lengths matter here: no engine sees this op.
    let src = MrHandle { engine: EngineId(1), region: accord_proto::RegionId(0), len: page * planes * src_blocks };
    let dst = MrDescriptor {
        engine: EngineId(2),
        region: 0,
        key: 0,
        len: page * planes * dst_blocks,
        device: None,
        shared: None,
    };
    let op = StridedPagedWriteOp {
        src: &src,
        src_offset: 0,
        src_stride: page,
        dst: &dst,
        dst_offset: 0,
        dst_stride: page,
        page_bytes: page,
        src_pages: &src_pages,
        dst_pages: &dst_pages,
        imm: None,
    };
    let runs = page_runs(&op, page * planes * src_blocks).unwrap();
    assert_eq!(runs.len(), 3 * planes as usize, "a run per plane of each group");
    let got = plan(&runs, (1 << 31) - 1);
    assert!(got.flat.is_empty());
    let shapes: Vec<(u64, u64, u64, u64)> =
        got.strided.iter().map(|c| (c.width, c.height, c.dst_pitch, c.src_pitch)).collect();
    let (dp, sp) = (page * dst_blocks, page * src_blocks);
    assert_eq!(shapes, vec![(2 * page, planes, dp, sp), (page, planes, dp, sp), (page, planes, dp, sp)]);
}
