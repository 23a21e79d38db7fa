use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::clock::ManualClock;
use crate::mem::MemNetwork;

#[test]
fn counts_per_path_and_records_headers() {
    let net = MemNetwork::new();
    let clock = ManualClock::new();
    let config = TraceConfig { records_max: 3, keep: TraceKeep::First };
    let mut a = TracingDatapath::with_clock(net.endpoint(2, 64).unwrap(), config, Arc::new(clock.clone())).unwrap();
    let mut b = TracingDatapath::new(net.endpoint(2, 64).unwrap(), TraceConfig::default()).unwrap();
    let long = [9u8; 100];
    let segmented = TxDatagram { segment_bytes: Some(40), ..TxDatagram::new(1, b.local_addr(1).unwrap(), &long) };
    clock.advance(Duration::from_millis(2));
    a.send_batch(&[TxDatagram::new(0, b.local_addr(0).unwrap(), b"hello"), segmented]).unwrap();
    clock.advance(Duration::from_millis(1));
    a.send_batch(&[TxDatagram::new(0, b.local_addr(0).unwrap(), b"again")]).unwrap();
    a.send_batch(&[TxDatagram::new(0, b.local_addr(0).unwrap(), b"not recorded")]).unwrap();

    let counters = a.counters();
    assert_eq!(counters.path(0).unwrap().tx_packets, 3);
    assert_eq!(counters.path(0).unwrap().tx_bytes, 5 + 5 + 12);
    assert_eq!(counters.path(1).unwrap(), PathCounters { tx_packets: 3, tx_bytes: 100, ..Default::default() });
    assert!(counters.path(2).is_none());

    let records: Vec<TraceRecord> = a.records().copied().collect();
    assert_eq!(records.len(), 3, "first N only");
    assert_eq!(records[0].header_bytes(), b"hello");
    assert_eq!(records[0].at, Duration::from_millis(2));
    assert_eq!((records[1].len, records[1].segment_bytes), (100, 40));
    assert_eq!(records[1].header_bytes(), &long[..TRACE_HEADER_BYTES]);
    assert_eq!(records[2].at, Duration::from_millis(3));

    let mut bufs = b.alloc_rx_buffers(16).unwrap();
    assert_eq!(b.recv_batch(&mut bufs, 16).unwrap(), 6);
    let total = b.counters().total();
    assert_eq!((total.rx_packets, total.rx_bytes), (6, 122));
    assert!(b.records().all(|r| r.direction == Direction::Rx));
    assert_eq!(b.take_records().len(), 6);
    assert_eq!(b.records().count(), 0);
}

#[test]
fn latest_mode_keeps_the_tail_and_bound_is_checked() {
    let net = MemNetwork::new();
    let config = TraceConfig { records_max: 2, keep: TraceKeep::Latest };
    let mut a = TracingDatapath::new(net.endpoint(1, 64).unwrap(), config).unwrap();
    let b = net.endpoint(1, 64).unwrap();
    for word in [&b"one"[..], b"two", b"three"] {
        a.send_batch(&[TxDatagram::new(0, b.local_addr(0).unwrap(), word)]).unwrap();
    }
    let kept: Vec<&[u8]> = a.records().map(TraceRecord::header_bytes).collect();
    assert_eq!(kept, vec![&b"two"[..], b"three"]);
    let too_many = TraceConfig { records_max: TRACE_RECORDS_MAX + 1, keep: TraceKeep::Latest };
    assert!(TracingDatapath::new(net.endpoint(1, 1).unwrap(), too_many).is_err());
}
