//! The Ack packet: cumulative point, SACK bitmap and per-packet rejections.

use super::field;
use super::packet::Packet;
use super::{MAX_REJECTIONS_PER_ACK, SACK_BITMAP_BITS};
use crate::ids::{OpId, Psn};

const SACK_WORDS: usize = SACK_BITMAP_BITS / 64;

/// Selective-ack bitmap: bit `i` set means psn `cum_ack + 1 + i` was received.
///
/// Fixed size (1024 bits, a bandwidth-delay product of chunks) so an Ack never allocates.
/// `len_bits` is one past the highest set bit, which is exactly what emit puts on the wire
/// (trailing zero bytes trimmed); a parsed bitmap is therefore equal to the one emitted.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct SackBitmap {
    words: [u64; SACK_WORDS],
    len_bits: u16,
}

impl SackBitmap {
    /// An empty bitmap.
    pub const fn new() -> Self {
        SackBitmap { words: [0; SACK_WORDS], len_bits: 0 }
    }

    /// Marks bit `index` (psn `cum_ack + 1 + index`). Returns `false` and changes nothing when
    /// `index` is beyond [`SACK_BITMAP_BITS`]: the ack simply does not report that far.
    pub fn set(&mut self, index: usize) -> bool {
        if index >= SACK_BITMAP_BITS {
            return false;
        }
        if let Some(word) = self.words.get_mut(index / 64) {
            *word |= 1u64 << (index % 64);
        }
        // index < 1024, so index + 1 fits in u16.
        self.len_bits = self.len_bits.max((index + 1) as u16);
        true
    }

    /// Whether bit `index` is set; `false` beyond the bitmap.
    pub fn get(&self, index: usize) -> bool {
        self.words.get(index / 64).is_some_and(|word| (word >> (index % 64)) & 1 == 1)
    }

    /// One past the highest set bit (0 when empty): the span the wire encoding covers.
    pub fn len_bits(&self) -> usize {
        usize::from(self.len_bits)
    }

    /// Whether no bit is set.
    pub fn is_empty(&self) -> bool {
        self.len_bits == 0
    }

    /// Number of set bits.
    pub fn count_set(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Clears every bit.
    pub fn clear(&mut self) {
        *self = Self::new();
    }

    /// Indices of the set bits, ascending.
    pub fn iter_set(&self) -> impl Iterator<Item = usize> {
        self.words.into_iter().enumerate().flat_map(|(w, mut word)| {
            core::iter::from_fn(move || {
                if word == 0 {
                    return None;
                }
                let bit = word.trailing_zeros() as usize;
                word &= word - 1;
                Some(w * 64 + bit)
            })
        })
    }

    /// Bytes emit writes: the bitmap trimmed of trailing all-zero bytes.
    pub fn wire_len_bytes(&self) -> usize {
        self.len_bits().div_ceil(8)
    }

    /// Byte `index` of the LSB-first wire encoding.
    fn wire_byte(&self, index: usize) -> u8 {
        self.words.get(index / 8).map_or(0, |word| word.to_le_bytes()[index % 8])
    }

    /// Builds a bitmap from wire bytes (LSB-first); bytes beyond 128 are ignored.
    pub(super) fn from_wire(bytes: &[u8]) -> Self {
        let mut sack = Self::new();
        // Zipping with the 16 words stops after 128 bytes.
        for (word, chunk) in sack.words.iter_mut().zip(bytes.chunks(8)) {
            let mut le = [0u8; 8];
            for (slot, byte) in le.iter_mut().zip(chunk) {
                *slot = *byte;
            }
            *word = u64::from_le_bytes(le);
        }
        sack.len_bits = sack
            .words
            .iter()
            .enumerate()
            .rev()
            .find(|(_, w)| **w != 0)
            .map_or(0, |(i, w)| (i * 64 + 64 - w.leading_zeros() as usize) as u16);
        sack
    }

    /// Writes the trimmed encoding into `out` (which should be [`Self::wire_len_bytes`] long).
    pub(super) fn write_wire(&self, out: &mut [u8]) {
        for (index, byte) in out.iter_mut().enumerate() {
            *byte = self.wire_byte(index);
        }
    }
}

impl core::fmt::Debug for SackBitmap {
    /// Compact: a full bitmap would print sixteen words nobody reads.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SackBitmap").field("set", &self.count_set()).field("len_bits", &self.len_bits).finish()
    }
}

/// Why a receiver refused a data packet; tells the sender to fail the operation rather than
/// retransmit it forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// The destination region id is not registered for this connection.
    UnknownRegion,
    /// The remote key does not match the region.
    BadKey,
    /// The write would land outside the region.
    OutOfBounds,
    /// A send found no posted receive buffer.
    NoRecvBuffer,
    /// A send is larger than the posted buffers.
    MessageTooLarge,
    /// The receiver tracks too many partially received messages.
    TooManyMessages,
    /// A code this build does not know; kept so newer peers stay compatible.
    Other(u32),
}

impl RejectReason {
    /// Wire code. `Other(c)` encodes as `c` (a known code then parses as its named variant).
    pub const fn to_u32(self) -> u32 {
        match self {
            RejectReason::UnknownRegion => 1,
            RejectReason::BadKey => 2,
            RejectReason::OutOfBounds => 3,
            RejectReason::NoRecvBuffer => 4,
            RejectReason::MessageTooLarge => 5,
            RejectReason::TooManyMessages => 6,
            RejectReason::Other(code) => code,
        }
    }

    /// Decodes a wire code; never fails, unknown codes become `Other`.
    pub const fn from_u32(code: u32) -> Self {
        match code {
            1 => RejectReason::UnknownRegion,
            2 => RejectReason::BadKey,
            3 => RejectReason::OutOfBounds,
            4 => RejectReason::NoRecvBuffer,
            5 => RejectReason::MessageTooLarge,
            6 => RejectReason::TooManyMessages,
            other => RejectReason::Other(other),
        }
    }
}

/// One refused data packet, reported in an Ack so the sender can fail its operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejection {
    /// Psn of the refused packet.
    pub psn: Psn,
    /// Operation it belonged to.
    pub op: OpId,
    /// Why it was refused.
    pub reason: RejectReason,
}

const EMPTY_REJECTION: Rejection = Rejection { psn: 0, op: OpId(0), reason: RejectReason::Other(0) };

/// Up to [`MAX_REJECTIONS_PER_ACK`] rejections, stored inline so an Ack never allocates.
/// Equality and `Debug` look at the live entries only.
#[derive(Clone, Copy)]
pub struct Rejections {
    entries: [Rejection; MAX_REJECTIONS_PER_ACK],
    count: u8,
}

impl Default for Rejections {
    fn default() -> Self {
        Self::new()
    }
}

impl Rejections {
    /// An empty list.
    pub const fn new() -> Self {
        Rejections { entries: [EMPTY_REJECTION; MAX_REJECTIONS_PER_ACK], count: 0 }
    }

    /// Appends `rejection`; returns `false` (and drops it) when full, so the caller reports it
    /// in the next Ack.
    pub fn push(&mut self, rejection: Rejection) -> bool {
        match self.entries.get_mut(usize::from(self.count)) {
            Some(slot) => {
                *slot = rejection;
                self.count += 1;
                true
            }
            None => false,
        }
    }

    /// The live entries.
    pub fn as_slice(&self) -> &[Rejection] {
        self.entries.get(..usize::from(self.count)).unwrap_or(&[])
    }

    /// Iterates the live entries in push order.
    pub fn iter(&self) -> core::slice::Iter<'_, Rejection> {
        self.as_slice().iter()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        usize::from(self.count)
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether another push would fail.
    pub fn is_full(&self) -> bool {
        self.len() >= MAX_REJECTIONS_PER_ACK
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        *self = Self::new();
    }
}

impl PartialEq for Rejections {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Rejections {}

impl core::fmt::Debug for Rejections {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<'a> IntoIterator for &'a Rejections {
    type Item = &'a Rejection;
    type IntoIter = core::slice::Iter<'a, Rejection>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// An acknowledgment: what the receiver has, what it refused, and an RTT echo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckRepr {
    /// Every psn below this is resolved (received or rejected) at the receiver.
    pub cum_ack: Psn,
    /// Psn of the data packet that triggered this ack.
    pub echo_psn: Psn,
    /// That packet's `tx_time_ns`, for an RTT sample.
    pub echo_tx_time_ns: u64,
    /// Time the receiver held the packet before acking.
    pub ack_delay_ns: u32,
    /// Cumulative CE-marked data packets received on this connection (wraps).
    pub ecn_ce_count: u32,
    /// Receiver-driven credit in bytes; 0 when the congestion controller does not use it.
    pub credit_bytes: u32,
    /// Packets received above `cum_ack`.
    pub sack: SackBitmap,
    /// Packets refused since the previous ack.
    pub rejections: Rejections,
}

impl AckRepr {
    /// Reads an Ack from a checked packet; lengths were validated by `check_len`.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Self {
        let mut rejections = Rejections::new();
        for index in 0..usize::from(packet.ack_rejection_count()) {
            if let Some(rejection) = packet.ack_rejection(index) {
                rejections.push(rejection);
            }
        }
        AckRepr {
            cum_ack: packet.ack_cum_ack(),
            echo_psn: packet.ack_echo_psn(),
            echo_tx_time_ns: packet.ack_echo_tx_time_ns(),
            ack_delay_ns: packet.ack_delay_ns(),
            ecn_ce_count: packet.ack_ecn_ce_count(),
            credit_bytes: packet.ack_credit_bytes(),
            sack: SackBitmap::from_wire(packet.ack_sack_bytes()),
            rejections,
        }
    }

    /// Bytes of the body after the common header.
    pub fn body_len(&self) -> usize {
        field::ACK_SACK - field::HEADER_END + self.sack.wire_len_bytes() + field::rejection::LEN * self.rejections.len()
    }

    /// Writes the body into a packet of at least `HEADER_LEN + body_len()` bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_ack_cum_ack(self.cum_ack);
        packet.set_ack_echo_psn(self.echo_psn);
        packet.set_ack_echo_tx_time_ns(self.echo_tx_time_ns);
        packet.set_ack_delay_ns(self.ack_delay_ns);
        packet.set_ack_ecn_ce_count(self.ecn_ce_count);
        packet.set_ack_credit_bytes(self.credit_bytes);
        // wire_len_bytes() <= 128 and len() <= 16, so both casts are lossless.
        packet.set_ack_sack_len_bytes(self.sack.wire_len_bytes() as u16);
        packet.set_ack_rejection_count(self.rejections.len() as u8);
        packet.set_ack_reserved(0);
        self.sack.write_wire(packet.ack_sack_bytes_mut());
        for (index, rejection) in self.rejections.iter().enumerate() {
            packet.set_ack_rejection(index, rejection);
        }
    }
}
