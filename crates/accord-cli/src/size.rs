//! The one size parser of every `accord` command (`bench -b/-e/-i`, `sim --bytes`, ...), so a
//! size that one command accepts means the same bytes in every other.
//!
//! Units follow GNU coreutils (`dd`, `numfmt --from=auto`): `K`, `M`, `G`, `T` and `KiB`..`TiB`
//! are powers of 1024 (as nccl-tests reads `-b 1M`); `KB`, `MB`, `GB`, `TB` are powers of 1000.
//! Case does not matter and a trailing `B` alone means bytes (`512B`).

/// Bytes `s` names: `4096`, `1K`, `1M`, `64MB` (64 000 000), `1GiB`, `512B`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "size {s:?}: unknown unit {unit:?} (use bytes, K/M/G/T or KiB/MiB/GiB/TiB for powers of 1024, \
                 KB/MB/GB/TB for powers of 1000)"
            ))
        }
    };
    if digits.is_empty() {
        return Err(format!("size {s:?} does not start with a whole number"));
    }
    let v: u64 = digits.parse().map_err(|_| format!("size {s:?} is too large"))?;
    v.checked_mul(mult).ok_or_else(|| format!("size {s:?} is too large"))
}

/// As [`parse_size`], refusing zero: for clap's `value_parser`.
pub fn parse_nonzero_size(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err(format!("size {s:?} must be at least 1 byte")),
        v => Ok(v),
    }
}

/// As [`parse_size`], for 32-bit fields (packet and chunk sizes).
pub fn parse_size_u32(s: &str) -> Result<u32, String> {
    u32::try_from(parse_size(s)?).map_err(|_| format!("size {s:?} must be below 4 GiB"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_and_decimal_units() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("512B"), Ok(512));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("64MB"), Ok(64_000_000));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2kb"), Ok(2000));
        assert_eq!(parse_size(" 3T "), Ok(3 << 40));
    }

    #[test]
    fn bad_sizes_are_errors_not_panics() {
        for bad in ["", "M", "1.5M", "-1", "1X", "1 M", "99999999999999999999", "18446744073709551615K"] {
            assert!(parse_size(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(parse_nonzero_size("0").is_err());
        assert_eq!(parse_size_u32("4K"), Ok(4096));
        assert!(parse_size_u32("4G").is_err());
        assert_eq!(parse_nonzero_size("0K").map_err(|_| ()), Err(()));
    }
}
