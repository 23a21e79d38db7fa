//! Ranks' output, copied line by line with a `[rank] ` prefix so lines of different ranks
//! never interleave. Every pipe is non-blocking and read by the launcher's one thread when
//! `poll` says it is ready: no thread per rank, so a job of many ranks cannot run the
//! launcher out of threads.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};

/// Longest partial line held back waiting for its newline; a longer one is written out in
/// pieces (each prefixed), so a rank that never prints a newline cannot grow the launcher.
pub const LINE_BYTES_MAX: usize = 64 << 10;
/// Bytes read from a pipe per call.
const READ_CHUNK: usize = 64 << 10;

/// Where a stream's lines go.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Sink {
    Stdout,
    Stderr,
}

/// One rank's stdout or stderr.
pub struct Stream {
    pipe: Option<Box<dyn ReadFd>>,
    prefix: Vec<u8>,
    sink: Sink,
    pending: Vec<u8>,
}

/// A pipe end the launcher reads.
pub trait ReadFd: Read + AsRawFd {}
impl<T: Read + AsRawFd> ReadFd for T {}

impl Stream {
    /// A stream read from `pipe` (already non-blocking), written to `sink` with `prefix`.
    pub fn new(pipe: Box<dyn ReadFd>, prefix: String, sink: Sink) -> Stream {
        Stream { pipe: Some(pipe), prefix: prefix.into_bytes(), sink, pending: Vec::new() }
    }

    /// The descriptor to poll, while the pipe is open.
    pub fn raw_fd(&self) -> Option<RawFd> {
        self.pipe.as_ref().map(|p| p.as_raw_fd())
    }

    /// Reads what is there without blocking and writes out every complete line; at end of
    /// file (or a read error) writes the rest and closes the pipe.
    pub fn pump(&mut self) {
        let mut chunk = vec![0u8; READ_CHUNK];
        loop {
            let Some(pipe) = self.pipe.as_mut() else { return };
            match pipe.read(&mut chunk) {
                Ok(0) => return self.close(),
                Ok(n) => {
                    self.pending.extend_from_slice(&chunk[..n]);
                    self.write_lines();
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return self.close(),
            }
        }
    }

    /// Writes what is left and stops reading (end of file, or the launcher gives up on a
    /// pipe some leftover process still holds).
    pub fn close(&mut self) {
        self.pipe = None;
        if !self.pending.is_empty() {
            let rest = std::mem::take(&mut self.pending);
            self.emit(&rest);
        }
    }

    fn write_lines(&mut self) {
        let mut start = 0;
        while let Some(i) = self.pending[start..].iter().position(|&b| b == b'\n') {
            let end = start + i + 1;
            let line = self.pending[start..end].to_vec();
            self.emit(&line);
            start = end;
        }
        while self.pending.len() - start > LINE_BYTES_MAX {
            let piece = self.pending[start..start + LINE_BYTES_MAX].to_vec();
            self.emit(&piece);
            start += LINE_BYTES_MAX;
        }
        self.pending.drain(..start);
    }

    fn emit(&self, line: &[u8]) {
        let mut text = Vec::with_capacity(self.prefix.len() + line.len() + 1);
        text.extend_from_slice(&self.prefix);
        text.extend_from_slice(line);
        if !text.ends_with(b"\n") {
            text.push(b'\n');
        }
        // A closed stdout of the launcher (a pipe to `head`) is no reason to stop the job.
        let _ = match self.sink {
            Sink::Stdout => std::io::stdout().lock().write_all(&text),
            Sink::Stderr => std::io::stderr().lock().write_all(&text),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn a_stream_reaches_end_of_file_and_closes() {
        let mut child = Command::new("printf").arg("a\\nb").stdout(Stdio::piped()).spawn().unwrap();
        let out = child.stdout.take().unwrap();
        child.wait().unwrap();
        let mut s = Stream::new(Box::new(out), "[0] ".into(), Sink::Stderr);
        assert!(s.raw_fd().is_some());
        s.pump();
        assert!(s.raw_fd().is_none(), "end of file closes the stream");
        assert!(s.pending.is_empty(), "the unterminated last line was written out");
    }

    #[test]
    fn an_endless_line_is_cut_into_bounded_pieces() {
        let mut s =
            Stream { pipe: None, prefix: vec![], sink: Sink::Stderr, pending: vec![b'x'; 3 * LINE_BYTES_MAX + 5] };
        s.write_lines();
        assert_eq!(s.pending.len(), 5);
    }
}
