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
    ]))
    .unwrap();
    assert_eq!(c.timeout, Duration::from_millis(1500));
    assert_eq!(c.segment_bytes, 65536);
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
        let _ = CollConfig::from_lookup(|n| lookup(n));
        // The bootstrap reads its own knob only once torchrun's variables are there.
        let torchrun = |n: &str| match n {
            "RANK" => Some("0".to_string()),
            "WORLD_SIZE" => Some("1".to_string()),
            "MASTER_ADDR" => Some("127.0.0.1".to_string()),
            "MASTER_PORT" => Some("29500".to_string()),
            _ => lookup(n),
        };
        let _ = crate::store::BootstrapConfig::from_lookup(torchrun);
    });
    check_reads(Component::Collectives, &coll).unwrap();
    let gpu = names_read_by(|lookup| {
        let _ = crate::gpu::config::GpuConfig::from_lookup(|n| lookup(n));
    });
    check_reads(Component::GpuCollectives, &gpu).unwrap();
}
