use super::*;

#[test]
fn the_parser_reads_exactly_the_registered_knobs() {
    use accord_knobs::{check_reads, names_read_by, Component};
    let read = names_read_by(|lookup| {
        EngineConfig::default().with_overrides_from(|n| lookup(n)).expect("an empty environment parses");
    });
    check_reads(Component::Engine, &read).unwrap();
}

#[test]
fn every_listed_selector_word_parses() {
    accord_knobs::check_choices(accord_knobs::Component::Engine, |lookup| {
        EngineConfig::default().with_overrides_from(|n| lookup(n)).map(drop)
    })
    .unwrap();
}

fn parsed(vars: &[(&str, &str)]) -> Result<EngineConfig, String> {
    let vars: std::collections::HashMap<String, String> =
        vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    EngineConfig::default().with_overrides_from(|n| vars.get(n).cloned()).map_err(|e| e.to_string())
}

/// Values each kind of engine knob takes through `accord-knobs`' parsers, units included.
#[test]
fn knobs_take_units_and_words() {
    let c = parsed(&[
        ("ACCORD_SHARD_BYTES", "64K"),
        ("ACCORD_DEVICE_STAGING_CHUNK_BYTES", "2MiB"),
        ("ACCORD_IDLE_TIMEOUT_MS", "5s"),
        ("ACCORD_WAIT_SPIN_US", "1ms"),
        ("ACCORD_CMA", "true"),
        ("ACCORD_PIDFD", "off"),
        ("ACCORD_DEVICE_CONTEXT", "private"),
        ("ACCORD_ENGINE_DEBUG", "0"),
        ("ACCORD_NICS", "127.0.0.1, 127.0.0.2"),
    ])
    .unwrap();
    assert_eq!(c.shard_bytes_min, 64 << 10);
    assert_eq!(c.device_staging_chunk_bytes, 2 << 20);
    assert_eq!(c.idle_timeout, Duration::from_secs(5));
    assert_eq!(c.wait_spin, Duration::from_millis(1));
    assert!(c.cma && !c.pidfd);
    assert_eq!(c.device_context, DeviceContext::Private);
    assert!(c.debug_stats, "ACCORD_ENGINE_DEBUG counts when set, whatever its value");
    assert_eq!(c.nics.len(), 2);
    let plain = parsed(&[("ACCORD_SHARD_BYTES", "65536"), ("ACCORD_IDLE_TIMEOUT_MS", "5000"), ("ACCORD_CMA", "1")]);
    let plain = plain.unwrap();
    assert_eq!((plain.shard_bytes_min, plain.idle_timeout, plain.cma), (65536, Duration::from_secs(5), true));
    assert!(!EngineConfig::default().debug_stats);
}

/// A bad value is refused with the knob, the value and what it accepts.
#[test]
fn bad_values_name_the_knob_and_what_it_accepts() {
    let cases = [
        ("ACCORD_CMA", "2", "0, 1, true, false, on or off"),
        ("ACCORD_FORCE_NETWORK", "yes", "0, 1, true, false, on or off"),
        ("ACCORD_SHARD_BYTES", "64KB", "binary unit"),
        ("ACCORD_DATAGRAM_BYTES", "64K", "at most 65535"),
        ("ACCORD_IDLE_TIMEOUT_MS", "5 minutes", "milliseconds"),
        ("ACCORD_DEVICE_CONTEXT", "shared", "one of primary, private"),
        ("ACCORD_CC", "bbr", "one of cubic, swift, eqds, fixed"),
        ("ACCORD_LOSS", "2", "0..=1"),
        ("ACCORD_NICS", "127.0.0.1,nic0", "IP addresses"),
    ];
    for (knob, value, accepted) in cases {
        let e = parsed(&[(knob, value)]).unwrap_err();
        assert!(e.contains(&format!("{knob}={value:?}")) && e.contains(accepted), "{knob}={value}: {e}");
    }
}

/// The copy-stream spread of paged device writes: parsed, defaulted, and refused outside
/// 1..=DEVICE_COPY_STREAMS_MAX by `validate` with a message naming the range.
#[test]
fn device_copy_streams_parse_and_stay_in_range() {
    let c = parsed(&[("ACCORD_DEVICE_COPY_STREAMS", "8"), ("ACCORD_DEVICE_COPY_BATCH_2D", "on")]).unwrap();
    assert_eq!((c.device_copy_streams, c.device_copy_batch_2d), (8, true));
    // The defaults are the measured route: one stream a paged write, one call a 2D copy.
    let d = EngineConfig::default();
    assert_eq!((d.device_copy_streams, d.device_copy_batch_2d), (DEVICE_COPY_STREAMS_DEFAULT, false));
    assert_eq!(DEVICE_COPY_STREAMS_DEFAULT, 1);
    assert!(d.validate().is_ok());
    for bad in ["0", "17"] {
        let c = parsed(&[("ACCORD_DEVICE_COPY_STREAMS", bad)]).unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("device_copy_streams") && e.contains("1..=16"), "{bad}: {e}");
    }
}
