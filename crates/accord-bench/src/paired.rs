//! Paired ratios judged against a cost target: the median of per-pair ratios (B over A, each
//! pair measured back to back) and the interval between two order statistics that bounds the
//! true median with a stated coverage, assuming nothing about the noise's shape (the rank of
//! each bound comes from a binomial(n, 1/2)). The same method as
//! `scripts/telemetry_overhead_summary.py`'s `median_interval`, so a table printed here and one
//! that script prints from the same ratios agree.

/// Coverage an interval needs before it is judged (below it: too few pairs).
pub const CONFIDENCE: f64 = 0.90;
/// Most ratios [`median_interval`] takes: the binomial's probabilities stay in `f64`'s range.
pub const RATIOS_MAX: usize = 1000;

/// The median of what the ratios sample, bounded: `low..=high` holds it with probability at
/// least `coverage`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MedianInterval {
    /// The sample median (the mean of the two middle values for an even count).
    pub median: f64,
    /// Lower bound: the k-th smallest ratio.
    pub low: f64,
    /// Upper bound: the k-th largest ratio.
    pub high: f64,
    /// Probability that `low..=high` holds the true median.
    pub coverage: f64,
}

/// The widest-ranked order statistics whose interval still covers the median with at least
/// [`CONFIDENCE`]: rank k is the largest with P(B < k) * 2 <= 1 - CONFIDENCE, B ~ binomial(n,
/// 1/2), at most n / 2. With too few ratios for that, the min and the max, with their own
/// (lower) coverage. `None` without ratios, with more than [`RATIOS_MAX`], or with one that is
/// not finite.
pub fn median_interval(ratios: &[f64]) -> Option<MedianInterval> {
    let n = ratios.len();
    if n == 0 || n > RATIOS_MAX || ratios.iter().any(|r| !r.is_finite()) {
        return None;
    }
    let mut xs = ratios.to_vec();
    xs.sort_by(f64::total_cmp);
    // below[k] = P(B < k), from the binomial's probabilities built up one term at a time.
    let mut below = Vec::with_capacity(n / 2 + 2);
    let mut pmf = 0.5f64.powi(n as i32);
    let mut sum = 0.0;
    below.push(0.0);
    for i in 0..=n / 2 {
        sum += pmf;
        below.push(sum);
        pmf *= (n - i) as f64 / (i + 1) as f64;
    }
    let mut k = 1;
    while k < n / 2 && 2.0 * below[k + 1] <= 1.0 - CONFIDENCE {
        k += 1;
    }
    Some(MedianInterval { median: median(&xs), low: xs[k - 1], high: xs[n - k], coverage: 1.0 - 2.0 * below[k] })
}

/// The median of `xs` (the mean of the two middle values for an even count; NaN for none).
pub fn median(xs: &[f64]) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

/// What an interval of B/A ratios says about a cost target (B at least `target` times A).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The whole interval is at or above the target.
    Met,
    /// The whole interval is below the target.
    Missed,
    /// The interval straddles the target: more pairs, or less noise, are needed.
    Unresolved,
    /// The interval's coverage is below [`CONFIDENCE`].
    TooFewPairs,
}

impl Verdict {
    /// Judges `i` against `target` (0.97: a cost under 3%).
    pub fn of(i: &MedianInterval, target: f64) -> Verdict {
        if i.coverage < CONFIDENCE {
            Verdict::TooFewPairs
        } else if i.low >= target {
            Verdict::Met
        } else if i.high < target {
            Verdict::Missed
        } else {
            Verdict::Unresolved
        }
    }

    /// The word the tables print (the summary script's words).
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::Missed => "missed",
            Verdict::Unresolved => "unresolved",
            Verdict::TooFewPairs => "too few pairs",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(n: usize) -> Vec<f64> {
        // Shuffled on purpose: the function sorts.
        let mut xs: Vec<f64> = (0..n).map(|i| 1.0 + i as f64 * 0.01).collect();
        xs.reverse();
        xs.swap(0, n / 2);
        xs
    }

    /// The bounds and coverages `scripts/telemetry_overhead_summary.py`'s `median_interval`
    /// gives for the same ramps (`python3 -c 'import telemetry_overhead_summary as t;
    /// print(t.median_interval([1 + i * 0.01 for i in range(n)]))'` in scripts/).
    #[test]
    fn the_interval_matches_the_summary_script() {
        let cases = [
            (5, 1.00, 1.04, 0.9375),
            (6, 1.00, 1.05, 0.96875),
            (20, 1.05, 1.14, 0.9586105346679688),
            (40, 1.14, 1.25, 0.9193095322480076),
            (100, 1.41, 1.58, 0.9113739198859324),
        ];
        for (n, low, high, coverage) in cases {
            let i = median_interval(&ramp(n)).unwrap();
            assert!((i.low - low).abs() < 1e-9 && (i.high - high).abs() < 1e-9, "n={n}: {i:?}");
            assert!((i.coverage - coverage).abs() < 1e-12, "n={n}: {i:?}");
        }
        let three = median_interval(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((three.median, three.low, three.high, three.coverage), (2.0, 1.0, 3.0, 0.75));
        assert_eq!(median_interval(&[1.0, 4.0]).unwrap().median, 2.5);
    }

    #[test]
    fn no_interval_without_ratios_with_too_many_or_with_one_not_finite() {
        assert_eq!(median_interval(&[]), None);
        assert_eq!(median_interval(&vec![1.0; RATIOS_MAX + 1]), None);
        assert_eq!(median_interval(&[1.0, f64::NAN, 1.0]), None);
        assert_eq!(median_interval(&[1.0, f64::INFINITY]), None);
        assert!(median_interval(&vec![1.0; RATIOS_MAX]).is_some_and(|i| i.coverage > CONFIDENCE));
    }

    #[test]
    fn the_verdict_reads_the_whole_interval_against_the_target() {
        let at = |low, high, coverage| MedianInterval { median: (low + high) / 2.0, low, high, coverage };
        assert_eq!(Verdict::of(&at(0.98, 1.02, 0.95), 0.97), Verdict::Met);
        assert_eq!(Verdict::of(&at(0.97, 1.02, 0.95), 0.97), Verdict::Met);
        assert_eq!(Verdict::of(&at(0.90, 0.96, 0.95), 0.97), Verdict::Missed);
        assert_eq!(Verdict::of(&at(0.95, 1.01, 0.95), 0.97), Verdict::Unresolved);
        assert_eq!(Verdict::of(&at(0.99, 1.01, 0.75), 0.97), Verdict::TooFewPairs);
        assert_eq!(Verdict::TooFewPairs.word(), "too few pairs");
    }
}
