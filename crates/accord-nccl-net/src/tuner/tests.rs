use super::*;
use std::collections::HashMap;

const ALGOS: usize = 7;
const PROTOS: usize = 3;

/// A cost table with every entry valid (cost = 10 + index).
fn table() -> Vec<f32> {
    (0..ALGOS * PROTOS).map(|i| 10.0 + i as f32).collect()
}

#[test]
fn small_collectives_and_single_node_comms_are_left_alone() {
    let p = TunerPolicy::default();
    let mut t = table();
    assert_eq!(p.decide(2, (128 << 10) - 1, &mut t, PROTOS), Decision::default());
    assert_eq!(t, table());
    assert_eq!(p.decide(1, 64 << 20, &mut t, PROTOS), Decision::default(), "one node: NVLink, not us");
    assert_eq!(t, table());
    let off = TunerPolicy { enabled: false, ..TunerPolicy::default() };
    assert_eq!(off.decide(2, 1 << 20, &mut t, PROTOS), Decision::default());
    assert_eq!(t, table());
}

#[test]
fn simple_only_and_channels_by_size() {
    let p = TunerPolicy::default();
    for (bytes, channels) in [
        (128u64 << 10, Some(1)),
        (1 << 20, Some(1)),
        (2 << 20, Some(1)),
        ((2 << 20) + 1, Some(2)),
        (4 << 20, Some(2)),
        (6 << 20, Some(3)),
        ((6 << 20) + 1, None),
        (8 << 20, None),
        (256 << 20, None),
    ] {
        let mut t = table();
        let d = p.decide(2, bytes, &mut t, PROTOS);
        assert!(d.simple_only, "{bytes}");
        assert_eq!(d.channels, channels, "{bytes} B");
        for (a, row) in t.chunks_exact(PROTOS).enumerate() {
            assert_eq!(row[PROTO_LL], COST_IGNORE, "algo {a} LL");
            assert_eq!(row[PROTO_LL128], COST_IGNORE, "algo {a} LL128");
            assert_eq!(row[PROTO_SIMPLE], 10.0 + (a * PROTOS + PROTO_SIMPLE) as f32, "Simple costs kept");
        }
    }
}

#[test]
fn a_table_without_simple_is_not_emptied() {
    let p = TunerPolicy::default();
    let mut t = table();
    for row in t.chunks_exact_mut(PROTOS) {
        row[PROTO_SIMPLE] = COST_IGNORE;
    }
    let before = t.clone();
    let d = p.decide(4, 1 << 20, &mut t, PROTOS);
    assert!(!d.simple_only);
    assert_eq!(t, before, "LL/LL128 stay: they are all NCCL has");
    // A table too narrow to have a Simple column is left alone.
    let mut narrow = vec![1.0f32; 4];
    assert_eq!(p.decide(4, 1 << 20, &mut narrow, 2), Decision::default());
}

#[test]
fn environment_overrides_and_bad_values() {
    let env = |pairs: &[(&str, &str)]| {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        TunerPolicy::from_lookup(move |n| m.get(n).cloned())
    };
    assert_eq!(env(&[]).unwrap(), TunerPolicy::default());
    let p = env(&[("ACCORD_TUNER", "0")]).unwrap();
    assert!(!p.enabled);
    let p = env(&[("ACCORD_TUNER_MIN_BYTES", "65536"), ("ACCORD_TUNER_CHANNEL_BYTES", "1048576")]).unwrap();
    assert_eq!((p.min_bytes, p.channel_bytes), (65536, 1 << 20));
    assert!(env(&[("ACCORD_TUNER_CHANNEL_BYTES", "0")]).is_err());
    assert!(env(&[("ACCORD_TUNER", "yes")]).is_err());
    assert!(env(&[("ACCORD_TUNER_LOG", "1")]).unwrap().log);
}

#[test]
fn a_channel_carries_no_more_than_one_nccl_buffer() {
    let env = |pairs: &[(&str, &str)]| {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        TunerPolicy::from_lookup(move |n| m.get(n).cloned()).unwrap()
    };
    assert_eq!(env(&[("NCCL_BUFFSIZE", "1048576")]).channel_bytes, 1 << 20, "a user's 1 MiB buffers");
    assert_eq!(
        env(&[("NCCL_BUFFSIZE", "8388608")]).channel_bytes,
        TUNER_CHANNEL_BYTES_DEFAULT,
        "never above the default"
    );
    assert_eq!(env(&[("NCCL_BUFFSIZE", "0")]).channel_bytes, TUNER_CHANNEL_BYTES_DEFAULT);
    assert_eq!(env(&[("NCCL_BUFFSIZE", "big")]).channel_bytes, TUNER_CHANNEL_BYTES_DEFAULT, "not a size");
    let both = env(&[("NCCL_BUFFSIZE", "1048576"), ("ACCORD_TUNER_CHANNEL_BYTES", "4194304")]);
    assert_eq!(both.channel_bytes, 4 << 20, "the knob said otherwise");
    // At 1 MiB one channel; at 4 MiB NCCL's own count.
    let p = env(&[("NCCL_BUFFSIZE", "1048576")]);
    let mut table = vec![1.0f32; 3];
    assert_eq!(p.decide(2, 1 << 20, &mut table, 3).channels, Some(1));
    assert_eq!(p.decide(2, 4 << 20, &mut table, 3).channels, None);
}
