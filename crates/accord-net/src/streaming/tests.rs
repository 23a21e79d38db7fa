use super::*;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(131) ^ (i >> 8)) as u8).collect()
}

#[test]
fn streaming_copies_equal_plain_ones_at_every_alignment_and_length() {
    let src = pattern(3 * STREAMING_COPY_MIN_BYTES + 300);
    for len in
        [0, 1, 63, 64, 65, STREAMING_COPY_MIN_BYTES - 1, STREAMING_COPY_MIN_BYTES, 2 * STREAMING_COPY_MIN_BYTES + 77]
    {
        for src_off in [0, 1, 15, 16, 33] {
            for dst_off in [0, 1, 7, 16, 63] {
                let mut dst = vec![0xeeu8; len + 128];
                // Safety: both ranges lie inside their vectors and the vectors are distinct.
                unsafe { copy_streaming(dst.as_mut_ptr().add(dst_off), src.as_ptr().add(src_off), len) };
                assert_eq!(
                    &dst[dst_off..dst_off + len],
                    &src[src_off..src_off + len],
                    "len {len} src +{src_off} dst +{dst_off}"
                );
                assert!(dst[..dst_off].iter().all(|&b| b == 0xee), "nothing before the destination");
                assert!(dst[dst_off + len..].iter().all(|&b| b == 0xee), "nothing after it");
            }
        }
    }
}

#[test]
fn the_count_grows_by_streamed_copies_only() {
    let src = pattern(2 * STREAMING_COPY_MIN_BYTES);
    let mut dst = vec![0u8; src.len()];
    // Other tests copy in parallel, so the count only ever grows by at least ours.
    let before = bytes_streamed();
    copy_into(&mut dst, &src);
    let after = bytes_streamed();
    if cfg!(target_arch = "x86_64") {
        assert!(after - before >= src.len() as u64, "a streamed copy is counted");
    } else {
        assert_eq!(after, before, "no streaming stores off x86-64");
    }
}
