use super::*;

#[test]
fn imm_round_trips_and_wraps_seq() {
    for (seq, step, sender) in
        [(0u64, 0u32, 0usize), (2047, STEP_P2P, 1023), (2048 + 5, 17, 6), (123_456, STEP_HANDSHAKE, 512)]
    {
        let imm = Imm::new(seq, step, sender);
        assert_eq!(Imm::decode(imm.encode()), imm);
        assert_eq!(imm.seq as u64, seq % 2048);
        assert_eq!(imm.sender as usize, sender);
    }
    assert_ne!(Imm::new(1, 0, 0).encode(), Imm::new(0, 1, 0).encode());
}

#[test]
fn desc_round_trips_and_rejects_garbage() {
    let d = RemoteBufDesc { rank: 3, len: 99, token: vec![1, 2, 3] };
    let mut v = Vec::new();
    d.encode_into(&mut v);
    v.push(42);
    let (back, rest) = RemoteBufDesc::decode(&v).unwrap();
    assert_eq!(back, d);
    assert_eq!(rest, &[42]);
    assert!(RemoteBufDesc::decode(&v[..5]).is_err());
    let mut bad = v.clone();
    bad[12] = 0xff;
    bad[13] = 0xff;
    assert!(RemoteBufDesc::decode(&bad).is_err());
}

#[test]
fn slices_check_bounds() {
    let b = LocalBuf::new(1, 10, RemoteBufDesc { rank: 0, len: 10, token: vec![] });
    assert!(b.slice(2, 8).check("x").is_ok());
    assert!(b.slice(3, 8).check("x").is_err());
    assert!(b.slice(usize::MAX, 2).check("x").is_err());
    assert_eq!(b.all().sub(2, 3).offset, 2);
}
