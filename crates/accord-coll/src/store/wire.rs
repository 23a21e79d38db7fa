//! Framing and encoding of store requests and replies.

use std::io::{Read, Write};

use accord_proto::frame::{FrameError, FrameReader, FrameWriter};

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

/// Appends fields to a payload (little-endian, through the workspace's frame codec).
#[derive(Default)]
pub(crate) struct Enc(FrameWriter);

impl Enc {
    pub fn u8(mut self, v: u8) -> Self {
        self.0.put_u8(v);
        self
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.0.put_u32(v);
        self
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.0.put_u64(v);
        self
    }
    /// A length (`u32`) and the bytes.
    pub fn bytes(mut self, v: &[u8]) -> Self {
        self.0.put_u32(v.len() as u32).put_bytes(v);
        self
    }
    pub fn into_bytes(self) -> Vec<u8> {
        self.0.into_bytes()
    }
}

/// A frame the peer sent that the codec refuses, as the store's protocol error.
fn malformed(e: FrameError) -> StoreError {
    protocol(format!("malformed store message: {e}"))
}

/// Reads fields from a payload; every accessor checks lengths and limits, so malformed bytes
/// from a peer are a [`StoreError::Protocol`], never a panic.
pub(crate) struct Dec<'a>(FrameReader<'a>);

impl<'a> Dec<'a> {
    pub fn new(payload: &'a [u8]) -> Dec<'a> {
        Dec(FrameReader::new(payload))
    }
    pub fn u8(&mut self) -> Result<u8, StoreError> {
        self.0.u8().map_err(malformed)
    }
    pub fn u64(&mut self) -> Result<u64, StoreError> {
        self.0.u64().map_err(malformed)
    }
    pub fn u32(&mut self) -> Result<u32, StoreError> {
        self.0.u32().map_err(malformed)
    }
    /// A length (`u32`, at most `max`) and that many bytes.
    pub fn bytes(&mut self, max: usize) -> Result<&'a [u8], StoreError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(protocol(format!("field of {n} bytes exceeds the limit of {max}")));
        }
        self.0.bytes(n).map_err(malformed)
    }
    pub fn key(&mut self) -> Result<String, StoreError> {
        let b = self.bytes(KEY_BYTES_MAX)?;
        String::from_utf8(b.to_vec()).map_err(|_| protocol("key is not UTF-8"))
    }
    pub fn end(&self) -> Result<(), StoreError> {
        self.0.clone().finish().map_err(malformed)
    }
}

/// The value of a counter key (`add`): exactly 8 bytes, a little-endian `i64`. `None` when the
/// key holds anything else (a value `set` by a client), which `add` refuses.
pub(crate) fn decode_counter(value: &[u8]) -> Option<i64> {
    let mut r = FrameReader::new(value);
    let n = r.i64().ok()?;
    r.finish().ok()?;
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_with_the_same_bytes_as_before() {
        let payload = Enc::default().u8(OP_GET).bytes(b"k").u64(7).into_bytes();
        // op, u32 length, key, u64 timeout: the layout the store's peers speak.
        assert_eq!(payload, [&[OP_GET][..], &1u32.to_le_bytes(), b"k", &7u64.to_le_bytes()].concat());
        let mut d = Dec::new(&payload);
        assert_eq!((d.u8().unwrap(), d.key().unwrap(), d.u64().unwrap()), (OP_GET, "k".to_string(), 7));
        d.end().unwrap();
    }

    #[test]
    fn truncated_fields_are_protocol_errors() {
        let payload = Enc::default().u8(OP_SET).bytes(b"key").into_bytes();
        for cut in 0..payload.len() {
            let mut d = Dec::new(&payload[..cut]);
            let read = d.u8().and_then(|_| d.key());
            assert!(matches!(read, Err(StoreError::Protocol { .. })), "cut at {cut}: {read:?}");
        }
        assert!(matches!(Dec::new(&[1, 2, 3]).u64(), Err(StoreError::Protocol { .. })));
        assert!(matches!(Dec::new(&[1, 2]).u32(), Err(StoreError::Protocol { .. })));
    }

    #[test]
    fn oversized_and_trailing_fields_are_protocol_errors() {
        // A length past the limit is refused before any byte is taken.
        let long = Enc::default().u32(KEY_BYTES_MAX as u32 + 1).into_bytes();
        let e = Dec::new(&long).key().unwrap_err().to_string();
        assert!(e.contains("exceeds the limit"), "{e}");
        // A length past the frame (u32::MAX) is truncated, not an allocation or a panic.
        let huge = Enc::default().u32(u32::MAX).into_bytes();
        assert!(matches!(Dec::new(&huge).bytes(usize::MAX), Err(StoreError::Protocol { .. })));
        let trailing = Enc::default().u8(OP_GET).u8(0).into_bytes();
        let mut d = Dec::new(&trailing);
        d.u8().unwrap();
        assert!(matches!(d.end(), Err(StoreError::Protocol { .. })));
    }

    #[test]
    fn a_counter_is_exactly_eight_bytes() {
        assert_eq!(decode_counter(&(-5i64).to_le_bytes()), Some(-5));
        assert_eq!(decode_counter(&[1, 2, 3]), None, "truncated");
        assert_eq!(decode_counter(&[0; 9]), None, "oversized");
        assert_eq!(decode_counter(&[]), None);
    }
}
