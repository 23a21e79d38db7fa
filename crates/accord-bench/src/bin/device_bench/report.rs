//! nccl-tests-style tables on stdout (header lines start with `#`) and one JSON object per
//! row, so a script can keep the JSON lines (`grep '^{'`) and a person can read the rest.

/// The median of `values` (0 when empty).
pub fn median(values: &[f64]) -> f64 {
    percentile(values, 0.5)
}

/// The `q` quantile (0..=1) of `values`, nearest rank (0 when empty).
pub fn percentile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let index = ((sorted.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
    sorted[index]
}

/// GB/s of `bytes` moved in `seconds` (0 for no time).
pub fn gbps(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / seconds / 1e9
    } else {
        0.0
    }
}

/// Prints a table's title and column names.
pub fn header(title: &str, columns: &[(&str, usize)]) {
    println!("#");
    println!("# {title}");
    let line: Vec<String> = columns.iter().map(|(name, width)| format!("{name:>width$}")).collect();
    println!("#{}", line.join(" "));
}

/// Prints one row of cells right-aligned to the widths of `header`'s columns.
pub fn row(cells: &[(String, usize)]) {
    let line: Vec<String> = cells.iter().map(|(cell, width)| format!("{cell:>width$}")).collect();
    println!(" {}", line.join(" "));
}

/// A JSON string literal of `text`.
pub fn json_string(text: &str) -> String {
    serde_json::Value::String(text.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_rates() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0, 5.0], 1.0), 5.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.0), 1.0);
        assert_eq!(gbps(2_000_000_000, 2.0), 1.0);
        assert_eq!(gbps(1, 0.0), 0.0);
        assert_eq!(json_string("a\"b"), "\"a\\\"b\"");
    }
}
