//! The store client: one TCP connection, one request at a time.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::wire::*;
use crate::error::StoreError;

/// Extra time the client socket waits beyond a request's own timeout before
/// it declares the server dead.
pub const REPLY_SLACK: Duration = Duration::from_secs(10);
/// Pause between connection attempts while the server is not up yet.
pub const CONNECT_RETRY: Duration = Duration::from_millis(50);

/// A connection to a [`super::StoreServer`].
pub struct StoreClient {
    stream: TcpStream,
    addr: SocketAddr,
}

impl StoreClient {
    /// Connects, retrying until `timeout` (the server may start after us), to a store that
    /// asks for no secret.
    pub fn connect(addr: impl ToSocketAddrs + std::fmt::Debug, timeout: Duration) -> Result<StoreClient, StoreError> {
        Self::connect_with_secret(addr, timeout, None)
    }

    /// Connects as [`StoreClient::connect`], answering the store's challenge with a proof of
    /// `secret` when it asks for one. A store that asks while we hold none refuses us.
    pub fn connect_with_secret(
        addr: impl ToSocketAddrs + std::fmt::Debug,
        timeout: Duration,
        secret: Option<accord_proto::JobSecret>,
    ) -> Result<StoreClient, StoreError> {
        let mut client = Self::connect_tcp(addr, timeout)?;
        client.answer_greeting(secret.as_ref())?;
        Ok(client)
    }

    /// Reads the server's greeting and proves the secret if challenged.
    fn answer_greeting(&mut self, secret: Option<&accord_proto::JobSecret>) -> Result<(), StoreError> {
        self.stream.set_read_timeout(Some(REPLY_SLACK)).map_err(|e| io("setting a socket timeout", e))?;
        let greeting = read_frame(&mut self.stream)?.ok_or_else(|| protocol("the store closed before greeting"))?;
        match greeting.split_first() {
            Some((&GREET_OPEN, [])) => Ok(()),
            Some((&GREET_CHALLENGE, nonce)) if nonce.len() == NONCE_BYTES => {
                let Some(secret) = secret else {
                    return Err(StoreError::Refused {
                        reason: "the store requires the job secret (set ACCORD_JOB_SECRET alike on every rank)".into(),
                    });
                };
                let proof = accord_proto::admission::challenge_proof(secret, CHALLENGE_LABEL, nonce);
                write_frame(&mut self.stream, &proof)?;
                let verdict =
                    read_frame(&mut self.stream)?.ok_or_else(|| protocol("the store closed the connection"))?;
                Self::check_status(&verdict).map(|_| ())
            }
            _ => Err(protocol("unexpected store greeting")),
        }
    }

    fn connect_tcp(addr: impl ToSocketAddrs + std::fmt::Debug, timeout: Duration) -> Result<StoreClient, StoreError> {
        let start = Instant::now();
        let mut last_error = String::from("no address");
        loop {
            match addr.to_socket_addrs() {
                Ok(addrs) => {
                    for a in addrs {
                        match TcpStream::connect_timeout(&a, Duration::from_millis(500)) {
                            // With no listener yet, a connect to a local port in the ephemeral
                            // range can pick that very port as its source and connect to
                            // itself (TCP simultaneous open): it would also keep rank 0 from
                            // binding. Drop such a socket and retry.
                            Ok(stream) if stream.local_addr().ok() == stream.peer_addr().ok() => {
                                last_error = "connected to itself (no store listening yet)".into();
                            }
                            Ok(stream) => {
                                let _ = stream.set_nodelay(true);
                                return Ok(StoreClient { stream, addr: a });
                            }
                            Err(e) => last_error = e.to_string(),
                        }
                    }
                }
                Err(e) => last_error = e.to_string(),
            }
            if start.elapsed() >= timeout {
                return Err(StoreError::Unreachable { addr: format!("{addr:?}"), waited: start.elapsed(), last_error });
            }
            std::thread::sleep(CONNECT_RETRY);
        }
    }

    /// The server's address.
    pub fn server_addr(&self) -> SocketAddr {
        self.addr
    }

    fn request(&mut self, payload: &[u8], wait: Duration) -> Result<Vec<u8>, StoreError> {
        self.stream.set_read_timeout(Some(wait + REPLY_SLACK)).map_err(|e| io("setting a socket timeout", e))?;
        write_frame(&mut self.stream, payload)?;
        read_frame(&mut self.stream)?.ok_or_else(|| protocol("the store closed the connection"))
    }

    fn check_status(reply: &[u8]) -> Result<(u8, Dec<'_>), StoreError> {
        let mut d = Dec::new(reply);
        let st = d.u8()?;
        if st == ST_ERROR {
            let msg = String::from_utf8_lossy(d.bytes(FRAME_BYTES_MAX)?).into_owned();
            return Err(StoreError::Refused { reason: msg });
        }
        Ok((st, d))
    }

    fn missing_keys(mut d: Dec<'_>) -> Result<Vec<String>, StoreError> {
        let n = d.u64()? as usize;
        if n > WAIT_KEYS_MAX {
            return Err(protocol("too many missing keys in reply"));
        }
        (0..n).map(|_| d.key()).collect()
    }

    /// Sets `key` to `value`.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let reply =
            self.request(&Enc::default().u8(OP_SET).bytes(key.as_bytes()).bytes(value).into_bytes(), Duration::ZERO)?;
        Self::check_status(&reply).map(|_| ())
    }

    /// Gets `key`, waiting up to `timeout` for it to be set.
    pub fn get(&mut self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        let req = Enc::default().u8(OP_GET).bytes(key.as_bytes()).u64(timeout.as_millis() as u64).into_bytes();
        let reply = self.request(&req, timeout)?;
        let (st, mut d) = Self::check_status(&reply)?;
        if st == ST_TIMEOUT {
            return Err(StoreError::KeyTimeout { keys: Self::missing_keys(d)?, waited: timeout });
        }
        Ok(d.bytes(VALUE_BYTES_MAX)?.to_vec())
    }

    /// Adds `delta` to the counter `key` (0 if absent) and returns the new value.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let reply = self
            .request(&Enc::default().u8(OP_ADD).bytes(key.as_bytes()).u64(delta as u64).into_bytes(), Duration::ZERO)?;
        let (_, mut d) = Self::check_status(&reply)?;
        Ok(d.u64()? as i64)
    }

    /// Waits until every key in `keys` is set; the error names the missing ones.
    pub fn wait(&mut self, keys: &[String], timeout: Duration) -> Result<(), StoreError> {
        let mut e = Enc::default().u8(OP_WAIT).u32(keys.len() as u32);
        for k in keys {
            e = e.bytes(k.as_bytes());
        }
        let reply = self.request(&e.u64(timeout.as_millis() as u64).into_bytes(), timeout)?;
        let (st, d) = Self::check_status(&reply)?;
        if st == ST_TIMEOUT {
            return Err(StoreError::KeyTimeout { keys: Self::missing_keys(d)?, waited: timeout });
        }
        Ok(())
    }
}
