//! Typed reading of knobs: the one idiom every crate's config parser uses.
//!
//! Why here: each component used to parse its own variables its own way (`!= 0` in one,
//! `0|1|true|on` in another, a bare `parse` elsewhere), so the same kind of value was read
//! differently, and an error said "not valid" without saying what is. Here the table says how
//! a knob is read (its [`Kind`]), [`get`] parses a value by that kind, and a bad value becomes
//! a [`KnobError`] naming the knob, the value and what is accepted.
//!
//! A name the table lacks, or a knob read as a type its kind does not fit, is a bug in Accord,
//! not in the user's setting. [`get`] checks that before it looks the value up, so every
//! component's test that parses an empty environment fails on it; in a user's process it is an
//! error value like any other, never a panic.

use crate::{find, Kind, Knob};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// Why a knob could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KnobError {
    /// The value is not one the knob accepts.
    Invalid {
        /// The variable.
        knob: String,
        /// The value it holds.
        value: String,
        /// What the knob accepts.
        expected: String,
    },
    /// The code reads a name the table lacks, or reads a knob as a type its kind does not fit.
    Unregistered {
        /// The variable.
        name: String,
        /// The type the code reads it as.
        read_as: &'static str,
    },
}

impl std::fmt::Display for KnobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KnobError::Invalid { knob, value, expected } => {
                write!(f, "{knob}={value:?} is not valid: expected {expected}")
            }
            KnobError::Unregistered { name, read_as } => write!(
                f,
                "{name} is read as {read_as}, which crates/accord-knobs/src/table.rs does not register \
                 (a bug in Accord; unset {name} to work around it)"
            ),
        }
    }
}

impl std::error::Error for KnobError {}

/// A type a knob's value can be read as.
pub trait KnobValue: Sized {
    /// The type's name in an [`KnobError::Unregistered`].
    const READ_AS: &'static str;
    /// Whether a knob of `kind` may be read as this type.
    fn fits(kind: Kind) -> bool;
    /// Parses `raw` for a knob of `kind` (one [`KnobValue::fits`] accepts); the error says
    /// what is accepted.
    fn parse(kind: Kind, raw: &str) -> Result<Self, String>;
}

/// Reads knob `name` through `lookup` as a `T`: `Ok(None)` when unset, the value when it
/// parses by the knob's [`Kind`], else an error naming the knob, the value and what is
/// accepted. Checks the registration first, set or not (see the module's doc).
pub fn get<T: KnobValue>(lookup: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<Option<T>, KnobError> {
    let knob = registered(name, T::READ_AS, T::fits)?;
    match lookup(name) {
        None => Ok(None),
        Some(raw) => T::parse(knob.kind, &raw).map(Some).map_err(|expected| invalid(name, raw, expected)),
    }
}

/// [`get`] from the process environment.
pub fn env<T: KnobValue>(name: &str) -> Result<Option<T>, KnobError> {
    get(&|n| std::env::var(n).ok(), name)
}

/// Reads a selector (a knob of kind [`Kind::Choice`]) as the enum `T` through its `FromStr`
/// (which may take aliases and any case); a value it refuses is an error listing the table's
/// words.
pub fn choice<T: FromStr>(lookup: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<Option<T>, KnobError> {
    let knob = registered(name, "a choice", |k| matches!(k, Kind::Choice(_)))?;
    let words = match knob.kind {
        Kind::Choice(words) => words,
        _ => &[],
    };
    match lookup(name) {
        None => Ok(None),
        Some(raw) => match raw.trim().parse::<T>() {
            Ok(v) => Ok(Some(v)),
            Err(_) => Err(invalid(name, raw, format!("one of {}", words.join(", ")))),
        },
    }
}

/// Whether knob `name` is set at all, whatever its value (the knobs documented "set: ...").
pub fn is_set(lookup: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<bool, KnobError> {
    registered(name, "set or unset", |_| true)?;
    Ok(lookup(name).is_some())
}

/// Path knob `name` from the process environment as the OS holds it (it need not be UTF-8).
/// Checks the registration as [`get`] does.
pub fn env_path(name: &str) -> Result<Option<PathBuf>, KnobError> {
    registered(name, PathBuf::READ_AS, PathBuf::fits)?;
    Ok(std::env::var_os(name).map(PathBuf::from))
}

/// [`is_set`] in the process environment (a value that is not UTF-8 counts too).
pub fn env_is_set(name: &str) -> Result<bool, KnobError> {
    is_set(&|n| std::env::var_os(n).map(|_| String::new()), name)
}

fn registered(name: &str, read_as: &'static str, fits: impl Fn(Kind) -> bool) -> Result<&'static Knob, KnobError> {
    find(name).filter(|k| fits(k.kind)).ok_or_else(|| KnobError::Unregistered { name: name.to_string(), read_as })
}

fn invalid(knob: &str, value: String, expected: String) -> KnobError {
    KnobError::Invalid { knob: knob.to_string(), value, expected }
}

/// What [`parse_bool`] accepts.
pub const BOOL_WORDS: &str = "0, 1, true, false, on or off";

/// `0`/`1`, `true`/`false`, `on`/`off` (any case, surrounding blanks ignored).
pub fn parse_bool(raw: &str) -> Option<bool> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" => Some(true),
        "0" | "false" | "off" => Some(false),
        _ => None,
    }
}

/// What [`parse_bytes`] accepts.
pub const BYTES_WORDS: &str = "a byte count: a whole number, or one with a binary unit K, M, G or T \
                               (also KiB, MiB, GiB, TiB), e.g. 65536, 64K, 4MiB";

/// A byte count: digits, optionally followed by a binary unit (`K`/`KiB` = 1024, `M`/`MiB`,
/// `G`/`GiB`, `T`/`TiB`; any case). `None` for anything else or a count past `u64`.
pub fn parse_bytes(raw: &str) -> Option<u64> {
    let s = unsigned(raw);
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(digits);
    if number.is_empty() {
        return None;
    }
    let shift = match unit.trim_start().to_ascii_lowercase().as_str() {
        "" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        _ => return None,
    };
    number.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// `raw` without surrounding blanks and one leading `+` (which Rust's integer parsing, and so
/// these knobs before, accepted).
fn unsigned(raw: &str) -> &str {
    let s = raw.trim();
    s.strip_prefix('+').unwrap_or(s)
}

/// A duration: a whole number in `unit` (the knob's, [`Kind::Millis`] or [`Kind::Micros`]), or
/// one with its own unit `us`, `ms` or `s`. `None` for anything else.
pub fn parse_duration(raw: &str, unit: Kind) -> Option<Duration> {
    let s = unsigned(raw);
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits);
    let n: u64 = if number.is_empty() { None } else { number.parse().ok() }?;
    match (suffix.trim_start().to_ascii_lowercase().as_str(), unit) {
        ("", Kind::Millis) | ("ms", _) => Some(Duration::from_millis(n)),
        ("", Kind::Micros) | ("us", _) => Some(Duration::from_micros(n)),
        ("s", _) => n.checked_mul(1000).map(Duration::from_millis),
        _ => None,
    }
}

/// [`parse_duration`] for a knob in milliseconds.
pub fn parse_duration_ms(raw: &str) -> Option<Duration> {
    parse_duration(raw, Kind::Millis)
}

fn duration_words(unit: Kind) -> String {
    let bare = if unit == Kind::Micros { "microseconds" } else { "milliseconds" };
    format!("a duration: a whole number of {bare}, or one with a unit us, ms or s, e.g. 250, 5s")
}

/// A duration as a whole number of `unit` (for the fields kept as counts, `_ms: u64`).
fn duration_in_unit(raw: &str, unit: Kind) -> Option<u64> {
    let d = parse_duration(raw, unit)?;
    match unit {
        Kind::Micros => u64::try_from(d.as_micros()).ok(),
        _ if d.subsec_nanos() % 1_000_000 != 0 => None,
        _ => u64::try_from(d.as_millis()).ok(),
    }
}

impl KnobValue for bool {
    const READ_AS: &'static str = "a switch";
    fn fits(kind: Kind) -> bool {
        kind == Kind::Switch
    }
    fn parse(_: Kind, raw: &str) -> Result<bool, String> {
        parse_bool(raw).ok_or_else(|| BOOL_WORDS.to_string())
    }
}

macro_rules! whole_numbers {
    ($($t:ty),*) => {$(
        impl KnobValue for $t {
            const READ_AS: &'static str = stringify!($t);
            fn fits(kind: Kind) -> bool {
                matches!(kind, Kind::Count | Kind::Bytes | Kind::Millis | Kind::Micros | Kind::Gbps | Kind::Mbps)
            }
            fn parse(kind: Kind, raw: &str) -> Result<$t, String> {
                let (value, words) = match kind {
                    Kind::Bytes => (parse_bytes(raw), BYTES_WORDS.to_string()),
                    Kind::Millis | Kind::Micros => (duration_in_unit(raw, kind), duration_words(kind)),
                    _ => (raw.trim().parse::<u64>().ok(), "a whole number".to_string()),
                };
                let out_of_range = || format!("{words}, at most {}", <$t>::MAX);
                match value {
                    Some(v) => <$t>::try_from(v).map_err(|_| out_of_range()),
                    None => Err(words),
                }
            }
        }
    )*};
}
whole_numbers!(u8, u16, u32, u64, usize);

impl KnobValue for i32 {
    const READ_AS: &'static str = "i32";
    fn fits(kind: Kind) -> bool {
        matches!(kind, Kind::Count | Kind::Gbps | Kind::Mbps)
    }
    fn parse(_: Kind, raw: &str) -> Result<i32, String> {
        raw.trim().parse().map_err(|_| format!("a whole number in {}..={}", i32::MIN, i32::MAX))
    }
}

impl KnobValue for f64 {
    const READ_AS: &'static str = "f64";
    fn fits(kind: Kind) -> bool {
        matches!(kind, Kind::Gbps | Kind::Mbps | Kind::Probability)
    }
    fn parse(kind: Kind, raw: &str) -> Result<f64, String> {
        let v: Option<f64> = raw.trim().parse().ok();
        match kind {
            Kind::Probability => v.filter(|p| (0.0..=1.0).contains(p)).ok_or_else(|| "a number in 0..=1".into()),
            _ => v.ok_or_else(|| "a number".into()),
        }
    }
}

impl KnobValue for Duration {
    const READ_AS: &'static str = "a duration";
    fn fits(kind: Kind) -> bool {
        matches!(kind, Kind::Millis | Kind::Micros)
    }
    fn parse(kind: Kind, raw: &str) -> Result<Duration, String> {
        parse_duration(raw, kind).ok_or_else(|| duration_words(kind))
    }
}

/// The value as it is, untrimmed (a list, an address, a path, free text: the caller splits or
/// trims as the knob's doc says).
impl KnobValue for String {
    const READ_AS: &'static str = "text";
    fn fits(kind: Kind) -> bool {
        matches!(kind, Kind::Text | Kind::Path | Kind::List | Kind::Choice(_))
    }
    fn parse(_: Kind, raw: &str) -> Result<String, String> {
        Ok(raw.to_string())
    }
}

impl KnobValue for PathBuf {
    const READ_AS: &'static str = "a path";
    fn fits(kind: Kind) -> bool {
        kind == Kind::Path
    }
    fn parse(_: Kind, raw: &str) -> Result<PathBuf, String> {
        Ok(PathBuf::from(raw))
    }
}

#[cfg(test)]
mod tests;
