//! One ordering of `tracing` levels for the bridges that forward engine events to a host's own
//! logger (the NCCL plugin to NCCL's, the Python package to `logging`), so both filter alike.

/// How verbose `level` is: 1 error, 2 warn, 3 info, 4 debug, 5 trace (0 is "nothing").
pub fn verbosity(level: &tracing::Level) -> u8 {
    match *level {
        tracing::Level::ERROR => 1,
        tracing::Level::WARN => 2,
        tracing::Level::INFO => 3,
        tracing::Level::DEBUG => 4,
        tracing::Level::TRACE => 5,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn error_is_least_verbose_and_trace_most() {
        use tracing::Level;
        let order = [Level::ERROR, Level::WARN, Level::INFO, Level::DEBUG, Level::TRACE];
        assert!(order.windows(2).all(|w| super::verbosity(&w[0]) < super::verbosity(&w[1])));
    }
}
