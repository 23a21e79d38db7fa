//! Round-trip time estimation (RFC 6298 smoothing), one estimator per path.

use core::time::Duration;

/// Smoothed RTT, variance and minimum of one path.
#[derive(Clone, Debug)]
pub struct RttEstimator {
    smoothed: Duration,
    variance: Duration,
    min: Duration,
    has_sample: bool,
}

impl RttEstimator {
    /// An estimator that reports `initial` until the first sample.
    pub fn new(initial: Duration) -> Self {
        RttEstimator { smoothed: initial, variance: initial / 2, min: initial, has_sample: false }
    }

    /// Folds in one sample (gain 1/8 for the mean, 1/4 for the variance).
    pub fn on_sample(&mut self, sample: Duration) {
        if !self.has_sample {
            self.smoothed = sample;
            self.variance = sample / 2;
            self.min = sample;
            self.has_sample = true;
            return;
        }
        self.min = self.min.min(sample);
        let diff = sample.abs_diff(self.smoothed);
        self.variance = (self.variance * 3 + diff) / 4;
        self.smoothed = (self.smoothed * 7 + sample) / 8;
    }

    pub fn smoothed(&self) -> Duration {
        self.smoothed
    }

    pub fn min(&self) -> Duration {
        self.min
    }

    pub fn has_sample(&self) -> bool {
        self.has_sample
    }

    /// Retransmission timeout before the floor and backoff: smoothed + 4 x variance.
    pub fn rto(&self) -> Duration {
        self.smoothed + self.variance * 4
    }
}
