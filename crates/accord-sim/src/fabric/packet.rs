//! Packets in the fabric, pooled. A packet carries the header bytes the protocol emitted and
//! only the *length* of its payload: payloads are virtual, and the receiving host rebuilds a
//! datagram of the right size in one reusable buffer ([`RxBuffer`]).
//!
//! A packet on a link is threaded into its port's [`Wire`] through `next`: the packets a port
//! holds form a linked FIFO inside the pool, so a port needs no buffer of its own and an arrival
//! reads one 32-byte packet slot instead of a port's queue and then the packet.

/// No packet: the end of a wire.
pub const NO_PACKET: u32 = u32::MAX;

/// Header bytes a packet's slot in the header arena holds (a data header is 104 bytes); longer
/// headers (ACKs with many SACK ranges) go to the slot's spill buffer.
pub const HEADER_INLINE_BYTES: usize = 128;

/// What every hop reads of a packet in flight: 32 bytes, two to a cache line. The header bytes
/// live apart ([`PacketPool::header`]), read once at delivery: at 1024 hosts ~150k packets are in
/// flight, and keeping the per-hop part small keeps it in cache.
#[derive(Copy, Clone, Debug)]
#[repr(C, align(32))]
pub struct Packet {
    /// Arrival (ns) of `next` (kept here so that popping this packet schedules the next one
    /// without reading the next packet's line).
    pub next_arrive_ns: u64,
    /// The packet behind this one on the same wire, or [`NO_PACKET`].
    pub next: u32,
    pub src: u32,
    pub dst: u32,
    pub payload_len: u32,
    /// Path entropy (the sender's path id), what switches hash on.
    pub path: u16,
    header_len: u16,
    pub ecn_capable: bool,
    /// Marked Congestion Experienced by a queue.
    pub ecn_ce: bool,
    /// Payload cut off by a trimming queue.
    pub trimmed: bool,
}

impl Default for Packet {
    fn default() -> Self {
        Packet {
            next_arrive_ns: 0,
            next: NO_PACKET,
            src: 0,
            dst: 0,
            payload_len: 0,
            path: 0,
            header_len: 0,
            ecn_capable: false,
            ecn_ce: false,
            trimmed: false,
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
    /// Bytes on the wire: header, payload and framing.
    pub fn wire_bytes(&self) -> u64 {
        self.header_len as u64 + self.payload_len as u64 + crate::link::FRAMING_BYTES
    }
}

/// A free list of packets: allocation reuses a slot, its header bytes and spill buffer.
#[derive(Debug, Default)]
pub struct PacketPool {
    slots: Vec<Packet>,
    /// Header bytes of slot `i`, `header_len` of them when they fit.
    headers: Vec<[u8; HEADER_INLINE_BYTES]>,
    /// Header of slot `i` when longer than [`HEADER_INLINE_BYTES`]; keeps its capacity.
    spill: Vec<Vec<u8>>,
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
                self.headers.push([0; HEADER_INLINE_BYTES]);
                self.spill.push(Vec::new());
                (self.slots.len() - 1) as u32
            }
        };
        debug_assert!(header.len() <= u16::MAX as usize, "headers are at most one datagram");
        let i = id as usize;
        if header.len() <= HEADER_INLINE_BYTES {
            self.headers[i][..header.len()].copy_from_slice(header);
        } else {
            self.spill[i].clear();
            self.spill[i].extend_from_slice(header);
        }
        self.slots[i] = Packet {
            next_arrive_ns: 0,
            next: NO_PACKET,
            src,
            dst,
            payload_len,
            path,
            header_len: header.len() as u16,
            ecn_capable,
            ecn_ce: false,
            trimmed: false,
        };
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

    /// The header bytes packet `id`'s sender emitted.
    pub fn header(&self, id: u32) -> &[u8] {
        let len = self.slots[id as usize].header_len as usize;
        if len <= HEADER_INLINE_BYTES {
            &self.headers[id as usize][..len]
        } else {
            &self.spill[id as usize]
        }
    }

    /// Appends packet `id`, arriving at `arrive_ns`, to `wire`. Returns whether it became the
    /// head (the caller then schedules its arrival).
    pub fn wire_push(&mut self, wire: &mut Wire, id: u32, arrive_ns: u64) -> bool {
        self.slots[id as usize].next = NO_PACKET;
        if wire.tail == NO_PACKET {
            *wire = Wire { head: id, tail: id };
            return true;
        }
        let tail = &mut self.slots[wire.tail as usize];
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

    /// The datagram of packet `id` rebuilt in `rx`, or `None` if it does not fit.
    pub fn datagram<'a>(&self, id: u32, rx: &'a mut RxBuffer) -> Option<&'a [u8]> {
        rx.build(self.header(id), self.slots[id as usize].payload_len)
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

    /// The datagram of `header` and `payload_len` virtual bytes, or `None` if it does not fit.
    pub fn build(&mut self, header: &[u8], payload_len: u32) -> Option<&[u8]> {
        let header_len = header.len();
        let len = header_len + payload_len as usize;
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
