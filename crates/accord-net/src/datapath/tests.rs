use std::net::{Ipv4Addr, SocketAddr};

use super::*;

fn meta(len: usize) -> RxMeta {
    RxMeta {
        path: 0,
        src: SocketAddr::from((Ipv4Addr::LOCALHOST, 9)),
        len,
        segment_bytes: len,
        ecn_ce: false,
        local_channel: false,
    }
}

fn caps() -> DatapathCaps {
    DatapathCaps { max_payload_bytes: 1000, gso_max_segments: 8, gro: false, ecn: false, timestamps: false }
}

#[test]
fn rx_buffers_bounds_are_errors() {
    assert!(RxBuffers::new(0, 100).is_err());
    assert!(RxBuffers::new(RX_SLOTS_MAX + 1, 100).is_err());
    assert!(RxBuffers::new(1, 0).is_err());
    assert!(RxBuffers::new(1, RX_SLOT_BYTES_MAX + 1).is_err());
    let mut bufs = RxBuffers::new(2, 4).unwrap();
    assert!(bufs.push_copy(b"abcd", meta(0)));
    assert!(!bufs.push_copy(b"too long", meta(0)));
    assert!(bufs.push_copy(b"ef", meta(0)));
    assert!(!bufs.push_copy(b"g", meta(0)), "pool full");
    assert_eq!(bufs.get(1).unwrap().0, b"ef");
    assert!(bufs.get(2).is_none());
    assert!(bufs.get_mut(5).is_none());
    assert_eq!(bufs.segments(9).count(), 0);
}

#[test]
fn rx_buffers_retain_compacts_in_order() {
    let mut bufs = RxBuffers::new(4, 8).unwrap();
    for word in [&b"one"[..], b"two", b"three", b"four"] {
        assert!(bufs.push_copy(word, meta(0)));
    }
    bufs.retain(|bytes, _| bytes != b"two");
    let left: Vec<&[u8]> = bufs.iter().map(|(b, _)| b).collect();
    assert_eq!(left, vec![&b"one"[..], b"three", b"four"]);
    assert_eq!(bufs.free_slots_mut().count(), 1);
    bufs.clear();
    assert!(bufs.is_empty());
}

#[test]
fn rx_segments_split_at_stride() {
    let mut bufs = RxBuffers::new(1, 16).unwrap();
    let mut m = meta(0);
    m.segment_bytes = 4;
    assert!(bufs.push_copy(b"aaaabbbbcc", m));
    let segments: Vec<&[u8]> = bufs.segments(0).collect();
    assert_eq!(segments, vec![&b"aaaa"[..], b"bbbb", b"cc"]);
    assert_eq!(bufs.get(0).unwrap().1.segment_count(), 3);
}

#[test]
fn tx_segments_and_validation() {
    let dst = SocketAddr::from((Ipv4Addr::LOCALHOST, 9));
    let bytes = [1u8; 10];
    let d = TxDatagram { segment_bytes: Some(4), ..TxDatagram::new(0, dst, &bytes) };
    assert_eq!(d.segment_count(), 3);
    assert_eq!(d.segments().map(<[u8]>::len).collect::<Vec<_>>(), vec![4, 4, 2]);
    assert!(d.validate(&caps(), 1).is_ok());
    assert!(d.validate(&caps(), 0).is_err());
    let empty = TxDatagram::new(0, dst, &[]);
    assert_eq!((empty.segment_count(), empty.segments().count()), (1, 1));
    let zero = TxDatagram { segment_bytes: Some(0), ..d };
    assert_eq!(zero.segments().count(), 0);
    assert!(zero.validate(&caps(), 1).is_err());
    let big = vec![0u8; 1001];
    assert!(TxDatagram::new(0, dst, &big).validate(&caps(), 1).is_err());
}

#[test]
fn a_batch_starts_only_with_slots_large_enough_and_empty() {
    let mut bufs = RxBuffers::new(4, 100).unwrap();
    assert!(bufs.push_copy(b"old", meta(3)));
    assert!(matches!(bufs.start_batch(101, 8), Err(DatapathError::RxSlotTooSmall { slot_bytes: 100, required: 101 })));
    assert_eq!(bufs.len(), 1, "a refused batch leaves the slots alone");
    assert_eq!(bufs.start_batch(100, 8).unwrap(), 4, "at most the slot count");
    assert!(bufs.is_empty());
    assert_eq!(bufs.start_batch(64, 2).unwrap(), 2);
}
