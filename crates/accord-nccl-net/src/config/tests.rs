use super::*;
use std::collections::HashMap;

fn config(vars: &[(&str, &str)]) -> Result<NetConfig, PluginError> {
    let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    NetConfig::from_lookup(|n| map.get(n).cloned(), |name| (name == "eth7").then(|| "10.0.0.7".parse().unwrap()))
}

#[test]
fn default_is_one_loopback_device() {
    let c = config(&[]).unwrap();
    assert_eq!(c.devices.len(), 1);
    assert!(c.devices[0].ip.is_loopback());
    assert_eq!(c.setup_timeout, SETUP_TIMEOUT_DEFAULT);
    assert_eq!(c.pieces_max, None, "pieces default to the engine's lane count");
}

#[test]
fn pieces_take_zero_for_engine_sharding_up_to_the_bound() {
    assert_eq!(config(&[("ACCORD_NET_PIECES", "0")]).unwrap().pieces_max, Some(0));
    assert_eq!(config(&[("ACCORD_NET_PIECES", "16")]).unwrap().pieces_max, Some(16));
}

#[test]
fn gpu_buffers_default_to_off_and_take_auto_on_off_and_a_pool_size() {
    let c = config(&[]).unwrap();
    assert_eq!((c.gpu_buffers, c.bounce_bytes), (GpuBuffers::Off, BOUNCE_BYTES_DEFAULT));
    assert_eq!(c.gdr_level, GdrLevel::Sys);
    assert_eq!(config(&[("ACCORD_NET_GDR_LEVEL", "off")]).unwrap().gdr_level, GdrLevel::Off);
    assert_eq!(config(&[("ACCORD_NET_GDR_LEVEL", "PHB")]).unwrap().gdr_level, GdrLevel::Phb);
    assert_eq!(config(&[("ACCORD_NET_GPU_BUFFERS", "auto")]).unwrap().gpu_buffers, GpuBuffers::Auto);
    assert_eq!(config(&[("ACCORD_NET_GPU_BUFFERS", "0")]).unwrap().gpu_buffers, GpuBuffers::Off);
    assert_eq!(config(&[("ACCORD_NET_GPU_BUFFERS", "1")]).unwrap().gpu_buffers, GpuBuffers::On);
    assert_eq!(config(&[("ACCORD_NET_BOUNCE_BYTES", "2097152")]).unwrap().bounce_bytes, 2 << 20);
}

#[test]
fn ifs_takes_addresses_and_interface_names() {
    let c = config(&[("ACCORD_NET_IFS", "127.0.0.1, eth7,127.0.0.2")]).unwrap();
    let ips: Vec<String> = c.devices.iter().map(|d| d.ip.to_string()).collect();
    assert_eq!(ips, ["127.0.0.1", "10.0.0.7", "127.0.0.2"]);
    assert_eq!(c.devices[1].interface.as_deref(), Some("eth7"));
}

#[test]
fn bad_values_are_errors_that_name_the_variable() {
    for vars in [
        [("ACCORD_NET_IFS", "nosuchif0")],
        [("ACCORD_NET_IFS", "127.0.0.1,127.0.0.1")],
        [("ACCORD_NET_IFS", ",")],
        [("ACCORD_NET_SPEED_MBPS", "-3")],
        [("ACCORD_NET_SETUP_TIMEOUT_MS", "soon")],
        [("ACCORD_NET_PIECES", "17")],
        [("ACCORD_NET_PIECES", "many")],
        [("ACCORD_NET_GPU_BUFFERS", "yes")],
        [("ACCORD_NET_GDR_LEVEL", "PXB")],
        [("ACCORD_NET_BOUNCE_BYTES", "4096")],
        [("ACCORD_NET_BOUNCE_BYTES", "lots")],
        [("ACCORD_NET_TRACE", "-1")],
    ] {
        let e = config(&vars).unwrap_err().to_string();
        assert!(e.contains(vars[0].0) || e.contains("ACCORD_NET_IFS"), "{e}");
    }
}

#[test]
fn speed_comes_from_sys_else_loopback_else_the_default() {
    let lo: IpAddr = "127.0.0.1".parse().unwrap();
    let nic: IpAddr = "10.0.0.7".parse().unwrap();
    let sys = |name: &str| (name == "eth7").then_some(200_000);
    assert_eq!(default_speed_mbps(nic, Some("eth7"), sys), 200_000, "the interface's own speed wins");
    assert_eq!(default_speed_mbps(nic, None, sys), SPEED_MBPS_DEFAULT);
    assert_eq!(default_speed_mbps(nic, Some("eth9"), sys), SPEED_MBPS_DEFAULT, "no /sys speed");
    assert_eq!(default_speed_mbps(lo, None, sys), LOOPBACK_SPEED_MBPS);
    assert_eq!(default_speed_mbps("::1".parse().unwrap(), Some("lo"), sys), LOOPBACK_SPEED_MBPS);
    const { assert!(LOOPBACK_SPEED_MBPS > SPEED_MBPS_DEFAULT) };
}

#[test]
fn the_parsers_read_exactly_the_registered_knobs() {
    use accord_knobs::{check_reads, names_read_by, Component};
    let plugin = names_read_by(|lookup| {
        NetConfig::from_lookup(|n| lookup(n), |_| None).expect("an empty environment parses");
    });
    check_reads(Component::Plugin, &plugin).unwrap();
    let tuner = names_read_by(|lookup| {
        crate::tuner::TunerPolicy::from_lookup(|n| lookup(n)).expect("an empty environment parses");
    });
    check_reads(Component::Tuner, &tuner).unwrap();
}

#[test]
fn every_listed_selector_word_parses() {
    use accord_knobs::{check_choices, Component};
    check_choices(Component::Plugin, |lookup| NetConfig::from_lookup(|n| lookup(n), |_| None).map(drop)).unwrap();
}

/// Units through `accord-knobs`, and the plugin's switches and ranges.
#[test]
fn knobs_take_units() {
    let c = config(&[("ACCORD_NET_BOUNCE_BYTES", "32M"), ("ACCORD_NET_SETUP_TIMEOUT_MS", "2s")]).unwrap();
    assert_eq!((c.bounce_bytes, c.setup_timeout), (32 << 20, Duration::from_secs(2)));
    assert_eq!(config(&[("ACCORD_NET_GPU_BUFFERS", "")]).unwrap().gpu_buffers, GpuBuffers::Off, "empty is 0");
    let e = config(&[("ACCORD_NET_GPU_BUFFERS", "on")]).unwrap_err().to_string();
    assert!(e.contains("ACCORD_NET_GPU_BUFFERS=\"on\"") && e.contains("one of 0, 1, auto"), "{e}");
    let e = config(&[("ACCORD_NET_PIECES", "17")]).unwrap_err().to_string();
    assert!(e.contains("ACCORD_NET_PIECES=17") && e.contains("0..=16"), "{e}");
    let tuner = |v: &str| crate::tuner::TunerPolicy::from_lookup(|n| (n == "ACCORD_TUNER").then(|| v.to_string()));
    assert!(!tuner("off").unwrap().enabled);
    let e = tuner("2").unwrap_err();
    assert!(e.contains("ACCORD_TUNER=\"2\"") && e.contains("0, 1"), "{e}");
}
