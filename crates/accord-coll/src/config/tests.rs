use super::*;

fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |k| map.get(k).cloned()
}

#[test]
fn defaults_without_env() {
    assert_eq!(CollConfig::from_lookup(|_| None).unwrap(), CollConfig::default());
}

#[test]
fn overrides_apply() {
    let c = CollConfig::from_lookup(lookup(&[
        ("ACCORD_COLL_TIMEOUT_MS", "1500"),
        ("ACCORD_ALGO_ALL_REDUCE", "ring"),
        ("ACCORD_ALGO_ALL_GATHER", "bruck"),
        ("ACCORD_COLL_SEGMENT_BYTES", "65536"),
        ("ACCORD_COLL_BLOCK_SEGMENTS_MAX", "16"),
    ]))
    .unwrap();
    assert_eq!(c.timeout, Duration::from_millis(1500));
    assert_eq!(c.segment_bytes, 65536);
    assert_eq!((c.block_segments_max, CollConfig::default().block_segments_max), (16, 0));
    assert_eq!(c.algo_overrides[&Collective::AllReduce], Algo::Ring);
    assert_eq!(c.algo_overrides[&Collective::AllGather], Algo::Bruck);
}

#[test]
fn bad_values_are_errors_that_name_the_variable() {
    let e = CollConfig::from_lookup(lookup(&[("ACCORD_COLL_TIMEOUT_MS", "soon")])).unwrap_err();
    assert!(e.to_string().contains("ACCORD_COLL_TIMEOUT_MS"));
    let e = CollConfig::from_lookup(lookup(&[("ACCORD_ALGO_ALL_REDUCE", "bruck")])).unwrap_err();
    assert!(matches!(e, ConfigError::UnknownAlgorithm { .. }), "{e}");
    assert!(e.to_string().contains("ring"), "{e}");
    assert!(CollConfig::from_lookup(lookup(&[("ACCORD_COLL_TIMEOUT_MS", "0")])).is_err());
    let e = CollConfig::from_lookup(lookup(&[("ACCORD_COLL_SEGMENT_BYTES", "0")])).unwrap_err();
    assert!(e.to_string().contains("ACCORD_COLL_SEGMENT_BYTES"), "{e}");
}

#[test]
fn the_parsers_read_exactly_the_registered_knobs() {
    use accord_knobs::{check_reads, names_read_by, Component};
    let coll = names_read_by(|lookup| {
        CollConfig::from_lookup(|n| lookup(n)).expect("an empty environment parses");
        // The bootstrap reads its own knob only once torchrun's variables are there.
        let torchrun = |n: &str| match n {
            "RANK" => Some("0".to_string()),
            "WORLD_SIZE" => Some("1".to_string()),
            "MASTER_ADDR" => Some("127.0.0.1".to_string()),
            "MASTER_PORT" => Some("29500".to_string()),
            _ => lookup(n),
        };
        crate::store::BootstrapConfig::from_lookup(torchrun).expect("torchrun's variables alone parse");
    });
    check_reads(Component::Collectives, &coll).unwrap();
    let gpu = names_read_by(|lookup| {
        crate::gpu::config::GpuConfig::from_lookup(|n| lookup(n)).expect("an empty environment parses");
    });
    check_reads(Component::GpuCollectives, &gpu).unwrap();
}

#[test]
fn every_listed_selector_word_parses() {
    use accord_knobs::{check_choices, Component};
    check_choices(Component::GpuCollectives, |lookup| {
        crate::gpu::config::GpuConfig::from_lookup(|n| lookup(n)).map(drop)
    })
    .unwrap();
    check_choices(Component::Collectives, |lookup| CollConfig::from_lookup(|n| lookup(n)).map(drop)).unwrap();
}

/// Units through `accord-knobs`: bytes with K/M/G, durations with s/ms; plain numbers as before.
#[test]
fn knobs_take_units() {
    let c = CollConfig::from_lookup(lookup(&[
        ("ACCORD_COLL_TIMEOUT_MS", "90s"),
        ("ACCORD_COLL_SEGMENT_BYTES", "64K"),
        ("ACCORD_COLL_SCRATCH_BYTES_MAX", "1G"),
        ("ACCORD_COLL_ABORT_GRACE_MS", "250"),
    ]))
    .unwrap();
    assert_eq!((c.timeout, c.abort_grace), (Duration::from_secs(90), Duration::from_millis(250)));
    assert_eq!((c.segment_bytes, c.scratch_bytes_max), (64 << 10, 1 << 30));
    let e = CollConfig::from_lookup(lookup(&[("ACCORD_COLL_TIMEOUT_MS", "0s")])).unwrap_err().to_string();
    assert!(e.contains("ACCORD_COLL_TIMEOUT_MS") && e.contains("at least 1"), "{e}");
    let e = CollConfig::from_lookup(lookup(&[("ACCORD_COLL_SEGMENT_BYTES", "64KB")])).unwrap_err().to_string();
    assert!(e.contains("ACCORD_COLL_SEGMENT_BYTES=\"64KB\"") && e.contains("binary unit"), "{e}");
    let gpu = |pairs: &[(&str, &str)]| crate::gpu::config::GpuConfig::from_lookup(lookup(pairs));
    let g = gpu(&[("ACCORD_GPU_SCRATCH_BYTES", "64M"), ("ACCORD_GPU_STREAM_ORDER", "STALL")]).unwrap();
    assert_eq!((g.scratch_bytes, g.stream_order), (64 << 20, crate::gpu::config::StreamOrder::Stall));
    let e = gpu(&[("ACCORD_GPU_STREAM_ORDER", "spin")]).unwrap_err().to_string();
    assert!(e.contains("ACCORD_GPU_STREAM_ORDER=\"spin\"") && e.contains("one of hostfn, stall"), "{e}");
    let e = gpu(&[("ACCORD_GPU_QUEUE_DEPTH", "0")]).unwrap_err().to_string();
    assert!(e.contains("ACCORD_GPU_QUEUE_DEPTH") && e.contains("1..="), "{e}");
}
