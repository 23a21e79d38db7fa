//! The job secret every rank's engine proves in its handshakes (`accord_proto::admission`) and
//! the bootstrap store asks of its clients: one per job, handed to the ranks in their
//! environment, which only processes of the same user can read.

/// The variable the ranks read the secret from.
pub(crate) const JOB_SECRET_ENV: &str = "ACCORD_JOB_SECRET";

/// The secret the ranks share: the caller's `ACCORD_JOB_SECRET` if set (a job spread over
/// several launchers), else 32 fresh bytes from the OS.
pub(crate) fn job_secret() -> Result<String, String> {
    if let Some(given) = accord_knobs::env::<String>(JOB_SECRET_ENV).map_err(|e| e.to_string())? {
        return accord_proto::JobSecret::from_hex(&given)
            .map(|s| s.to_hex())
            .ok_or_else(|| format!("{JOB_SECRET_ENV} must be 64 hex digits (32 bytes)"));
    }
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(|e| format!("could not read a job secret from /dev/urandom: {e}"))?;
    Ok(accord_proto::JobSecret(bytes).to_hex())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each launch draws a fresh secret of 32 bytes (unless the caller gave one).
    #[test]
    fn each_job_gets_a_fresh_secret() {
        if std::env::var_os(JOB_SECRET_ENV).is_some() {
            return; // the caller chose the secret; nothing to draw
        }
        let (a, b) = (job_secret().unwrap(), job_secret().unwrap());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert!(accord_proto::JobSecret::from_hex(&a).is_some());
    }
}
