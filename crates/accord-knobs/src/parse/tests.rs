//! Table-driven tests of every knob type: the values each accepts (and what they become) and
//! the values each refuses (and that the error names the knob, the value and what is accepted).

use super::*;
use std::collections::HashMap;

/// Reads `name` as a `T` from an environment holding only `name=raw`.
fn read<T: KnobValue>(name: &str, raw: &str) -> Result<Option<T>, KnobError> {
    let vars: HashMap<String, String> = [(name.to_string(), raw.to_string())].into();
    get(&|n| vars.get(n).cloned(), name)
}

fn refused<T: KnobValue + std::fmt::Debug>(name: &str, raw: &str, expected_mentions: &str) {
    match read::<T>(name, raw) {
        Err(e @ KnobError::Invalid { .. }) => {
            let text = e.to_string();
            assert!(text.contains(name), "{text}");
            assert!(text.contains(&format!("{raw:?}")), "{text}");
            assert!(text.contains(expected_mentions), "{name}={raw:?}: {text} should mention {expected_mentions:?}");
        }
        other => panic!("{name}={raw:?} should be refused, got {other:?}"),
    }
}

#[test]
fn switches() {
    let good = [("1", true), ("0", false), ("true", true), ("FALSE", false), (" on ", true), ("off", false)];
    for (raw, want) in good {
        assert_eq!(read::<bool>("ACCORD_CMA", raw), Ok(Some(want)), "{raw:?}");
    }
    for raw in ["2", "", "yes please", "01", "-1"] {
        refused::<bool>("ACCORD_CMA", raw, "0, 1, true, false, on or off");
    }
}

#[test]
fn counts() {
    let good: [(&str, u64); 4] = [("0", 0), ("4", 4), (" 17 ", 17), ("+3", 3)];
    for (raw, want) in good {
        assert_eq!(read::<u64>("ACCORD_PATHS", raw), Ok(Some(want)), "{raw:?}");
    }
    for raw in ["", "x", "-1", "1.5", "4K"] {
        refused::<u64>("ACCORD_PATHS", raw, "a whole number");
    }
    assert_eq!(read::<u16>("ACCORD_PATHS", "65535"), Ok(Some(65535)));
    refused::<u16>("ACCORD_PATHS", "65536", "at most 65535");
    assert_eq!(read::<i32>("ACCORD_NET_SPEED_MBPS", "-5"), Ok(Some(-5)), "the caller checks the sign");
    refused::<i32>("ACCORD_NET_SPEED_MBPS", "3000000000", "a whole number");
}

#[test]
fn byte_counts() {
    let good: [(&str, u64); 10] = [
        ("65536", 65536),
        ("0", 0),
        ("64K", 64 << 10),
        ("64k", 64 << 10),
        ("1M", 1 << 20),
        ("4MiB", 4 << 20),
        ("2 GiB", 2 << 30),
        ("1t", 1 << 40),
        ("+8", 8),
        (" 16K ", 16 << 10),
    ];
    for (raw, want) in good {
        assert_eq!(read::<u64>("ACCORD_SHARD_BYTES", raw), Ok(Some(want)), "{raw:?}");
        assert_eq!(parse_bytes(raw), Some(want), "{raw:?}");
    }
    for raw in ["", "K", "1.5M", "64KB", "1P", "-1", "18446744073709551615K"] {
        refused::<u64>("ACCORD_SHARD_BYTES", raw, "binary unit");
    }
    assert_eq!(read::<u32>("ACCORD_SHARD_BYTES", "3G"), Ok(Some(3 << 30)));
    refused::<u32>("ACCORD_SHARD_BYTES", "4G", "at most 4294967295");
}

#[test]
fn durations() {
    let ms: [(&str, Duration); 6] = [
        ("5000", Duration::from_millis(5000)),
        ("0", Duration::ZERO),
        ("5s", Duration::from_secs(5)),
        ("250ms", Duration::from_millis(250)),
        ("1500us", Duration::from_micros(1500)),
        (" 7 S ", Duration::from_secs(7)),
    ];
    for (raw, want) in ms {
        assert_eq!(read::<Duration>("ACCORD_IDLE_TIMEOUT_MS", raw), Ok(Some(want)), "{raw:?}");
    }
    assert_eq!(read::<Duration>("ACCORD_WAIT_SPIN_US", "300"), Ok(Some(Duration::from_micros(300))));
    assert_eq!(read::<Duration>("ACCORD_WAIT_SPIN_US", "2ms"), Ok(Some(Duration::from_millis(2))));
    for raw in ["", "x", "-1", "1.5s", "5m", "5 min"] {
        refused::<Duration>("ACCORD_IDLE_TIMEOUT_MS", raw, "a whole number of milliseconds");
    }
    refused::<Duration>("ACCORD_WAIT_SPIN_US", "x", "a whole number of microseconds");
    // A duration kept as a count of the knob's unit.
    assert_eq!(read::<u64>("ACCORD_IDLE_TIMEOUT_MS", "2s"), Ok(Some(2000)));
    assert_eq!(read::<u64>("ACCORD_WAIT_SPIN_US", "2ms"), Ok(Some(2000)));
    refused::<u64>("ACCORD_IDLE_TIMEOUT_MS", "1500us", "milliseconds");
    assert_eq!(parse_duration_ms("3s"), Some(Duration::from_secs(3)));
}

#[test]
fn rates_and_probabilities() {
    assert_eq!(read::<f64>("ACCORD_NIC_GBPS", "400"), Ok(Some(400.0)));
    assert_eq!(read::<f64>("ACCORD_NIC_GBPS", " 12.5 "), Ok(Some(12.5)));
    refused::<f64>("ACCORD_NIC_GBPS", "fast", "a number");
    for (raw, want) in [("0", 0.0), ("0.01", 0.01), ("1", 1.0)] {
        assert_eq!(read::<f64>("ACCORD_LOSS", raw), Ok(Some(want)), "{raw:?}");
    }
    for raw in ["1.5", "-0.1", "NaN", "lots"] {
        refused::<f64>("ACCORD_LOSS", raw, "a number in 0..=1");
    }
}

#[test]
fn text_and_paths_come_as_they_are() {
    assert_eq!(read::<String>("ACCORD_NICS", "10.0.0.1, 10.0.0.2"), Ok(Some("10.0.0.1, 10.0.0.2".to_string())));
    assert_eq!(read::<PathBuf>("ACCORD_SHM_DIR", "/tmp/x"), Ok(Some(PathBuf::from("/tmp/x"))));
    assert_eq!(read::<String>("ACCORD_ALGO_ALL_REDUCE", "ring"), Ok(Some("ring".to_string())), "a family member");
}

#[derive(Debug, PartialEq)]
enum Context {
    Primary,
    Private,
}

impl FromStr for Context {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "primary" => Ok(Context::Primary),
            "private" | "own" => Ok(Context::Private),
            _ => Err(()),
        }
    }
}

#[test]
fn selectors_parse_through_from_str_and_list_the_table_words() {
    let vars: HashMap<&str, &str> = [("ACCORD_DEVICE_CONTEXT", " own ")].into();
    let lookup = |n: &str| vars.get(n).map(|v| v.to_string());
    assert_eq!(choice::<Context>(&lookup, "ACCORD_DEVICE_CONTEXT"), Ok(Some(Context::Private)), "an alias, trimmed");
    assert_eq!(choice::<Context>(&|_| None, "ACCORD_DEVICE_CONTEXT"), Ok(None));
    assert_eq!(choice::<Context>(&|_| Some("primary".into()), "ACCORD_DEVICE_CONTEXT"), Ok(Some(Context::Primary)));
    let e = choice::<Context>(&|_| Some("shared".into()), "ACCORD_DEVICE_CONTEXT").unwrap_err().to_string();
    assert!(e.contains("ACCORD_DEVICE_CONTEXT=\"shared\"") && e.contains("one of primary, private"), "{e}");
}

#[test]
fn unset_is_none_and_set_is_seen() {
    assert_eq!(get::<u64>(&|_| None, "ACCORD_PATHS"), Ok(None));
    assert_eq!(is_set(&|_| Some("0".into()), "ACCORD_ENGINE_DEBUG"), Ok(true), "any value counts as set");
    assert_eq!(is_set(&|_| None, "ACCORD_ENGINE_DEBUG"), Ok(false));
}

/// A name the table lacks, or a knob read as a type its kind does not fit, is refused even when
/// unset, so a component's test that parses an empty environment catches it.
#[test]
fn unregistered_names_and_misread_kinds_are_errors_even_when_unset() {
    let unset = |_: &str| None;
    let e = get::<u64>(&unset, "ACCORD_NO_SUCH_KNOB").unwrap_err();
    assert_eq!(e, KnobError::Unregistered { name: "ACCORD_NO_SUCH_KNOB".into(), read_as: "u64" });
    assert!(e.to_string().contains("table.rs"), "{e}");
    assert!(get::<bool>(&unset, "ACCORD_PATHS").is_err(), "a count is not a switch");
    assert!(get::<Duration>(&unset, "ACCORD_SHARD_BYTES").is_err(), "bytes are not a duration");
    assert!(get::<PathBuf>(&unset, "ACCORD_NICS").is_err(), "a list is not a path");
    assert!(choice::<Context>(&unset, "ACCORD_PATHS").is_err(), "a count is not a selector");
    assert!(is_set(&unset, "ACCORD_NO_SUCH_KNOB").is_err());
    assert!(env_path("ACCORD_NO_SUCH_KNOB").is_err());
    assert!(env_path("ACCORD_PATHS").is_err(), "a count is not a path");
    assert!(get::<u64>(&unset, "ACCORD_ALGO_").is_err(), "a family needs a member name");
}

/// Every kind in the table can be read by some type (so no row is unreadable).
#[test]
fn every_registered_kind_has_a_reader() {
    for k in crate::KNOBS {
        let readable = bool::fits(k.kind) || u64::fits(k.kind) || f64::fits(k.kind) || String::fits(k.kind);
        assert!(readable, "{} has a kind no type reads", k.name);
    }
}
