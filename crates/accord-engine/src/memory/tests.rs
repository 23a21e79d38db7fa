use super::*;

#[test]
fn check_write_refuses_wrong_key_bounds_and_unknown_regions() {
    let mut t = RegionTable::default();
    let alloc = Arc::new(Allocation::new(4096).unwrap());
    let key = RegionKey(42);
    let id = t
        .insert(Region { base: alloc.base(), len: 4096, key, keep: Some(alloc), device: None, streamed: false })
        .unwrap();
    assert_eq!(t.check_write(id, key, 0, 4096), Ok(()));
    assert_eq!(t.check_write(id, RegionKey(41), 0, 1), Err(RejectReason::BadKey));
    assert_eq!(t.check_write(id, key, 4000, 97), Err(RejectReason::OutOfBounds));
    assert_eq!(t.check_write(id, key, u64::MAX, 2), Err(RejectReason::OutOfBounds));
    assert!(!t.place(id, 4095, &[1, 2]), "out-of-bounds placement copies nothing");
    assert!(t.place(id, 4094, &[1, 2]));
    t.remove(id);
    assert_eq!(t.check_write(id, key, 0, 1), Err(RejectReason::UnknownRegion));
}

#[test]
fn source_reads_stay_in_range() {
    let s = Source::Bytes(Arc::from(&b"abcdef"[..]));
    let mut out = [0u8; 3];
    assert!(s.read(3, &mut out));
    assert_eq!(&out, b"def");
    assert!(!s.read(4, &mut out));
}
