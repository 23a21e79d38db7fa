//! Framing and encoding of store requests and replies.

use std::io::{Read, Write};

use crate::error::StoreError;

/// Largest frame payload.
pub const FRAME_BYTES_MAX: usize = VALUE_BYTES_MAX + 64 * 1024;
/// Largest key.
pub const KEY_BYTES_MAX: usize = 1024;
/// Largest value.
pub const VALUE_BYTES_MAX: usize = 16 << 20;
/// Most keys one `wait` may name.
pub const WAIT_KEYS_MAX: usize = 4096;
/// Most keys the store holds.
pub const KEYS_MAX: usize = 1 << 20;

pub(crate) const OP_SET: u8 = 1;
pub(crate) const OP_GET: u8 = 2;
pub(crate) const OP_ADD: u8 = 3;
pub(crate) const OP_WAIT: u8 = 4;

/// First frame the server sends on every connection: no admission, or a challenge (a 16-byte
/// nonce) the client must answer with [`CHALLENGE_LABEL`]'s proof under the job secret.
pub(crate) const GREET_OPEN: u8 = 0;
pub(crate) const GREET_CHALLENGE: u8 = 1;
/// Domain label of the store's challenge proof (never valid as a transport handshake proof).
pub(crate) const CHALLENGE_LABEL: &[u8] = b"accord bootstrap store v1";
/// Bytes of the server's nonce.
pub(crate) const NONCE_BYTES: usize = 16;

pub(crate) const ST_OK: u8 = 0;
pub(crate) const ST_TIMEOUT: u8 = 1;
pub(crate) const ST_ERROR: u8 = 2;

pub(crate) fn protocol(reason: impl Into<String>) -> StoreError {
    StoreError::Protocol { reason: reason.into() }
}

pub(crate) fn io(context: &str, source: std::io::Error) -> StoreError {
    StoreError::Io { context: context.to_string(), source }
}

/// Writes one frame.
pub(crate) fn write_frame(w: &mut impl Write, payload: &[u8]) -> Result<(), StoreError> {
    if payload.len() > FRAME_BYTES_MAX {
        return Err(protocol(format!("frame of {} bytes exceeds {FRAME_BYTES_MAX}", payload.len())));
    }
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(payload);
    w.write_all(&buf).map_err(|e| io("writing a store frame", e))
}

/// Reads one frame; `Ok(None)` on a clean end of stream.
pub(crate) fn read_frame(r: &mut impl Read) -> Result<Option<Vec<u8>>, StoreError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(io("reading a store frame", e)),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > FRAME_BYTES_MAX {
        return Err(protocol(format!("frame of {len} bytes exceeds {FRAME_BYTES_MAX}")));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).map_err(|e| io("reading a store frame body", e))?;
    Ok(Some(buf))
}

/// Appends fields to a payload.
#[derive(Default)]
pub(crate) struct Enc(pub Vec<u8>);

impl Enc {
    pub fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(&(v.len() as u32).to_le_bytes());
        self.0.extend_from_slice(v);
        self
    }
}

/// Reads fields from a payload; every accessor checks lengths and limits.
pub(crate) struct Dec<'a>(pub &'a [u8]);

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        if self.0.len() < n {
            return Err(protocol(format!("message truncated: wanted {n} bytes, have {}", self.0.len())));
        }
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        Ok(h)
    }
    pub fn u8(&mut self) -> Result<u8, StoreError> {
        Ok(self.take(1)?[0])
    }
    pub fn u64(&mut self) -> Result<u64, StoreError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    pub fn u32(&mut self) -> Result<u32, StoreError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    pub fn bytes(&mut self, max: usize) -> Result<&'a [u8], StoreError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(protocol(format!("field of {n} bytes exceeds the limit of {max}")));
        }
        self.take(n)
    }
    pub fn key(&mut self) -> Result<String, StoreError> {
        let b = self.bytes(KEY_BYTES_MAX)?;
        String::from_utf8(b.to_vec()).map_err(|_| protocol("key is not UTF-8"))
    }
    pub fn end(&self) -> Result<(), StoreError> {
        if !self.0.is_empty() {
            return Err(protocol(format!("{} trailing bytes", self.0.len())));
        }
        Ok(())
    }
}
