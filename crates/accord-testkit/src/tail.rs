//! The last bytes a child wrote to stderr, kept so a failure can show them.

use std::collections::VecDeque;

/// Keeps at most `limit` of the latest bytes written; what came before is counted, not kept.
#[derive(Debug)]
pub struct Tail {
    bytes: VecDeque<u8>,
    limit: usize,
    dropped: u64,
}

impl Tail {
    pub fn new(limit: usize) -> Tail {
        Tail { bytes: VecDeque::new(), limit, dropped: 0 }
    }

    pub fn push(&mut self, data: &[u8]) {
        self.bytes.extend(data);
        let over = self.bytes.len().saturating_sub(self.limit);
        self.bytes.drain(..over);
        self.dropped += over as u64;
    }

    /// The kept bytes as text (lossy), every one of them.
    pub fn text(&self) -> String {
        let (a, b) = self.bytes.as_slices();
        let mut all = Vec::with_capacity(a.len() + b.len());
        all.extend_from_slice(a);
        all.extend_from_slice(b);
        String::from_utf8_lossy(&all).into_owned()
    }

    /// At most the last `lines` lines, saying how much came before them.
    pub fn last_lines(&self, lines: usize) -> String {
        let text = self.text();
        let all: Vec<&str> = text.lines().collect();
        let skipped = all.len().saturating_sub(lines);
        let shown = all[skipped..].join("\n");
        if skipped == 0 && self.dropped == 0 {
            shown
        } else {
            format!("[... {skipped} line(s) and {} byte(s) before]\n{shown}", self.dropped)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_only_the_latest_bytes_and_counts_the_rest() {
        let mut t = Tail::new(8);
        t.push(b"abc\n");
        assert_eq!(t.last_lines(5), "abc");
        t.push(b"defg\nhij\n");
        assert_eq!(t.text(), "efg\nhij\n");
        assert_eq!(t.last_lines(1), "[... 1 line(s) and 5 byte(s) before]\nhij");
    }
}
