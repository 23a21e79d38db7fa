//! Packets in the fabric, pooled. A packet carries the header bytes the protocol emitted and
//! only the *length* of its payload: payloads are virtual, and the receiving host rebuilds a
//! datagram of the right size in one reusable buffer ([`RxBuffer`]).

/// One packet in flight. `header` keeps its capacity across reuse.
#[derive(Clone, Debug, Default)]
pub struct Packet {
    pub src: u32,
    pub dst: u32,
    /// Path entropy (the sender's path id), what switches hash on.
    pub path: u16,
    pub payload_len: u32,
    pub ecn_capable: bool,
    /// Marked Congestion Experienced by a queue.
    pub ecn_ce: bool,
    /// Payload cut off by a trimming queue.
    pub trimmed: bool,
    pub header: Vec<u8>,
}

impl Packet {
    /// Bytes on the wire: header, payload and framing.
    pub fn wire_bytes(&self) -> u64 {
        self.header.len() as u64 + self.payload_len as u64 + crate::link::FRAMING_BYTES
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
        p.header.clear();
        p.header.extend_from_slice(header);
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
        let header_len = packet.header.len();
        let len = header_len + packet.payload_len as usize;
        if len > self.bytes.len() {
            return None;
        }
        self.bytes[..header_len].copy_from_slice(&packet.header);
        if self.dirty_to > header_len {
            self.bytes[header_len..self.dirty_to].fill(0);
        }
        self.dirty_to = header_len;
        Some(&self.bytes[..len])
    }
}
