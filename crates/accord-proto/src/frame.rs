//! A checked little-endian codec for the small fixed frames that the layers above the protocol
//! exchange: the engine's control frames, the NCCL plugin's handles and clear-to-send records,
//! the collectives' descriptors and context records, the bootstrap store's messages.
//!
//! Why here: those frames come from other processes, often over the wire, so every read must be
//! bounds-checked and every malformed frame must become an error value, never a panic. One
//! reader and one error type, in the house style of [`crate::wire`] (checked views, no
//! accessor that can panic once constructed), replace a hand-rolled `try_into().expect(..)` in
//! each codec.
//!
//! ```
//! use accord_proto::frame::{FrameError, FrameReader, FrameWriter};
//! let mut w = FrameWriter::with_capacity(13);
//! w.put_u8(1).put_u32(7).put_u64(u64::MAX);
//! let bytes = w.into_bytes();
//! let mut r = FrameReader::new(&bytes);
//! assert_eq!((r.u8()?, r.u32()?, r.u64()?), (1, 7, u64::MAX));
//! r.finish()?;
//! assert!(matches!(FrameReader::new(&bytes[..3]).u32(), Err(FrameError::Truncated { .. })));
//! # Ok::<(), FrameError>(())
//! ```

/// Why bytes are not the frame a codec expected.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A field runs past the end of the bytes.
    #[error("frame truncated: {needed} bytes needed at offset {at}, {len} in the frame")]
    Truncated {
        /// Offset of the field.
        at: usize,
        /// The field's length.
        needed: usize,
        /// The frame's length.
        len: usize,
    },
    /// Bytes left over after the last field.
    #[error("{extra} unexpected bytes after the frame")]
    Trailing {
        /// How many.
        extra: usize,
    },
    /// A field holds a value the codec refuses (named in the message).
    #[error("{0}")]
    Invalid(&'static str),
}

/// A cursor over a frame's bytes; every read is checked.
#[derive(Clone, Debug)]
pub struct FrameReader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> FrameReader<'a> {
    /// A reader at the first byte of `bytes`.
    pub fn new(bytes: &'a [u8]) -> FrameReader<'a> {
        FrameReader { bytes, at: 0 }
    }

    /// A reader at byte `at` of `bytes` (for codecs written as a table of offsets).
    pub fn at(bytes: &'a [u8], at: usize) -> FrameReader<'a> {
        FrameReader { bytes, at }
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        let truncated = FrameError::Truncated { at: self.at, needed: n, len: self.bytes.len() };
        let end = self.at.checked_add(n).ok_or(truncated)?;
        let field = self.bytes.get(self.at..end).ok_or(truncated)?;
        self.at = end;
        Ok(field)
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], FrameError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    /// The next byte.
    pub fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.array::<1>()?[0])
    }

    /// The next little-endian `u16`.
    pub fn u16(&mut self) -> Result<u16, FrameError> {
        self.array().map(u16::from_le_bytes)
    }

    /// The next little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, FrameError> {
        self.array().map(u32::from_le_bytes)
    }

    /// The next little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64, FrameError> {
        self.array().map(u64::from_le_bytes)
    }

    /// The next little-endian `i64`.
    pub fn i64(&mut self) -> Result<i64, FrameError> {
        self.array().map(i64::from_le_bytes)
    }

    /// The next little-endian `f64`.
    pub fn f64(&mut self) -> Result<f64, FrameError> {
        self.array().map(f64::from_le_bytes)
    }

    /// Every byte not read yet (the reader is then at the end).
    pub fn rest(&mut self) -> &'a [u8] {
        let rest = self.bytes.get(self.at..).unwrap_or(&[]);
        self.at = self.bytes.len();
        rest
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.at)
    }

    /// Offset of the next read.
    pub fn position(&self) -> usize {
        self.at
    }

    /// Ends the frame: an error if bytes are left over.
    pub fn finish(self) -> Result<(), FrameError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(FrameError::Trailing { extra }),
        }
    }
}

/// Builds a frame, field by field, little-endian.
#[derive(Clone, Debug, Default)]
pub struct FrameWriter {
    bytes: Vec<u8>,
}

impl FrameWriter {
    /// An empty frame with room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> FrameWriter {
        FrameWriter { bytes: Vec::with_capacity(capacity) }
    }

    /// Appends raw bytes.
    pub fn put_bytes(&mut self, bytes: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(bytes);
        self
    }

    /// Appends a byte.
    pub fn put_u8(&mut self, value: u8) -> &mut Self {
        self.put_bytes(&[value])
    }

    /// Appends a little-endian `u16`.
    pub fn put_u16(&mut self, value: u16) -> &mut Self {
        self.put_bytes(&value.to_le_bytes())
    }

    /// Appends a little-endian `u32`.
    pub fn put_u32(&mut self, value: u32) -> &mut Self {
        self.put_bytes(&value.to_le_bytes())
    }

    /// Appends a little-endian `u64`.
    pub fn put_u64(&mut self, value: u64) -> &mut Self {
        self.put_bytes(&value.to_le_bytes())
    }

    /// Appends a little-endian `i64`.
    pub fn put_i64(&mut self, value: i64) -> &mut Self {
        self.put_bytes(&value.to_le_bytes())
    }

    /// Appends a little-endian `f64`.
    pub fn put_f64(&mut self, value: f64) -> &mut Self {
        self.put_bytes(&value.to_le_bytes())
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The frame.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let mut w = FrameWriter::with_capacity(64);
        w.put_u8(0xab).put_u16(0xbeef).put_u32(u32::MAX).put_u64(1 << 40).put_i64(-5).put_f64(2.5);
        w.put_bytes(b"tail");
        let bytes = w.into_bytes();
        let mut r = FrameReader::new(&bytes);
        assert_eq!(r.u8(), Ok(0xab));
        assert_eq!(r.u16(), Ok(0xbeef));
        assert_eq!(r.u32(), Ok(u32::MAX));
        assert_eq!(r.u64(), Ok(1 << 40));
        assert_eq!(r.i64(), Ok(-5));
        assert_eq!(r.f64(), Ok(2.5));
        assert_eq!(r.remaining(), 4);
        assert_eq!(r.clone().rest(), b"tail");
        assert_eq!(r.clone().finish(), Err(FrameError::Trailing { extra: 4 }));
        assert_eq!(r.bytes(4), Ok(&b"tail"[..]));
        assert_eq!(r.finish(), Ok(()));
    }

    #[test]
    fn reads_past_the_end_are_errors_and_move_nothing() {
        let bytes = [1u8, 2, 3];
        let mut r = FrameReader::new(&bytes);
        assert_eq!(r.u32(), Err(FrameError::Truncated { at: 0, needed: 4, len: 3 }));
        assert_eq!(r.position(), 0);
        assert_eq!(r.u16(), Ok(0x0201));
        assert_eq!(r.u16(), Err(FrameError::Truncated { at: 2, needed: 2, len: 3 }));
        assert_eq!(FrameReader::at(&bytes, 10).u8(), Err(FrameError::Truncated { at: 10, needed: 1, len: 3 }));
        assert_eq!(FrameReader::at(&bytes, usize::MAX).bytes(2).map(|b| b.len()).ok(), None);
        assert_eq!(FrameReader::at(&bytes, 10).rest(), &[] as &[u8]);
    }
}
