use std::time::Duration;

use super::*;

#[test]
fn delivers_to_the_same_path_and_splits_segments() {
    let net = MemNetwork::new();
    let mut a = net.endpoint(3, 16).unwrap();
    let mut b = net.endpoint(3, 16).unwrap();
    let bytes = b"aaabbbc";
    let d = TxDatagram { segment_bytes: Some(3), ..TxDatagram::new(2, b.local_addr(2).unwrap(), bytes) };
    assert_eq!(a.send_batch(&[d]).unwrap(), 1);
    assert!(b.wait_readable(Duration::from_millis(1)).unwrap());
    let mut bufs = b.alloc_rx_buffers(8).unwrap();
    assert_eq!(b.recv_batch(&mut bufs, 8).unwrap(), 3);
    let got: Vec<(&[u8], u16)> = bufs.iter().map(|(x, m)| (x, m.path)).collect();
    assert_eq!(got, vec![(&b"aaa"[..], 2), (&b"bbb"[..], 2), (&b"c"[..], 2)]);
    assert_eq!(bufs.get(0).unwrap().1.src, a.local_addr(2).unwrap());
}

#[test]
fn full_queue_and_unknown_destination_drop() {
    let net = MemNetwork::new();
    let mut a = net.endpoint(1, 4).unwrap();
    let b = net.endpoint(1, 2).unwrap();
    let dst = b.local_addr(0).unwrap();
    let batch = vec![TxDatagram::new(0, dst, b"x"); 5];
    assert_eq!(a.send_batch(&batch).unwrap(), 5);
    assert_eq!(b.queued_packets(), 2);
    let nowhere = TxDatagram::new(0, "10.9.9.9:1".parse().unwrap(), b"x");
    a.send_batch(&[nowhere]).unwrap();
    assert_eq!(net.stats().dropped_queue_full.load(Ordering::Relaxed), 3);
    assert_eq!(net.stats().dropped_unroutable.load(Ordering::Relaxed), 1);
    assert!(net.endpoint(0, 1).is_err());
    assert!(net.endpoint(1, 0).is_err());
    drop(b);
    a.send_batch(&batch[..1]).unwrap();
    assert_eq!(net.stats().dropped_unroutable.load(Ordering::Relaxed), 2);
}

#[test]
fn wait_readable_times_out_when_idle() {
    let net = MemNetwork::new();
    let mut a = net.endpoint(1, 4).unwrap();
    assert!(!a.wait_readable(Duration::from_millis(5)).unwrap());
}
