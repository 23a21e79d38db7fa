use super::*;
use crate::engine::control::ControlFrame;
use crate::memory::MrBuffer;
use crate::{Engine, FaultConfig};

const WAIT: Duration = Duration::from_secs(20);

use crate::engine::tests::{pair_of, pattern};

pub(super) fn network_engine() -> Engine {
    Engine::builder().ignore_env().force_network(true).build().unwrap()
}

/// An owner buffer of `len` pattern bytes and a zeroed reader buffer of `len` bytes.
pub(super) fn buffers(owner: &Engine, reader: &Engine, len: usize, seed: u64) -> (MrBuffer, MrBuffer, Vec<u8>) {
    let src = owner.alloc(len).unwrap();
    let data = pattern(seed, len);
    src.write_at(0, &data).unwrap();
    (src, reader.alloc(len).unwrap(), data)
}

fn read_all(reader: &Engine, dst: &MrBuffer, src: &MrBuffer, imm: Option<u32>) -> Result<(), TransferError> {
    let (h, d) = (dst.handle(), src.descriptor());
    let op = ReadOp { dst: &h, dst_offset: 0, src: &d, src_offset: 0, len: d.len, imm };
    reader.read(&op).unwrap().wait_timeout(WAIT)
}

#[test]
fn request_and_reply_frames_round_trip() {
    let request = Request {
        src_region: u32::MAX,
        src_key: u64::MAX,
        src_offset: OFFSET_MASK,
        dst_region: 7,
        dst_key: 1,
        dst_offset: OFFSET_MASK - 1,
        len: crate::memory::REGION_BYTES_MAX,
        dst_device: false,
    };
    for body in [
        Body::Request(request),
        Body::Reply(Outcome::Done),
        Body::Reply(Outcome::WriteFailed),
        Body::Reply(Outcome::Refused(RejectReason::BadKey)),
    ] {
        let message = ReadMessage { from: EngineId(3), req: u64::MAX, body };
        let bytes = message.encode().unwrap();
        assert_eq!(ControlFrame::route_of(0, &bytes), Some(RouteTag::Read));
        assert_eq!(ReadMessage::decode(0, &bytes), Ok(message));
    }
    // An offset past the layout's 40 bits does not encode (submission refuses it first).
    let far = Request { src_offset: OFFSET_MASK + 1, ..request };
    assert_eq!(ReadMessage { from: EngineId(3), req: 1, body: Body::Request(far) }.encode(), None);
}

#[test]
fn malformed_frames_are_errors() {
    let good = ReadMessage { from: EngineId(1), req: 2, body: Body::Reply(Outcome::Done) }.encode().unwrap();
    let mut flags = good;
    flags[6] = 1;
    assert_eq!(ReadMessage::decode(0, &flags), Err(FrameError::Reserved));
    let mut kind = good;
    kind[5] = 9;
    assert_eq!(ReadMessage::decode(0, &kind), Err(FrameError::Kind(9)));
    let mut junk_reply = good;
    junk_reply[24] = 1;
    assert!(matches!(ReadMessage::decode(0, &junk_reply), Err(FrameError::Field(_))));
    let pull = ControlFrame::new(RouteTag::Pull, REQUEST, EngineId(1), 2).encode();
    assert_eq!(ReadMessage::decode(0, &pull), Err(FrameError::UnknownRoute));
}

#[test]
fn served_reads_take_each_id_once_and_forget_the_oldest() {
    let mut served = ServedReads::default();
    assert_eq!(served.admit(5), Admission::New);
    assert_eq!(served.admit(5), Admission::InFlight);
    served.answered(5, Outcome::Done);
    assert_eq!(served.admit(5), Admission::Answered(Outcome::Done));
    for req in 100..100 + READ_SERVED_REMEMBERED as u64 {
        assert_eq!(served.admit(req), Admission::New);
    }
    assert_eq!(served.outcomes.len(), READ_SERVED_REMEMBERED, "bounded");
    assert_eq!(served.admit(5), Admission::New, "the oldest id was forgotten");
}

#[test]
fn a_read_in_process_is_a_checked_memcpy_and_counts_its_immediate_here() {
    let (owner, reader) = pair_of(|| Engine::builder().ignore_env().build().unwrap());
    let (src, dst, data) = buffers(&owner, &reader, 1 << 20, 1);
    read_all(&reader, &dst, &src, Some(41)).unwrap();
    assert!(dst.to_vec() == data, "bytes differ");
    assert_eq!(reader.imm_counter(41).wait(1, WAIT), 1, "counted at the reader");
    assert_eq!(owner.imm_counters_held(), 0, "nothing counted at the owner");
    // A sub-range, into an offset of the destination.
    let (h, d) = (dst.handle(), src.descriptor());
    let op = ReadOp { dst: &h, dst_offset: 10, src: &d, src_offset: 1000, len: 7, imm: None };
    reader.read(&op).unwrap().wait_timeout(WAIT).unwrap();
    assert_eq!(dst.to_vec()[10..17], data[1000..1007]);
}

#[test]
fn a_read_over_the_network_lands_byte_exact_with_its_immediate() {
    let (owner, reader) = pair_of(network_engine);
    for (len, seed) in [(1usize, 1u64), (4096 + 3, 2), (3 << 20, 3)] {
        let (src, dst, data) = buffers(&owner, &reader, len, seed);
        read_all(&reader, &dst, &src, Some(7)).unwrap();
        assert!(dst.to_vec() == data, "{len} bytes differ");
    }
    assert_eq!(reader.imm_counter(7).wait(3, WAIT), 3);
    assert_eq!(owner.imm_counters_held(), 0, "nothing counted at the owner");
    assert_eq!(reader.read_stats().requests_sent, 3);
    assert_eq!(owner.read_stats().requests_served, 3);
}

#[test]
fn a_large_read_is_split_over_the_owners_lanes() {
    let make = || Engine::builder().ignore_env().force_network(true).workers_per_nic(3).build().unwrap();
    let (owner, reader) = pair_of(make);
    let (src, dst, data) = buffers(&owner, &reader, 8 << 20, 9);
    read_all(&reader, &dst, &src, None).unwrap();
    assert!(dst.to_vec() == data, "bytes differ");
    let busy = owner.stats().lanes.iter().filter(|l| l.endpoint.datagrams_sent > 20).count();
    let sent: Vec<u64> = owner.stats().lanes.iter().map(|l| l.endpoint.datagrams_sent).collect();
    assert!(busy >= 2, "the owner's write went over several lanes: datagrams per lane {sent:?}");
}

#[test]
fn a_read_under_loss_and_reordering_lands_byte_exact() {
    let fault = FaultConfig { drop: 0.02, reorder: 0.05, duplicate: 0.01, ..Default::default() };
    let make =
        || Engine::builder().ignore_env().force_network(true).fault_injection(fault.clone(), 11).build().unwrap();
    let (owner, reader) = pair_of(make);
    for seed in 0..4 {
        let (src, dst, data) = buffers(&owner, &reader, (1 << 20) + 17 * seed as usize, seed);
        read_all(&reader, &dst, &src, Some(3)).unwrap();
        assert!(dst.to_vec() == data, "bytes differ (seed {seed})");
    }
    assert_eq!(reader.imm_counter(3).wait(4, WAIT), 4, "each read counted once");
}

#[test]
fn bad_reads_are_refused_and_place_nothing() {
    for force_network in [false, true] {
        let (owner, reader) = pair_of(|| Engine::builder().ignore_env().force_network(force_network).build().unwrap());
        let (src, dst, _) = buffers(&owner, &reader, 4096, 5);
        let h = dst.handle();
        // Wrong key: refused by the owner, as a write with that key would be.
        let mut forged = src.descriptor();
        forged.key ^= 1;
        let op = ReadOp { dst: &h, dst_offset: 0, src: &forged, src_offset: 0, len: 4096, imm: Some(2) };
        let got = reader.read(&op).unwrap().wait_timeout(WAIT);
        assert_eq!(got, Err(TransferError::Rejected(RejectReason::BadKey)), "force_network {force_network}");
        // A descriptor that claims more than the region holds: refused by the owner's bounds.
        let mut longer = src.descriptor();
        longer.len = 8192;
        let op = ReadOp { dst: &h, dst_offset: 0, src: &longer, src_offset: 4096, len: 1, imm: Some(2) };
        let got = reader.read(&op).unwrap().wait_timeout(WAIT);
        assert_eq!(got, Err(TransferError::Rejected(RejectReason::OutOfBounds)));
        // A deregistered source region.
        let gone = owner.alloc(4096).unwrap();
        let gone_d = gone.descriptor();
        drop(gone);
        let op = ReadOp { dst: &h, dst_offset: 0, src: &gone_d, src_offset: 0, len: 16, imm: None };
        assert_eq!(
            reader.read(&op).unwrap().wait_timeout(WAIT),
            Err(TransferError::Rejected(RejectReason::UnknownRegion))
        );
        assert!(dst.to_vec().iter().all(|&b| b == 0), "nothing placed");
        assert_eq!(reader.imm_counter(2).value(), 0, "no immediate counted");
        // Refused at submission: zero bytes, ranges outside either region, a foreign handle.
        let d = src.descriptor();
        for (dst_offset, src_offset, len) in [(0, 0, 0), (0, 4000, 200), (4000, 0, 200), (0, u64::MAX, 2)] {
            let op = ReadOp { dst: &h, dst_offset, src: &d, src_offset, len, imm: None };
            assert!(matches!(reader.read(&op), Err(SubmitError::Invalid(_))), "{dst_offset} {src_offset} {len}");
        }
        let foreign = src.handle();
        let op = ReadOp { dst: &foreign, dst_offset: 0, src: &d, src_offset: 0, len: 1, imm: None };
        assert!(matches!(reader.read(&op), Err(SubmitError::UnknownSource)));
    }
}

#[test]
fn a_read_from_an_owner_that_does_not_answer_fails_naming_it() {
    // The owner does not know the reader, so it can not answer: the reader's bound expires.
    let make = || Engine::builder().ignore_env().force_network(true).idle_timeout(Duration::from_millis(200)).build();
    let (owner, reader) = (make().unwrap(), make().unwrap());
    reader.add_peer(&owner.address()).unwrap();
    let (src, dst, _) = buffers(&owner, &reader, 4096, 1);
    let got = read_all(&reader, &dst, &src, None);
    assert!(
        matches!(got, Err(TransferError::NoReply { peer, .. }) if peer == owner.id().0),
        "{got:?} should name {:x}",
        owner.id().0
    );
    assert_eq!(owner.read_stats().refused, 1, "the owner ignored the request");
    assert_eq!(reader.read_stats().unanswered, 1);
}

#[test]
fn a_read_from_a_dropped_owner_fails_naming_it() {
    let make = || Engine::builder().ignore_env().force_network(true).idle_timeout(Duration::from_millis(200)).build();
    let (owner, reader) = pair_of(|| make().unwrap());
    let (src, dst, _) = buffers(&owner, &reader, 4096, 1);
    let owner_id = owner.id().0;
    let d = src.descriptor();
    drop(src);
    drop(owner);
    let h = dst.handle();
    let op = ReadOp { dst: &h, dst_offset: 0, src: &d, src_offset: 0, len: 4096, imm: None };
    let got = reader.read(&op).unwrap().wait_timeout(WAIT);
    assert!(matches!(got, Err(TransferError::NoReply { peer, .. }) if peer == owner_id), "{got:?}");
}

/// The owner's handler, fed the same request frame three times (as a resend after a connection
/// failure would): it writes once, ignores the duplicate while the write runs, and answers the
/// one after completion again without writing.
#[test]
fn a_duplicated_request_is_written_once_and_answered_again() {
    let (owner, reader) = pair_of(network_engine);
    let (src, dst, data) = buffers(&owner, &reader, 64 << 10, 4);
    let (d, h) = (src.descriptor(), dst.handle());
    let request = Request {
        src_region: d.region,
        src_key: d.key,
        src_offset: 0,
        dst_region: h.region.0,
        dst_key: dst.descriptor().key,
        dst_offset: 0,
        len: d.len,
        dst_device: false,
    };
    let frame = ReadMessage { from: reader.id(), req: 77, body: Body::Request(request) }.encode().unwrap();
    // A new request starts its write: handed back for the worker's lane (a small write over the
    // transport), or submitted by the engine itself.
    if let Some(write) = serve(&owner.shared, 0, &frame) {
        assert_eq!(write.source.len(), d.len, "the handed-back part is the data write");
        owner.shared.route(write, None);
    }
    assert!(serve(&owner.shared, 0, &frame).is_none(), "a duplicate in flight is ignored");
    let answered = |owner: &Engine| {
        let served = owner.shared.read.served.lock().unwrap();
        served.get(&reader.id()).and_then(|s| s.outcomes.get(&77).copied().flatten())
    };
    let deadline = Instant::now() + WAIT;
    while answered(&owner).is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(answered(&owner), Some(Outcome::Done));
    assert!(dst.to_vec() == data, "bytes differ");
    dst.write_at(0, &vec![0u8; data.len()]).unwrap();
    let again = serve(&owner.shared, 0, &frame).expect("a duplicate after completion is answered again");
    let mut reply = vec![0u8; CONTROL_MESSAGE_BYTES];
    assert!(again.source.read(0, &mut reply));
    assert_eq!(
        ReadMessage::decode(0, &reply),
        Ok(ReadMessage { from: owner.id(), req: 77, body: Body::Reply(Outcome::Done) })
    );
    let stats = owner.read_stats();
    assert_eq!((stats.requests_served, stats.duplicates), (1, 2));
    // Nothing was written again: the destination keeps the zeros written after the first write.
    // (The first write's reply reached the reader as a reply for no pending read: ignored.)
    assert!(dst.to_vec().iter().all(|&b| b == 0), "written twice");
}

/// A reader closed while its read waits for an owner that does not answer: the read ends at
/// once with `ShutDown` (its workers are gone: no reply and no expiry would ever end it).
#[test]
fn closing_the_reader_ends_its_unanswered_reads() {
    let make = || Engine::builder().ignore_env().force_network(true).idle_timeout(Duration::from_secs(30)).build();
    let (owner, reader) = (make().unwrap(), make().unwrap());
    reader.add_peer(&owner.address()).unwrap();
    let (src, dst, _) = buffers(&owner, &reader, 4096, 1);
    let (h, d) = (dst.handle(), src.descriptor());
    let op = ReadOp { dst: &h, dst_offset: 0, src: &d, src_offset: 0, len: 4096, imm: None };
    let transfer = reader.read(&op).unwrap();
    assert_eq!(transfer.wait_timeout(Duration::from_millis(100)), Err(TransferError::Timeout), "not answered");
    drop(dst);
    drop(reader);
    assert_eq!(transfer.wait_timeout(Duration::from_secs(5)), Err(TransferError::ShutDown));
}
