//! Length-prefixed frames over a non-blocking TCP stream, advanced a step per call.

use std::io::{ErrorKind, Read, Write};

/// Largest frame either side accepts.
pub const FRAME_BYTES_MAX: usize = 1 << 20;
const READ_CHUNK_BYTES: usize = 16 * 1024;

/// Writes one frame, a piece per call.
#[derive(Debug)]
pub struct FrameWriter {
    bytes: Vec<u8>,
    written: usize,
}

impl FrameWriter {
    /// A frame carrying `payload`.
    pub fn new(payload: &[u8]) -> FrameWriter {
        assert!(payload.len() <= FRAME_BYTES_MAX, "our own frames are small");
        let mut bytes = (payload.len() as u32).to_le_bytes().to_vec();
        bytes.extend_from_slice(payload);
        FrameWriter { bytes, written: 0 }
    }

    /// Writes what the socket takes; true once the whole frame went out.
    pub fn advance(&mut self, stream: &mut impl Write) -> std::io::Result<bool> {
        while self.written < self.bytes.len() {
            match stream.write(&self.bytes[self.written..]) {
                Ok(0) => return Err(std::io::Error::new(ErrorKind::WriteZero, "peer closed the setup socket")),
                Ok(n) => self.written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

/// Reads one frame, a piece per call.
#[derive(Debug, Default)]
pub struct FrameReader {
    bytes: Vec<u8>,
}

impl FrameReader {
    /// Reads what the socket has; the payload once the whole frame arrived.
    pub fn advance(&mut self, stream: &mut impl Read) -> std::io::Result<Option<Vec<u8>>> {
        let mut chunk = [0u8; READ_CHUNK_BYTES];
        loop {
            if let Some(payload) = self.complete()? {
                return Ok(Some(payload));
            }
            let want = self.wanted().min(READ_CHUNK_BYTES);
            match stream.read(&mut chunk[..want]) {
                Ok(0) => return Err(std::io::Error::new(ErrorKind::UnexpectedEof, "peer closed the setup socket")),
                Ok(n) => self.bytes.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn declared(&self) -> Option<usize> {
        accord_proto::frame::FrameReader::new(&self.bytes).u32().ok().map(|len| len as usize)
    }

    /// Bytes still missing (never reads past the frame).
    fn wanted(&self) -> usize {
        match self.declared() {
            None => 4 - self.bytes.len(),
            Some(len) => 4 + len - self.bytes.len(),
        }
    }

    fn complete(&self) -> std::io::Result<Option<Vec<u8>>> {
        match self.declared() {
            Some(len) if len > FRAME_BYTES_MAX => Err(std::io::Error::new(
                ErrorKind::InvalidData,
                format!("setup frame of {len} bytes exceeds {FRAME_BYTES_MAX}"),
            )),
            Some(len) if self.bytes.len() == 4 + len => Ok(Some(self.bytes[4..].to_vec())),
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream that takes or gives at most `step` bytes per call, then would block once.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        step: usize,
        block_next: bool,
    }
    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.block_next = !self.block_next;
            if self.block_next {
                return Err(ErrorKind::WouldBlock.into());
            }
            let n = buf.len().min(self.step).min(self.data.len() - self.at);
            buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }
    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.block_next = !self.block_next;
            if self.block_next {
                return Err(ErrorKind::WouldBlock.into());
            }
            let n = buf.len().min(self.step);
            self.data.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn frames_survive_partial_reads_and_writes() {
        let payload: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let mut pipe = Trickle { data: vec![], at: 0, step: 7, block_next: false };
        let mut w = FrameWriter::new(&payload);
        let mut calls = 0;
        while !w.advance(&mut pipe).unwrap() {
            calls += 1;
            assert!(calls < 10_000);
        }
        let mut r = FrameReader::default();
        let got = loop {
            if let Some(p) = r.advance(&mut pipe).unwrap() {
                break p;
            }
        };
        assert_eq!(got, payload);
    }

    #[test]
    fn oversized_and_truncated_frames_are_errors() {
        let mut huge = Trickle { data: u32::MAX.to_le_bytes().to_vec(), at: 0, step: 64, block_next: true };
        let mut r = FrameReader::default();
        assert!((0..10).find_map(|_| r.advance(&mut huge).err()).is_some(), "oversized frame");
        let mut short = Trickle { data: vec![10, 0, 0, 0, 1], at: 0, step: 64, block_next: true };
        let mut r = FrameReader::default();
        assert!((0..10).find_map(|_| r.advance(&mut short).err()).is_some(), "EOF inside a frame");
    }
}
