use super::assembly::Assemblies;
use super::*;
use crate::engine::route::read::tests::{buffers, network_engine};
use crate::engine::route::read::{serve, Admission, ReadOp};
use crate::engine::tests::pair_of;
use crate::memory::MrBuffer;
use crate::{Engine, FaultConfig};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

const WAIT: Duration = Duration::from_secs(30);

/// A KV-like shape: `planes` planes of `blocks` pages of `page` bytes in each region.
#[derive(Clone, Copy)]
struct Shape {
    page: u64,
    blocks: u64,
    planes: u64,
}

impl Shape {
    fn region_len(&self) -> usize {
        (self.page * self.blocks * self.planes) as usize
    }
}

/// The batched read of `src_pages` into `dst_pages` of every plane, whole-plane strides.
fn op<'a>(
    shape: Shape,
    dst: &'a MrHandle,
    src: &'a MrDescriptor,
    pages: &'a (Vec<u64>, Vec<u64>),
    imm: Option<u32>,
) -> PagedReadOp<'a> {
    PagedReadOp {
        dst,
        dst_offset: 0,
        dst_stride: shape.page,
        src,
        src_offset: 0,
        src_stride: shape.page,
        page_bytes: shape.page,
        src_pages: &pages.0,
        dst_pages: &pages.1,
        planes: shape.planes,
        src_plane_stride: shape.page * shape.blocks,
        dst_plane_stride: shape.page * shape.blocks,
        imm,
    }
}

/// `n` scattered distinct block ids on each side (seeded).
fn scattered(shape: Shape, n: usize, seed: u64) -> (Vec<u64>, Vec<u64>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut ids: Vec<u64> = (0..shape.blocks).collect();
    ids.shuffle(&mut rng);
    let src = ids[..n].to_vec();
    ids.shuffle(&mut rng);
    (src, ids[..n].to_vec())
}

/// Whether `got` holds exactly `data`'s pages `pages.0` at `pages.1` in every plane, and zeros
/// everywhere else.
fn check_pages(shape: Shape, got: &[u8], data: &[u8], pages: &(Vec<u64>, Vec<u64>)) -> Result<(), String> {
    let mut want = vec![0u8; got.len()];
    let (page, plane) = (shape.page as usize, (shape.page * shape.blocks) as usize);
    for p in 0..shape.planes as usize {
        for (&s, &d) in pages.0.iter().zip(&pages.1) {
            let (s, d) = (p * plane + s as usize * page, p * plane + d as usize * page);
            want[d..d + page].copy_from_slice(&data[s..s + page]);
        }
    }
    match got.iter().zip(&want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(at) => Err(format!("byte {at} differs (plane {}, page {})", at / plane, at % plane / page)),
    }
}

fn setup(owner: &Engine, reader: &Engine, shape: Shape, seed: u64) -> (MrBuffer, MrBuffer, Vec<u8>) {
    buffers(owner, reader, shape.region_len(), seed)
}

#[test]
fn a_request_survives_its_frames_in_any_order() {
    let request = PagedRequest {
        src_region: 7,
        src_key: u64::MAX,
        dst_region: u32::MAX,
        dst_key: 3,
        dst_device: true,
        geometry: Geometry {
            src_offset: 1,
            src_stride: 2,
            dst_offset: 3,
            dst_stride: 4,
            page_bytes: 4,
            planes: 5,
            src_plane_stride: 6,
            dst_plane_stride: u64::MAX,
        },
        pages: (0..11u64).map(|i| (i * 1000, u64::from(u32::MAX) - i)).collect(),
    };
    let mut frames = request.frames();
    assert_eq!(frames.len(), HEADER_FRAMES as usize + 3, "11 pairs in 3 frames");
    frames.shuffle(&mut ChaCha8Rng::seed_from_u64(1));
    let mut assemblies = Assemblies::default();
    let last = frames.len() - 1;
    for (i, (index, half, words)) in frames.into_iter().enumerate() {
        // Through the wire codec, as the owner's worker sees it.
        let message =
            ReadMessage { from: EngineId(9), req: 5, body: Body::Paged { index, half, words, dst_device: true } };
        let decoded = ReadMessage::decode(0, &message.encode().unwrap()).unwrap();
        let Body::Paged { index, half, words, dst_device } = decoded.body else { panic!("{decoded:?}") };
        let (taken, evicted) = assemblies.take(EngineId(9), 5, index, half, words, dst_device);
        assert!(evicted.is_empty());
        if i < last {
            assert_eq!(taken, Taken::Partial, "frame {i}");
        } else {
            assert_eq!(taken, Taken::Complete(Ok(request.clone())));
        }
    }
    assert_eq!(assemblies.len(), 0, "a complete request is forgotten");
}

#[test]
fn assemblies_are_bounded_and_refuse_malformed_frames() {
    let mut assemblies = Assemblies::default();
    for req in 0..READ_ASSEMBLIES_MAX as u64 {
        assert_eq!(assemblies.take(EngineId(1), req, 0, 0, [0; 4], false), (Taken::Partial, vec![]));
    }
    // One more: the oldest is dropped, to be refused.
    let (taken, evicted) = assemblies.take(EngineId(2), 99, 0, 0, [0; 4], false);
    assert_eq!((taken, evicted), (Taken::Partial, vec![(EngineId(1), 0)]));
    assert_eq!(assemblies.len(), READ_ASSEMBLIES_MAX);
    // A frame received twice is held once.
    assemblies.take(EngineId(2), 99, 0, 0, [0; 4], false);
    assert_eq!(assemblies.frames(), READ_ASSEMBLIES_MAX);
    let refused = |a: &mut Assemblies, req, index, half, words| a.take(EngineId(3), req, index, half, words, false).0;
    // A frame index past any request's, a pairs count of 0 or 5: refused.
    assert_eq!(refused(&mut assemblies, 1, u32::MAX, 1, [0; 4]), Taken::Refused(RejectReason::MessageTooLarge));
    assert_eq!(refused(&mut assemblies, 2, HEADER_FRAMES, 0, [0; 4]), Taken::Refused(RejectReason::MessageTooLarge));
    assert_eq!(refused(&mut assemblies, 3, HEADER_FRAMES, 5, [0; 4]), Taken::Refused(RejectReason::MessageTooLarge));
    // A request claiming more pages than a request may carry.
    let many = READ_PIECES_PER_REQUEST_MAX as u64 + 1;
    assert_eq!(refused(&mut assemblies, 4, 1, 0, [1, 1, 1, many]), Taken::Refused(RejectReason::MessageTooLarge));
    // A page frame past the count the header gives, after the header and before it.
    refused(&mut assemblies, 5, 1, 0, [1, 1, 1, 4]);
    assert_eq!(
        refused(&mut assemblies, 5, HEADER_FRAMES + 1, 1, [0; 4]),
        Taken::Refused(RejectReason::MessageTooLarge)
    );
    refused(&mut assemblies, 7, HEADER_FRAMES + 1, 1, [0; 4]);
    assert_eq!(refused(&mut assemblies, 7, 1, 0, [1, 1, 1, 4]), Taken::Refused(RejectReason::MessageTooLarge));
    // A page frame whose count disagrees with the header's: the request completes malformed.
    refused(&mut assemblies, 6, 0, 0, [0; 4]);
    refused(&mut assemblies, 6, 1, 0, [1, 1, 1, 3]);
    refused(&mut assemblies, 6, 2, 0, [1, 0, 0, 0]);
    assert_eq!(
        refused(&mut assemblies, 6, HEADER_FRAMES, 2, [0; 4]),
        Taken::Complete(Err(RejectReason::MessageTooLarge))
    );
}

#[test]
fn assemblies_hold_a_bounded_number_of_frames() {
    let mut assemblies = Assemblies::default();
    // Requests of the largest size, half received: past the frame bound the oldest go.
    let half = (FRAMES_MAX / 2) as usize;
    let mut evicted = vec![];
    for req in 0..40u64 {
        for index in HEADER_FRAMES..HEADER_FRAMES + half as u32 {
            let (taken, gone) = assemblies.take(EngineId(1), req, index, 4, [0; 4], false);
            assert_eq!(taken, Taken::Partial);
            evicted.extend(gone);
        }
        assert!(assemblies.frames() <= READ_ASSEMBLY_FRAMES_MAX, "request {req}: {} frames", assemblies.frames());
    }
    assert!(!evicted.is_empty() && evicted[0] == (EngineId(1), 0), "the oldest went first: {evicted:?}");
    assert_eq!(assemblies.len() + evicted.len(), 40);
}

#[test]
fn pieces_merge_into_runs_and_bad_ones_are_named() {
    let g = Geometry {
        src_offset: 10,
        src_stride: 100,
        dst_offset: 0,
        dst_stride: 100,
        page_bytes: 100,
        planes: 2,
        src_plane_stride: 1000,
        dst_plane_stride: 2000,
    };
    // Pages 0,1 then 5 -> 3,4 then 9: one run of two pages and one page, each in every plane
    // before the next (block by block: a group's planes are equal pieces at the plane strides).
    let runs = g.runs(&[(0, 3), (1, 4), (5, 9)], 2000, 4000).unwrap();
    assert_eq!(runs, vec![(300, 10, 200), (2300, 1010, 200), (900, 510, 100), (2900, 1510, 100)]);
    // Where the planes themselves are contiguous, a group's planes still merge into one run.
    let packed = Geometry { planes: 3, src_offset: 0, src_plane_stride: 100, dst_plane_stride: 100, ..g };
    assert_eq!(packed.runs(&[(0, 0)], 300, 300).unwrap(), vec![(0, 0, 300)]);
    assert!(matches!(g.runs(&[(9, 0)], 2000, 4000), Err(PieceError::Source(m)) if m.contains("page 0 of plane 1")));
    assert!(matches!(g.runs(&[(0, 20)], 2000, 4000), Err(PieceError::Destination(_))));
    assert!(matches!(g.runs(&[(u64::MAX, 0)], u64::MAX, 4000), Err(PieceError::Overflow(_))));
    let narrow = Geometry { dst_stride: 99, ..g };
    assert!(matches!(narrow.runs(&[(0, 0)], 2000, 4000), Err(PieceError::Shape(m)) if m.contains("overlap")));
    for bad in [Geometry { page_bytes: 0, ..g }, Geometry { planes: 0, ..g }] {
        assert!(matches!(bad.runs(&[(0, 0)], 2000, 4000), Err(PieceError::Shape(_))));
    }
}

/// The owner's write back of a KV-shaped read, planned as the copy-engine route plans it: one 2D
/// copy per group of consecutive blocks (all its planes), nothing left flat.
#[test]
fn a_kv_read_is_one_2d_copy_per_block_group_on_the_copy_engine() {
    use crate::device::copy_plan::plan;
    let (page, blocks, planes) = (32 << 10, 64u64, 160u64);
    let plane = page * blocks;
    let g = Geometry {
        src_offset: 0,
        src_stride: page,
        dst_offset: 0,
        dst_stride: page,
        page_bytes: page,
        planes,
        src_plane_stride: plane,
        dst_plane_stride: plane,
    };
    // Blocks 7, 8, 9 -> 0, 1, 2 (one group), then 40 -> 63 and 3 -> 20 alone.
    let pages = [(7, 0), (8, 1), (9, 2), (40, 63), (3, 20)];
    let runs = g.runs(&pages, plane * planes, plane * planes).unwrap();
    assert_eq!(runs.len(), 3 * planes as usize);
    let pieces: Vec<(u64, u64, u64)> = runs.iter().map(|&(d, s, l)| (d, s, l)).collect();
    let got = plan(&pieces, (1 << 31) - 1);
    assert!(got.flat.is_empty(), "{:?}", got.flat);
    let shapes: Vec<(u64, u64, u64, u64)> =
        got.strided.iter().map(|c| (c.width, c.height, c.dst_pitch, c.src_pitch)).collect();
    assert_eq!(
        shapes,
        vec![(3 * page, planes, plane, plane), (page, planes, plane, plane), (page, planes, plane, plane)]
    );
}

#[test]
fn a_batched_read_in_process_lands_every_plane_with_one_immediate() {
    let (owner, reader) = pair_of(|| Engine::builder().ignore_env().build().unwrap());
    let shape = Shape { page: 4096, blocks: 32, planes: 6 };
    let (src, dst, data) = setup(&owner, &reader, shape, 1);
    let pages = scattered(shape, 20, 1);
    let (h, d) = (dst.handle(), src.descriptor());
    reader.read_paged(&op(shape, &h, &d, &pages, Some(51))).unwrap().wait_timeout(WAIT).unwrap();
    check_pages(shape, &dst.to_vec(), &data, &pages).unwrap();
    assert_eq!(reader.imm_counter(51).wait(1, WAIT), 1);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(reader.imm_counter(51).value(), 1, "one immediate for the whole read");
    assert_eq!(owner.imm_counters_held(), 0, "nothing counted at the owner");
}

#[test]
fn a_batched_read_over_the_network_is_one_request_and_lands_byte_exact() {
    let (owner, reader) = pair_of(network_engine);
    let shape = Shape { page: 1024, blocks: 64, planes: 10 };
    let (src, dst, data) = setup(&owner, &reader, shape, 2);
    let pages = scattered(shape, 37, 2);
    let (h, d) = (dst.handle(), src.descriptor());
    reader.read_paged(&op(shape, &h, &d, &pages, Some(52))).unwrap().wait_timeout(WAIT).unwrap();
    check_pages(shape, &dst.to_vec(), &data, &pages).unwrap();
    assert_eq!(reader.imm_counter(52).wait(1, WAIT), 1);
    assert_eq!((reader.read_stats().requests_sent, owner.read_stats().requests_served), (1, 1), "one request");
    assert_eq!(owner.shared.read.assemblies.lock().unwrap().len(), 0, "nothing left assembling");
}

/// More pieces than one request carries: several requests, one immediate after all of them.
#[test]
fn a_batched_read_larger_than_a_request_is_split_and_counted_once() {
    let (owner, reader) = pair_of(network_engine);
    // 2 blocks x 40,000 planes = 80,000 pieces, more than the 65,536 of one request.
    let shape = Shape { page: 16, blocks: 4, planes: 40_000 };
    let (src, dst, data) = setup(&owner, &reader, shape, 3);
    let pages = (vec![3, 0], vec![1, 2]);
    let (h, d) = (dst.handle(), src.descriptor());
    reader.read_paged(&op(shape, &h, &d, &pages, Some(53))).unwrap().wait_timeout(WAIT).unwrap();
    check_pages(shape, &dst.to_vec(), &data, &pages).unwrap();
    // The split is by page ids: with 2 ids and 40,000 planes, one id a request.
    assert_eq!(reader.read_stats().requests_sent, 2);
    assert_eq!(reader.imm_counter(53).wait(1, WAIT), 1);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(reader.imm_counter(53).value(), 1, "one immediate for the whole read");
}

#[test]
fn a_batched_read_under_loss_reordering_and_duplication_lands_byte_exact() {
    let fault = FaultConfig { drop: 0.02, reorder: 0.05, duplicate: 0.02, ..Default::default() };
    let make =
        || Engine::builder().ignore_env().force_network(true).fault_injection(fault.clone(), 23).build().unwrap();
    let (owner, reader) = pair_of(make);
    let shape = Shape { page: 2048, blocks: 48, planes: 8 };
    for seed in 0..3 {
        let (src, dst, data) = setup(&owner, &reader, shape, 10 + seed);
        let pages = scattered(shape, 30 + seed as usize, seed);
        let (h, d) = (dst.handle(), src.descriptor());
        reader.read_paged(&op(shape, &h, &d, &pages, Some(54))).unwrap().wait_timeout(WAIT).unwrap();
        check_pages(shape, &dst.to_vec(), &data, &pages).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
    assert_eq!(reader.imm_counter(54).wait(3, WAIT), 3, "each read counted once");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(reader.imm_counter(54).value(), 3, "each read counted once");
}

#[test]
fn bad_batched_reads_are_refused_before_anything_moves() {
    for force_network in [false, true] {
        let (owner, reader) = pair_of(|| Engine::builder().ignore_env().force_network(force_network).build().unwrap());
        let shape = Shape { page: 256, blocks: 8, planes: 2 };
        let (src, dst, _) = setup(&owner, &reader, shape, 4);
        let (h, d) = (dst.handle(), src.descriptor());
        let good = (vec![1, 2], vec![3, 4]);
        // Refused at submission, each with a message saying what to fix.
        let cases: Vec<(PagedReadOp<'_>, &str)> = vec![
            (PagedReadOp { src_pages: &[8], dst_pages: &[0], ..op(shape, &h, &d, &good, None) }, "remote source"),
            (PagedReadOp { src_pages: &[0], dst_pages: &[8], ..op(shape, &h, &d, &good, None) }, "local destination"),
            (
                PagedReadOp { src_pages: &[0, 1], dst_pages: &[0], ..op(shape, &h, &d, &good, None) },
                "destination per source",
            ),
            (PagedReadOp { dst_stride: 255, ..op(shape, &h, &d, &good, None) }, "overlap"),
            (PagedReadOp { page_bytes: 0, ..op(shape, &h, &d, &good, None) }, "page_bytes"),
            (PagedReadOp { planes: 0, ..op(shape, &h, &d, &good, None) }, "planes"),
            (PagedReadOp { planes: 3, ..op(shape, &h, &d, &good, None) }, "plane 2"),
            (PagedReadOp { src_pages: &[1 << 32], dst_pages: &[0], ..op(shape, &h, &d, &good, None) }, "2^32"),
            (PagedReadOp { src_offset: 1, src_stride: u64::MAX, ..op(shape, &h, &d, &good, None) }, "overflows"),
        ];
        for (bad, says) in cases {
            match reader.read_paged(&bad) {
                Err(SubmitError::Invalid(m)) => assert!(m.contains(says), "{m:?} should say {says:?}"),
                other => panic!("{says}: {other:?}"),
            }
        }
        // Refused by the owner: a forged key, a descriptor longer than the region.
        let mut forged = d;
        forged.key ^= 1;
        let got = reader.read_paged(&op(shape, &h, &forged, &good, Some(5))).unwrap().wait_timeout(WAIT);
        assert_eq!(got, Err(TransferError::Rejected(RejectReason::BadKey)), "force_network {force_network}");
        let mut longer = d;
        longer.len *= 2;
        let far = (vec![1, 20], vec![3, 4]);
        let got = reader.read_paged(&PagedReadOp { planes: 1, ..op(shape, &h, &longer, &far, Some(5)) });
        assert_eq!(got.unwrap().wait_timeout(WAIT), Err(TransferError::Rejected(RejectReason::OutOfBounds)));
        assert!(dst.to_vec().iter().all(|&b| b == 0), "nothing placed");
        assert_eq!(reader.imm_counter(5).value(), 0, "no immediate counted");
    }
}

#[test]
fn a_batched_read_from_a_dropped_owner_fails_naming_it() {
    let make = || Engine::builder().ignore_env().force_network(true).idle_timeout(Duration::from_millis(200)).build();
    let (owner, reader) = pair_of(|| make().unwrap());
    let shape = Shape { page: 512, blocks: 8, planes: 4 };
    let (src, dst, _) = setup(&owner, &reader, shape, 5);
    let (owner_id, d, h) = (owner.id().0, src.descriptor(), dst.handle());
    drop(src);
    drop(owner);
    let pages = scattered(shape, 5, 5);
    let got = reader.read_paged(&op(shape, &h, &d, &pages, None)).unwrap().wait_timeout(WAIT);
    assert!(matches!(got, Err(TransferError::NoReply { peer, .. }) if peer == owner_id), "{got:?}");
}

/// The owner's handler fed every frame of a request twice (as resends after a connection
/// failure would deliver them): it writes once and answers a duplicate of a finished request.
#[test]
fn duplicated_frames_are_written_once() {
    let (owner, reader) = pair_of(network_engine);
    let shape = Shape { page: 1024, blocks: 8, planes: 2 };
    let (src, dst, data) = setup(&owner, &reader, shape, 6);
    let (d, dd) = (src.descriptor(), dst.descriptor());
    let pages = (vec![0u64, 5], vec![7u64, 1]);
    let request = PagedRequest {
        src_region: d.region,
        src_key: d.key,
        dst_region: dd.region,
        dst_key: dd.key,
        dst_device: false,
        geometry: op(shape, &dst.handle(), &d, &pages, None).geometry(),
        pages: pages.0.iter().copied().zip(pages.1.iter().copied()).collect(),
    };
    let frame = |index: u32, half: u32, words: [u64; 4]| {
        let body = Body::Paged { index, half, words, dst_device: false };
        ReadMessage { from: reader.id(), req: 91, body }.encode().unwrap()
    };
    for (index, half, words) in request.frames() {
        assert!(serve(&owner.shared, 0, &frame(index, half, words)).is_none());
    }
    let answered = |owner: &Engine| {
        let served = owner.shared.read.served.lock().unwrap();
        served.get(&reader.id()).and_then(|s| s.known(91)).flatten()
    };
    let deadline = Instant::now() + WAIT;
    while answered(&owner).is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(answered(&owner), Some(Outcome::Done));
    check_pages(shape, &dst.to_vec(), &data, &pages).unwrap();
    dst.write_at(0, &vec![0u8; data.len()]).unwrap();
    // Every frame again: the first is answered again, the others ignored; nothing is written.
    for (index, half, words) in request.frames() {
        let again = serve(&owner.shared, 0, &frame(index, half, words));
        assert_eq!(again.is_some(), index == 0, "frame {index}");
    }
    assert_eq!(owner.read_stats().requests_served, 1);
    assert_eq!(
        owner.shared.read.served.lock().unwrap().get_mut(&reader.id()).unwrap().admit(91),
        Admission::Answered(Outcome::Done)
    );
    std::thread::sleep(Duration::from_millis(50));
    assert!(dst.to_vec().iter().all(|&b| b == 0), "written twice");
}

/// A single READ and a batched one of the same piece agree (the batched path is not a new
/// meaning of the same fields).
#[test]
fn a_one_page_batched_read_equals_a_read() {
    let (owner, reader) = pair_of(network_engine);
    let (src, dst, data) = buffers(&owner, &reader, 1 << 16, 7);
    let (h, d) = (dst.handle(), src.descriptor());
    let single = ReadOp { dst: &h, dst_offset: 100, src: &d, src_offset: 5000, len: 3000, imm: None };
    reader.read(&single).unwrap().wait_timeout(WAIT).unwrap();
    let first = dst.to_vec();
    dst.write_at(0, &vec![0u8; 1 << 16]).unwrap();
    let batched = PagedReadOp {
        dst: &h,
        dst_offset: 100,
        dst_stride: 3000,
        src: &d,
        src_offset: 5000,
        src_stride: 3000,
        page_bytes: 3000,
        src_pages: &[0],
        dst_pages: &[0],
        planes: 1,
        src_plane_stride: 0,
        dst_plane_stride: 0,
        imm: None,
    };
    reader.read_paged(&batched).unwrap().wait_timeout(WAIT).unwrap();
    assert!(dst.to_vec() == first, "the two reads differ");
    assert!(first[100..3100] == data[5000..8000]);
}

/// Many batched reads in flight at once (their frames interleaving at the owner, some lost and
/// resent): none pushes another out of the owner's assemblies nor overflows its write-back queue
/// (when that queue held 256, the 257th was refused on a 2-core machine whose other core ran a
/// build), every one lands.
#[test]
fn many_batched_reads_in_flight_all_land() {
    let fault = FaultConfig { drop: 0.01, reorder: 0.05, ..Default::default() };
    let make =
        || Engine::builder().ignore_env().force_network(true).fault_injection(fault.clone(), 31).build().unwrap();
    let (owner, reader) = pair_of(make);
    let shape = Shape { page: 256, blocks: 64, planes: 4 };
    let (src, dst, data) = setup(&owner, &reader, shape, 8);
    let (h, d) = (dst.handle(), src.descriptor());
    // 300 reads of 2 pages each (every page once): 5 frames a request.
    let pages = scattered(shape, 64, 9);
    let singles: Vec<(Vec<u64>, Vec<u64>)> =
        pages.0.chunks(2).zip(pages.1.chunks(2)).map(|(s, t)| (s.to_vec(), t.to_vec())).cycle().take(300).collect();
    let transfers: Vec<Transfer> =
        singles.iter().map(|p| reader.read_paged(&op(shape, &h, &d, p, Some(55))).unwrap()).collect();
    for (i, t) in transfers.iter().enumerate() {
        t.wait_timeout(WAIT).unwrap_or_else(|e| panic!("read {i}: {e}"));
    }
    check_pages(shape, &dst.to_vec(), &data, &pages).unwrap();
    assert_eq!(reader.imm_counter(55).wait(300, WAIT), 300);
    assert_eq!(owner.read_stats().refused, 0, "nothing refused");
}
