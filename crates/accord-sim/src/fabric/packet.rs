//! Packets in the fabric, pooled. A packet carries the header bytes the protocol emitted and
//! only the *length* of its payload: payloads are virtual, and the receiving host rebuilds a
//! datagram of the right size in one reusable buffer ([`RxBuffer`]).
//!
//! A packet on a link is threaded into its port's [`Wire`] through `next`: the packets a port
//! holds form a linked FIFO inside the pool, so a port needs no buffer of its own and an arrival
//! reads one packet slot (one cache line) instead of a port's queue and then the packet.

/// No packet: the end of a wire.
pub const NO_PACKET: u32 = u32::MAX;

/// Header bytes a packet slot holds inline (a data header is 104 bytes); longer headers (ACKs
/// with many SACK ranges) go to the slot's spill buffer.
pub const HEADER_INLINE_BYTES: usize = 128;

/// One packet in flight: the fields every hop reads in the first cache line, the header in
/// the next two (read once, at delivery, right after the first line: the adjacent-line
/// prefetch brings it, where a separate heap buffer was a second miss).
#[derive(Clone, Debug)]
#[repr(C, align(64))]
pub struct Packet {
    /// Arrival (ns) at the far end of the port it is queued on.
    pub arrive_ns: u64,
    /// Arrival of `next` (kept here so that popping this packet schedules the next one without
    /// reading the next packet's line).
    pub next_arrive_ns: u64,
    /// The packet behind this one on the same wire, or [`NO_PACKET`].
    pub next: u32,
    pub src: u32,
    pub dst: u32,
    /// Path entropy (the sender's path id), what switches hash on.
    pub path: u16,
    header_len: u16,
    pub payload_len: u32,
    pub ecn_capable: bool,
    /// Marked Congestion Experienced by a queue.
    pub ecn_ce: bool,
    /// Payload cut off by a trimming queue.
    pub trimmed: bool,
    /// A header longer than [`HEADER_INLINE_BYTES`]; keeps its capacity across reuse.
    spill: Vec<u8>,
    inline: [u8; HEADER_INLINE_BYTES],
}

impl Default for Packet {
    fn default() -> Self {
        Packet {
            arrive_ns: 0,
            next_arrive_ns: 0,
            next: NO_PACKET,
            src: 0,
            dst: 0,
            path: 0,
            header_len: 0,
            payload_len: 0,
            ecn_capable: false,
            ecn_ce: false,
            trimmed: false,
            spill: Vec::new(),
            inline: [0; HEADER_INLINE_BYTES],
        }
    }
}

/// The packets on one lane of a port, earliest arrival first: head and tail of a list linked
/// through [`Packet::next`]. Arrival times never decrease along it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Wire {
    pub head: u32,
    pub tail: u32,
}

impl Default for Wire {
    fn default() -> Self {
        Wire { head: NO_PACKET, tail: NO_PACKET }
    }
}

impl Wire {
    pub fn is_empty(&self) -> bool {
        self.head == NO_PACKET
    }
}

impl Packet {
    /// The header bytes the sender emitted.
    pub fn header(&self) -> &[u8] {
        let len = self.header_len as usize;
        if len <= HEADER_INLINE_BYTES {
            &self.inline[..len]
        } else {
            &self.spill
        }
    }

    fn set_header(&mut self, header: &[u8]) {
        debug_assert!(header.len() <= u16::MAX as usize, "headers are at most one datagram");
        if header.len() <= HEADER_INLINE_BYTES {
            self.inline[..header.len()].copy_from_slice(header);
        } else {
            self.spill.clear();
            self.spill.extend_from_slice(header);
        }
        self.header_len = header.len() as u16;
    }

    /// Bytes on the wire: header, payload and framing.
    pub fn wire_bytes(&self) -> u64 {
        self.header_len as u64 + self.payload_len as u64 + crate::link::FRAMING_BYTES
    }
}

/// A free list of packets: allocation reuses a slot and its header buffer.
#[derive(Debug, Default)]
pub struct PacketPool {
    slots: Vec<Packet>,
    free: Vec<u32>,
    live: u64,
    live_max: u64,
}

impl PacketPool {
    /// A packet from `src` to `dst` on `path` with `header` and a virtual payload.
    pub fn alloc(&mut self, src: u32, dst: u32, path: u16, header: &[u8], payload_len: u32, ecn_capable: bool) -> u32 {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.slots.push(Packet::default());
                (self.slots.len() - 1) as u32
            }
        };
        let p = &mut self.slots[id as usize];
        p.src = src;
        p.dst = dst;
        p.path = path;
        p.payload_len = payload_len;
        p.ecn_capable = ecn_capable;
        p.ecn_ce = false;
        p.trimmed = false;
        p.next = NO_PACKET;
        p.set_header(header);
        self.live += 1;
        self.live_max = self.live_max.max(self.live);
        id
    }

    /// Returns a packet to the pool.
    pub fn free(&mut self, id: u32) {
        debug_assert!(!self.free.contains(&id), "packet freed twice");
        self.free.push(id);
        self.live -= 1;
    }

    /// Packet `id` (allocated, not freed).
    pub fn get(&self, id: u32) -> &Packet {
        &self.slots[id as usize]
    }

    /// Packet `id`, mutable (queues mark and trim it).
    pub fn get_mut(&mut self, id: u32) -> &mut Packet {
        &mut self.slots[id as usize]
    }

    /// Appends packet `id`, arriving at `arrive_ns`, to `wire`. Returns whether it became the
    /// head (the caller then schedules its arrival).
    pub fn wire_push(&mut self, wire: &mut Wire, id: u32, arrive_ns: u64) -> bool {
        let p = &mut self.slots[id as usize];
        p.arrive_ns = arrive_ns;
        p.next = NO_PACKET;
        if wire.tail == NO_PACKET {
            *wire = Wire { head: id, tail: id };
            return true;
        }
        let tail = &mut self.slots[wire.tail as usize];
        debug_assert!(tail.arrive_ns <= arrive_ns, "wire arrival times decrease");
        tail.next = id;
        tail.next_arrive_ns = arrive_ns;
        wire.tail = id;
        false
    }

    /// Takes the head of `wire`, which must be `id`. Returns the new head and its arrival
    /// time, if any.
    pub fn wire_pop(&mut self, wire: &mut Wire, id: u32) -> Option<(u32, u64)> {
        debug_assert_eq!(wire.head, id, "an arrival event names its wire's head");
        let p = &self.slots[id as usize];
        let (next, next_arrive_ns) = (p.next, p.next_arrive_ns);
        wire.head = next;
        if next == NO_PACKET {
            wire.tail = NO_PACKET;
            return None;
        }
        Some((next, next_arrive_ns))
    }

    /// Packets allocated and not freed (in flight in the fabric).
    pub fn live(&self) -> u64 {
        self.live
    }

    /// Most packets ever live at once (the pool's size).
    pub fn live_max(&self) -> u64 {
        self.live_max
    }
}

/// The receive buffer a host rebuilds datagrams in: header bytes, then `payload_len` bytes that
/// are zero unless an earlier, longer header left bytes there (payload content is virtual, so
/// only its length matters; stale bytes are cleared anyway to keep the datagram well defined).
#[derive(Debug)]
pub struct RxBuffer {
    bytes: Vec<u8>,
    dirty_to: usize,
}

impl RxBuffer {
    /// A buffer for datagrams of up to `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        RxBuffer { bytes: vec![0; capacity], dirty_to: 0 }
    }

    /// The datagram of `packet`, or `None` if it does not fit.
    pub fn build(&mut self, packet: &Packet) -> Option<&[u8]> {
        let header = packet.header();
        let header_len = header.len();
        let len = header_len + packet.payload_len as usize;
        if len > self.bytes.len() {
            return None;
        }
        self.bytes[..header_len].copy_from_slice(header);
        if self.dirty_to > header_len {
            self.bytes[header_len..self.dirty_to].fill(0);
        }
        self.dirty_to = header_len;
        Some(&self.bytes[..len])
    }
}
