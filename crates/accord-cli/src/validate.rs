//! Checks of what the user typed, run before any work starts: each refusal is one line that
//! names the flag, the value and what would be accepted. Sizes that need memory are compared
//! with what this machine can give (available memory, the cgroup's limit, the address-space
//! limit), so an impossible run says so instead of being killed half way.

use std::fmt::Display;

/// `value` of flag `name` as a probability: within [0, 1]; NaN refused.
pub fn probability(name: &str, value: f64) -> Result<f64, String> {
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(format!("{name} {value} is not a probability: give a number from 0 to 1"))
    }
}

/// `value` of flag `name` as a packet loss rate for a run that must finish: a probability
/// below 1 (at 1 every packet is lost and nothing could complete).
pub fn loss_rate(name: &str, value: f64) -> Result<f64, String> {
    let p = probability(name, value)?;
    if p < 1.0 {
        Ok(p)
    } else {
        Err(format!("{name} {value} drops every packet, so nothing could complete: give less than 1"))
    }
}

/// `value` of flag `name`: finite and above zero.
pub fn positive(name: &str, value: f64) -> Result<f64, String> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(format!("{name} {value} must be a finite number above 0"))
    }
}

/// `value` of flag `name`: finite and not negative.
pub fn not_negative(name: &str, value: f64) -> Result<f64, String> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(format!("{name} {value} must be a finite number of at least 0"))
    }
}

/// `value` of flag `name` within `min..=max`.
pub fn within<T: PartialOrd + Display + Copy>(name: &str, value: T, min: T, max: T) -> Result<T, String> {
    if min <= value && value <= max {
        Ok(value)
    } else {
        Err(format!("{name} {value} is out of range: give {min}..={max}"))
    }
}

/// A comma-separated list of flag `name`: at least one entry, none empty.
pub fn list(name: &str, text: &str) -> Result<Vec<String>, String> {
    let items: Vec<String> = text.split(',').map(|s| s.trim().to_string()).collect();
    if items.iter().all(|s| s.is_empty()) {
        return Err(format!("{name} {text:?} names nothing: give at least one, comma separated"));
    }
    if items.iter().any(|s| s.is_empty()) {
        return Err(format!("{name} {text:?} has an empty entry: remove the extra comma"));
    }
    Ok(items)
}

/// Refuses a run estimated to need `needed` bytes when this machine has less to give;
/// `what` says what needs it (e.g. "--nodes 100000000").
pub fn fits_in_memory(what: &str, needed: u64, how: &str) -> Result<(), String> {
    match machine_memory() {
        Some((have, source)) if needed > have => Err(format!(
            "{what} needs about {} of memory ({how}); this machine has {} ({source}): ask for less",
            bytes(needed),
            bytes(have)
        )),
        _ => Ok(()),
    }
}

/// The memory this process can still use, and where that bound comes from: the least of
/// MemAvailable, the cgroup's room (memory.max - memory.current) and the address-space
/// limit (ulimit -v). None when none can be read.
pub fn machine_memory() -> Option<(u64, &'static str)> {
    let mut bounds: Vec<(u64, &'static str)> = vec![];
    if let Some(kb) = read("/proc/meminfo").and_then(|m| field(&m, "MemAvailable:")) {
        bounds.push((kb * 1024, "available memory"));
    }
    let max = read("/sys/fs/cgroup/memory.max").and_then(|s| s.trim().parse::<u64>().ok());
    let current = read("/sys/fs/cgroup/memory.current").and_then(|s| s.trim().parse::<u64>().ok());
    if let (Some(max), Some(current)) = (max, current) {
        bounds.push((max.saturating_sub(current), "room under the cgroup's memory.max"));
    }
    if let Some(limit) = read("/proc/self/limits").and_then(|l| address_space_limit(&l)) {
        bounds.push((limit, "the address-space limit, ulimit -v"));
    }
    bounds.into_iter().min_by_key(|b| b.0)
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The number after `name` in a `/proc/meminfo`-style text.
fn field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(name)).and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// The soft "Max address space" of `/proc/self/limits`, if limited.
fn address_space_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max address space"))?;
    line["Max address space".len()..].split_whitespace().next()?.parse().ok()
}

/// `n` bytes in the largest binary unit that keeps it at least 1.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probabilities_are_zero_to_one() {
        assert_eq!(probability("--loss", 0.0), Ok(0.0));
        assert_eq!(probability("--loss", 1.0), Ok(1.0));
        for bad in [-0.1, 1.0001, 2.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let e = probability("--loss", bad).unwrap_err();
            assert!(e.starts_with("--loss ") && e.contains("from 0 to 1"), "{e}");
        }
    }

    #[test]
    fn a_loss_rate_leaves_something_through() {
        assert_eq!(loss_rate("--loss", 0.5), Ok(0.5));
        assert!(loss_rate("--loss", 1.0).unwrap_err().contains("less than 1"));
        assert!(loss_rate("--loss", f64::NAN).unwrap_err().contains("not a probability"));
    }

    #[test]
    fn rates_and_durations() {
        assert!(positive("--gbps", 400.0).is_ok());
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(positive("--gbps", bad).unwrap_err().contains("--gbps"));
        }
        assert!(not_negative("--x", 0.0).is_ok());
        assert!(not_negative("--x", -0.5).is_err() && not_negative("--x", f64::NAN).is_err());
        assert_eq!(within("-n", 5u32, 1, 8), Ok(5));
        assert_eq!(within("-n", 0u32, 1, 8), Err("-n 0 is out of range: give 1..=8".into()));
    }

    #[test]
    fn lists_need_entries() {
        assert_eq!(list("--cc", "cubic, eqds"), Ok(vec!["cubic".to_string(), "eqds".to_string()]));
        assert!(list("--cc", "").unwrap_err().contains("names nothing"));
        assert!(list("--cc", " , ").unwrap_err().contains("names nothing"));
        assert!(list("--cc", "cubic,,eqds").unwrap_err().contains("empty entry"));
    }

    #[test]
    fn proc_texts_parse() {
        assert_eq!(field("MemTotal: 10 kB\nMemAvailable:   2048 kB\n", "MemAvailable:"), Some(2048));
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max address space         8589934592           unlimited            bytes\n";
        assert_eq!(address_space_limit(limits), Some(8 << 30));
        let unlimited = "Max address space         unlimited            unlimited            bytes\n";
        assert_eq!(address_space_limit(unlimited), None);
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
    }

    #[test]
    fn this_machine_has_some_memory_and_a_petabyte_does_not_fit() {
        let (have, source) = machine_memory().expect("/proc/meminfo is readable on Linux");
        assert!(have > 0 && !source.is_empty());
        let e = fits_in_memory("--nodes 1", 1 << 50, "a test").unwrap_err();
        assert!(e.contains("needs about 1024.0 TiB") && e.contains("this machine has"), "{e}");
        assert!(fits_in_memory("--nodes 1", 1, "a test").is_ok());
    }
}
