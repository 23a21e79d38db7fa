use super::wire::{is_pull_message, Body, Outcome, PullMessage};
use crate::address::EngineId;
use accord_proto::wire::RejectReason;

#[test]
fn messages_round_trip_and_garbage_is_an_error() {
    let bodies = [
        Body::Hello { id_addr: 0x7fff_0000_1234 },
        Body::Pull { src_addr: 1 << 40, len: 1 << 20, region: 7, key: 0xdead_beef, offset: 4096, imm: Some(9) },
        Body::Pull { src_addr: 8, len: 65536, region: u32::MAX, key: 1, offset: 0, imm: None },
        Body::Reply { outcome: Outcome::Done },
        Body::Reply { outcome: Outcome::Unavailable },
        Body::Reply { outcome: Outcome::Refused(RejectReason::BadKey) },
        Body::Reply { outcome: Outcome::Refused(RejectReason::Other(77)) },
    ];
    for body in bodies {
        let m = PullMessage { from: EngineId(42), req: 99, body };
        let bytes = m.encode();
        assert!(is_pull_message(&bytes));
        assert_eq!(PullMessage::decode(0, &bytes), Ok(m));
        assert!(PullMessage::decode(64, &bytes).is_err(), "only at offset 0");
        assert!(PullMessage::decode(0, &bytes[..63]).is_err(), "only whole messages");
        for i in [0usize, 4, 5, 6, 7] {
            let mut bad = bytes;
            bad[i] ^= 0xff;
            assert!(PullMessage::decode(0, &bad).is_err(), "byte {i} flipped must not decode");
        }
    }
    let landing = crate::engine::route::landing::wire::Control {
        from: EngineId(1),
        req: 2,
        body: crate::engine::route::landing::wire::Body::Done,
    };
    assert!(!is_pull_message(&landing.encode()), "landing messages are not ours");
}

#[test]
fn served_pulls_are_remembered_and_bounded() {
    let mut served = super::ServedPulls::default();
    assert!(served.first_time(7));
    assert!(!served.first_time(7), "a resent pull is a duplicate");
    for req in 100..100 + super::CMA_SERVED_REMEMBERED as u64 {
        assert!(served.first_time(req));
    }
    assert_eq!(served.ids.len(), super::CMA_SERVED_REMEMBERED);
    assert!(served.first_time(7), "the oldest id was forgotten once the bound was reached");
}
