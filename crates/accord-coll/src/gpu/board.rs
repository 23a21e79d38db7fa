//! The flag board: the layout of the shared-memory words that order
//! collectives between the ranks of one host, and the bounded waits on them.
//!
//! Per rank `r`: its pid, its state (open/closed), an abort flag, `ready`
//! (the last collective round it reached, with its receive-buffer slot
//! written first), a deregistration epoch, and [`SLOTS`] slots of
//! `{round, recv registration, recv offset, scratch registration}`.
//! Per ordered pair `(src, dst)`: `done`, how many push phases `src`
//! finished into `dst` (written after `src` saw its copies complete).
//! Per rank, last: its registration table, [`REG_ENTRIES`] entries of
//! `{id, kind, IPC handle or VMM pieces, offset}` through which peers map its receive buffers
//! (entry `id % REG_ENTRIES`; the id is written last, and read before and after
//! the rest, so a reader never takes half of a rewritten entry). Handles travel
//! here, not through a store, so a communicator needs a store only to meet
//! (torch's c10d store, say) and a first push into a new buffer costs no round
//! trip.
//!
//! Protocol of one round `seq` (every rank the same sequence):
//! 1. the rank writes its slot, then `ready = seq` (release);
//! 2. a pusher waits for `ready[dst] >= seq` (acquire), reads the slot (which
//!    stays put until the pusher signals `done`), maps the buffer, copies;
//! 3. once its copies completed it adds 1 to `done[src][dst]`;
//! 4. a receiver waits until `done[src][me]` reached the count it expects.
//!
//! The words live in a file under `/dev/shm` that rank 0 creates and the others open, mapped
//! by the engine's [`SharedMapping`] (the same code as the engine's shared host regions);
//! rank 0 unlinks it once every rank has it open, so nothing is left behind on a crash.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use accord_cuda::ipc::IPC_HANDLE_BYTES;
use accord_engine::backoff::IdleBackoff;
use accord_engine::{SharedMapError, SharedMapFailure, SharedMapping};

use super::error::{GpuCollError, GpuResult};

/// Receive-buffer slots per rank (one is in use at a time; spare ones keep a
/// late reader's slot intact across one extra round).
pub const SLOTS: usize = 4;
/// Most ranks on one host.
pub const GPU_WORLD_SIZE_MAX: usize = 64;
const HEADER_WORDS: usize = 8;
const SLOT_WORDS: usize = 4;
const RANK_WORDS: usize = 8 + SLOTS * SLOT_WORDS;
/// Most registrations the `ACCORD_GPU_REGISTRATIONS_MAX` knob allows.
pub const REGISTRATIONS_MAX_LIMIT: usize = 1024;
/// Entries of a rank's registration table: every registration the knob allows, and the scratch.
pub const REG_ENTRIES: usize = REGISTRATIONS_MAX_LIMIT + 1;
/// Words holding a serialised IPC handle in a registration entry.
const HANDLE_WORDS: usize = IPC_HANDLE_BYTES.div_ceil(8);
/// Most mappings one VMM registration may span (one word each: the exporter's descriptor and
/// the mapping's size in pages): 640 MiB of PyTorch's 20 MiB expandable segments.
pub const VMM_PIECES_INLINE: usize = 32;
/// Words of an entry's payload: an IPC handle or the VMM pieces, whichever is larger.
const PAYLOAD_WORDS: usize = if HANDLE_WORDS > VMM_PIECES_INLINE { HANDLE_WORDS } else { VMM_PIECES_INLINE };
/// Words of one registration entry: id, kind, payload, offset.
const REG_ENTRY_WORDS: usize = 3 + PAYLOAD_WORDS;
/// Kind word of an entry holding an IPC handle.
const KIND_IPC: u64 = 1;
/// Kind word of an entry holding VMM pieces (their count in the bits above the low byte).
const KIND_VMM: u64 = 2;
/// Unit of a VMM piece's size on the board.
const VMM_PAGE: u64 = 4096;
const MAGIC: u64 = 0x4143_434f_5244_4750; // "ACCORDGP"
const STATE_OPEN: u64 = 1;
const STATE_CLOSED: u64 = 2;
/// How often a wait checks that its peers are still alive.
pub const LIVENESS_CHECK_INTERVAL: Duration = Duration::from_millis(2);
/// Largest segment accepted (words), a bound on what a peer can make us map.
pub const SEGMENT_WORDS_MAX: usize = 1 << 22;
/// Busy polls before a wait starts yielding the CPU (it sleeps from four times as many on).
pub const SPIN_POLLS_MAX: u32 = 4096;
/// Longest sleep between two polls once a wait has gone on for a while.
pub const POLL_SLEEP_MAX: Duration = Duration::from_micros(20);

/// What a rank publishes about its receive buffer for one round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// The round.
    pub seq: u64,
    /// Registration id of the receive buffer.
    pub recv_reg: u64,
    /// Offset of the receive range inside that registration.
    pub recv_offset: u64,
    /// Registration id of the rank's scratch buffer.
    pub scratch_reg: u64,
}

/// Words a board for `world_size` ranks needs: the words above, then the direct region
/// ([`direct_region_words`]) from the next page on.
pub fn board_words(world_size: usize) -> usize {
    direct_region_start(world_size) + direct_region_words(world_size)
}

/// Words of one page: the direct region starts on a page of its own, so it alone is page-locked.
const PAGE_WORDS: usize = 4096 / 8;
/// Words of a cache line: each direct word has a line of its own (GPUs of different ranks write
/// neighbouring words, and a GPU polls one from across PCIe).
pub const DIRECT_LINE_WORDS: usize = 8;

/// First word of the direct region (page-aligned).
fn direct_region_start(world_size: usize) -> usize {
    let before =
        HEADER_WORDS + world_size * RANK_WORDS + world_size * world_size + world_size * REG_ENTRIES * REG_ENTRY_WORDS;
    before.div_ceil(PAGE_WORDS) * PAGE_WORDS
}

/// Words of the direct region ([`super::direct`]): per ordered pair `(src, dst)` a `posted` and
/// a `freed` word, each on a cache line of its own, rounded up to whole pages.
pub fn direct_region_words(world_size: usize) -> usize {
    (2 * world_size * world_size * DIRECT_LINE_WORDS).div_ceil(PAGE_WORDS) * PAGE_WORDS
}

/// The two words of each ordered pair in the direct region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectWord {
    /// Written by `src`'s stream once its push of call `c` into `dst`'s inbox completed: `c`.
    Posted,
    /// Written by `src`'s stream once its reduction of call `c` read `dst`'s push: `c`.
    Freed,
}

/// Byte offset, inside the direct region, of word `which` of the pair `(src, dst)`.
pub fn direct_word_offset(world_size: usize, which: DirectWord, src: usize, dst: usize) -> usize {
    assert!(src < world_size && dst < world_size);
    let kind = match which {
        DirectWord::Posted => 0,
        DirectWord::Freed => 1,
    };
    ((kind * world_size + src) * world_size + dst) * DIRECT_LINE_WORDS * 8
}

/// How a registration's memory reaches a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exported {
    /// [`accord_cuda::IpcHandle::to_bytes`] of a `cuMemAlloc` allocation.
    Ipc([u8; IPC_HANDLE_BYTES]),
    /// VMM memory ([`accord_cuda::ipc::vmm`]): per mapping, in address order, the exporter's
    /// file descriptor and the mapping's size (a multiple of 4096 bytes); a peer takes the
    /// descriptors from the rank's pid and maps the pieces back to back.
    Vmm(Vec<(i32, u64)>),
}

/// A registration as a rank's table holds it: how its memory is exported and where the
/// registered range starts inside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registered {
    /// The memory, exported.
    pub exported: Exported,
    /// Offset of the registered range in the exported memory.
    pub offset: u64,
}

impl Registered {
    /// The entry's kind word and payload words; `None` for what an entry cannot hold (more than
    /// [`VMM_PIECES_INLINE`] pieces, a negative descriptor, a size not in whole pages or
    /// beyond 2^32 pages).
    fn encode(&self) -> Option<(u64, [u64; PAYLOAD_WORDS])> {
        let mut payload = [0u64; PAYLOAD_WORDS];
        match &self.exported {
            Exported::Ipc(handle) => {
                let mut padded = [0u8; HANDLE_WORDS * 8];
                padded[..IPC_HANDLE_BYTES].copy_from_slice(handle);
                for (word, chunk) in payload.iter_mut().zip(padded.chunks_exact(8)) {
                    *word = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
                }
                Some((KIND_IPC, payload))
            }
            Exported::Vmm(pieces) => {
                if pieces.is_empty() || pieces.len() > VMM_PIECES_INLINE {
                    return None;
                }
                for (word, &(fd, len)) in payload.iter_mut().zip(pieces) {
                    let pages = len / VMM_PAGE;
                    if fd < 0 || len % VMM_PAGE != 0 || pages == 0 || pages > u64::from(u32::MAX) {
                        return None;
                    }
                    *word = u64::from(fd as u32) | pages << 32;
                }
                Some((KIND_VMM | (pieces.len() as u64) << 8, payload))
            }
        }
    }

    /// The inverse of [`Registered::encode`]; a description of what is wrong otherwise.
    fn decode(kind: u64, payload: &[u64; PAYLOAD_WORDS], offset: u64) -> Result<Registered, String> {
        let exported = match kind & 0xff {
            KIND_IPC => {
                let mut handle = [0u8; IPC_HANDLE_BYTES];
                let bytes: Vec<u8> = payload[..HANDLE_WORDS].iter().flat_map(|w| w.to_le_bytes()).collect();
                handle.copy_from_slice(&bytes[..IPC_HANDLE_BYTES]);
                Exported::Ipc(handle)
            }
            KIND_VMM => {
                let count = (kind >> 8) as usize;
                if count == 0 || count > VMM_PIECES_INLINE {
                    return Err(format!("a VMM registration of {count} pieces (1..={VMM_PIECES_INLINE})"));
                }
                let pieces = payload[..count]
                    .iter()
                    .map(|&w| ((w & 0xffff_ffff) as u32 as i32, (w >> 32) * VMM_PAGE))
                    .collect::<Vec<_>>();
                if pieces.iter().any(|&(fd, len)| fd < 0 || len == 0) {
                    return Err("a VMM piece with a negative descriptor or no bytes".into());
                }
                Exported::Vmm(pieces)
            }
            other => return Err(format!("an entry of kind {other}")),
        };
        Ok(Registered { exported, offset })
    }
}

/// The flag words for `world_size` ranks, mapped in this process.
#[derive(Debug)]
pub struct Board {
    words: SharedMapping,
    world_size: usize,
}

impl Board {
    /// Creates the segment at `path` (which must not exist) for `world_size` ranks (rank 0).
    pub fn create(path: &Path, world_size: usize) -> GpuResult<Board> {
        let bytes = segment_bytes(path, world_size)?;
        Board::new(SharedMapping::create(path, bytes).map_err(shm_error)?, world_size)
    }

    /// Opens the segment rank 0 created at `path`; its length must be that of `world_size`
    /// ranks (a different one means the ranks run different builds or worlds).
    pub fn open(path: &Path, world_size: usize) -> GpuResult<Board> {
        let bytes = segment_bytes(path, world_size)?;
        Board::new(SharedMapping::open(path, bytes).map_err(shm_error)?, world_size)
    }

    fn new(words: SharedMapping, world_size: usize) -> GpuResult<Board> {
        if words.words().len() != board_words(world_size) {
            return Err(GpuCollError::InvalidArgument {
                what: format!("a board of {world_size} ranks needs {} words", board_words(world_size)),
            });
        }
        Ok(Board { words, world_size })
    }

    /// Removes the segment's name once every rank has it open (their mappings stay).
    pub fn unlink(&self) -> GpuResult<()> {
        self.words.unlink().map_err(shm_error)
    }

    /// Word `index` of the segment. Panics if out of range (our own layout's invariant).
    fn word(&self, index: usize) -> &AtomicU64 {
        &self.words.words()[index]
    }

    /// Rank 0 stamps the header of a fresh segment.
    pub fn init_header(&self) {
        self.word(1).store(self.world_size as u64, Ordering::Relaxed);
        self.word(0).store(MAGIC, Ordering::Release);
    }

    /// Checks the header rank 0 wrote.
    pub fn check_header(&self) -> GpuResult<()> {
        let magic = self.word(0).load(Ordering::Acquire);
        let world = self.word(1).load(Ordering::Relaxed);
        if magic != MAGIC || world != self.world_size as u64 {
            return Err(GpuCollError::Protocol {
                rank: 0,
                what: format!(
                    "flag segment header magic 0x{magic:x} world {world}, expected world {}",
                    self.world_size
                ),
            });
        }
        Ok(())
    }

    fn rank_word(&self, rank: usize, field: usize) -> &AtomicU64 {
        assert!(rank < self.world_size && field < RANK_WORDS);
        self.word(HEADER_WORDS + rank * RANK_WORDS + field)
    }

    fn done_word(&self, src: usize, dst: usize) -> &AtomicU64 {
        assert!(src < self.world_size && dst < self.world_size);
        self.word(HEADER_WORDS + self.world_size * RANK_WORDS + src * self.world_size + dst)
    }

    /// Word `which` of the ordered pair `(src, dst)` in the direct region.
    pub fn direct_word(&self, which: DirectWord, src: usize, dst: usize) -> &AtomicU64 {
        let offset = direct_word_offset(self.world_size, which, src, dst);
        self.word(direct_region_start(self.world_size) + offset / 8)
    }

    /// The direct region in this process: its first byte (page-aligned) and length (whole
    /// pages), for page-locking it so that streams write and wait on its words.
    pub fn direct_region(&self) -> (*mut u8, usize) {
        let words = self.words.words();
        let start = &words[direct_region_start(self.world_size)] as *const AtomicU64 as *mut u8;
        (start, direct_region_words(self.world_size) * 8)
    }

    fn reg_word(&self, rank: usize, entry: usize, field: usize) -> &AtomicU64 {
        assert!(rank < self.world_size && entry < REG_ENTRIES && field < REG_ENTRY_WORDS);
        let table = HEADER_WORDS + self.world_size * RANK_WORDS + self.world_size * self.world_size;
        self.word(table + (rank * REG_ENTRIES + entry) * REG_ENTRY_WORDS + field)
    }

    /// Writes `rank`'s registration `id` (nonzero) into its entry, the id last. Fails, writing
    /// nothing, for a registration an entry cannot hold (see [`Registered`]).
    pub fn publish_registration(&self, rank: usize, id: u64, reg: &Registered) -> GpuResult<()> {
        let Some((kind, payload)) = reg.encode() else {
            return Err(GpuCollError::InvalidArgument {
                what: format!(
                    "registration {id} cannot be published: VMM memory spans 1..={VMM_PIECES_INLINE} mappings of \
                     whole pages here"
                ),
            });
        };
        let entry = entry_of(id);
        self.reg_word(rank, entry, 0).store(0, Ordering::Release);
        self.reg_word(rank, entry, 1).store(kind, Ordering::Relaxed);
        for (i, word) in payload.iter().enumerate() {
            self.reg_word(rank, entry, 2 + i).store(*word, Ordering::Relaxed);
        }
        self.reg_word(rank, entry, 2 + PAYLOAD_WORDS).store(reg.offset, Ordering::Relaxed);
        self.reg_word(rank, entry, 0).store(id, Ordering::Release);
        Ok(())
    }

    /// Empties `rank`'s entry of registration `id` (if it still holds `id`).
    pub fn clear_registration(&self, rank: usize, id: u64) {
        let _ = self.reg_word(rank, entry_of(id), 0).compare_exchange(id, 0, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// `rank`'s registration `id`, as its table holds it now.
    pub fn read_registration(&self, rank: usize, id: u64) -> GpuResult<Registered> {
        let entry = entry_of(id);
        let before = self.reg_word(rank, entry, 0).load(Ordering::Acquire);
        let kind = self.reg_word(rank, entry, 1).load(Ordering::Relaxed);
        let mut payload = [0u64; PAYLOAD_WORDS];
        for (i, word) in payload.iter_mut().enumerate() {
            *word = self.reg_word(rank, entry, 2 + i).load(Ordering::Relaxed);
        }
        let offset = self.reg_word(rank, entry, 2 + PAYLOAD_WORDS).load(Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Acquire);
        let after = self.reg_word(rank, entry, 0).load(Ordering::Relaxed);
        if before != id || after != id {
            return Err(GpuCollError::Protocol {
                rank,
                what: format!("its registration {id} is not in its table (the entry holds {after})"),
            });
        }
        Registered::decode(kind, &payload, offset)
            .map_err(|what| GpuCollError::Protocol { rank, what: format!("its registration {id}: {what}") })
    }

    /// Marks `rank` open with its pid.
    pub fn open_rank(&self, rank: usize, pid: u32) {
        self.rank_word(rank, 0).store(u64::from(pid), Ordering::Relaxed);
        self.rank_word(rank, 1).store(STATE_OPEN, Ordering::Release);
    }

    /// Marks `rank` closed (its buffers are going away).
    pub fn close_rank(&self, rank: usize) {
        self.rank_word(rank, 1).store(STATE_CLOSED, Ordering::Release);
    }

    /// Tells every peer that `rank` gave up after an error.
    pub fn abort_rank(&self, rank: usize) {
        self.rank_word(rank, 2).store(1, Ordering::Release);
    }

    /// Publishes `slot` and then `ready = slot.seq`.
    pub fn post_ready(&self, rank: usize, slot: Slot) {
        let base = 8 + (slot.seq as usize % SLOTS) * SLOT_WORDS;
        self.rank_word(rank, base + 1).store(slot.recv_reg, Ordering::Relaxed);
        self.rank_word(rank, base + 2).store(slot.recv_offset, Ordering::Relaxed);
        self.rank_word(rank, base + 3).store(slot.scratch_reg, Ordering::Relaxed);
        self.rank_word(rank, base).store(slot.seq, Ordering::Relaxed);
        self.rank_word(rank, 3).store(slot.seq, Ordering::Release);
    }

    /// `rank`'s slot for round `seq` (call after seeing `ready >= seq`).
    pub fn read_slot(&self, rank: usize, seq: u64) -> GpuResult<Slot> {
        let base = 8 + (seq as usize % SLOTS) * SLOT_WORDS;
        let slot = Slot {
            seq: self.rank_word(rank, base).load(Ordering::Acquire),
            recv_reg: self.rank_word(rank, base + 1).load(Ordering::Relaxed),
            recv_offset: self.rank_word(rank, base + 2).load(Ordering::Relaxed),
            scratch_reg: self.rank_word(rank, base + 3).load(Ordering::Relaxed),
        };
        if slot.seq != seq {
            return Err(GpuCollError::Protocol {
                rank,
                what: format!("its slot holds round {} while I am in round {seq}", slot.seq),
            });
        }
        Ok(slot)
    }

    /// Bumps `rank`'s deregistration epoch (peers drop their mappings of it).
    pub fn bump_dereg_epoch(&self, rank: usize) {
        self.rank_word(rank, 4).fetch_add(1, Ordering::Release);
    }

    /// `rank`'s deregistration epoch.
    pub fn dereg_epoch(&self, rank: usize) -> u64 {
        self.rank_word(rank, 4).load(Ordering::Acquire)
    }

    /// Adds one finished push phase from `src` into `dst`.
    pub fn signal_done(&self, src: usize, dst: usize) {
        self.done_word(src, dst).fetch_add(1, Ordering::Release);
    }

    /// Waits until `ready[rank] >= seq`.
    pub fn wait_ready(&self, rank: usize, seq: u64, deadline: Deadline) -> GpuResult<()> {
        self.wait_until(
            rank,
            deadline,
            || format!("rank {rank} to reach round {seq}"),
            || self.rank_word(rank, 3).load(Ordering::Acquire) >= seq,
        )
    }

    /// Waits until `done[src][dst] >= count`.
    pub fn wait_done(&self, src: usize, dst: usize, count: u64, deadline: Deadline) -> GpuResult<()> {
        self.wait_until(
            src,
            deadline,
            || format!("rank {src}'s copies into rank {dst} (phase {count})"),
            || self.done_word(src, dst).load(Ordering::Acquire) >= count,
        )
    }

    /// Phases `src` has signalled into `dst` so far (a non-blocking read).
    pub fn done_count(&self, src: usize, dst: usize) -> u64 {
        self.done_word(src, dst).load(Ordering::Acquire)
    }

    /// The pid `rank` published when it opened (0 before).
    pub fn rank_pid(&self, rank: usize) -> u32 {
        self.rank_word(rank, 0).load(Ordering::Acquire) as u32
    }

    /// Fails if `rank` closed, aborted or exited.
    pub fn check_peer(&self, rank: usize) -> GpuResult<()> {
        let pid = self.rank_word(rank, 0).load(Ordering::Relaxed) as u32;
        if self.rank_word(rank, 2).load(Ordering::Acquire) != 0 {
            return Err(GpuCollError::PeerAborted { rank });
        }
        if self.rank_word(rank, 1).load(Ordering::Acquire) == STATE_CLOSED {
            return Err(GpuCollError::PeerGone { rank, pid, how: "closed its communicator" });
        }
        if pid != 0 && !accord_sys::process_alive(pid) {
            return Err(GpuCollError::PeerGone { rank, pid, how: "exited" });
        }
        Ok(())
    }

    /// Polls `done` (spin, then yield, then short sleeps: the engine's
    /// [`IdleBackoff`] with this board's step counts) until it holds, the
    /// deadline passes, or `peer` is gone. Liveness and the deadline are
    /// checked once the spin phase is over, every [`LIVENESS_CHECK_INTERVAL`].
    fn wait_until(
        &self,
        peer: usize,
        deadline: Deadline,
        what: impl Fn() -> String,
        done: impl Fn() -> bool,
    ) -> GpuResult<()> {
        let mut backoff = IdleBackoff::with_spin(SPIN_POLLS_MAX, SPIN_POLLS_MAX * 4, POLL_SLEEP_MAX);
        let mut last_check = Instant::now();
        loop {
            if done() {
                return Ok(());
            }
            if !backoff.will_spin() {
                let now = Instant::now();
                if now.duration_since(last_check) >= LIVENESS_CHECK_INTERVAL {
                    last_check = now;
                    if done() {
                        return Ok(());
                    }
                    self.check_peer(peer)?;
                    if now >= deadline.at {
                        return Err(GpuCollError::Timeout { what: what(), waited: deadline.budget });
                    }
                }
            }
            backoff.after_round(false);
        }
    }
}

/// The table entry of registration `id`.
pub fn entry_of(id: u64) -> usize {
    (id % REG_ENTRIES as u64) as usize
}

/// When a collective's waits give up, and the budget that was set.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    /// The instant.
    pub at: Instant,
    /// The budget it was made from (for messages).
    pub budget: Duration,
}

impl Deadline {
    /// `budget` from now.
    pub fn after(budget: Duration) -> Deadline {
        Deadline { at: Instant::now() + budget, budget }
    }
}

/// Bytes of the segment for `world_size` ranks, after checking the bounds.
fn segment_bytes(path: &Path, world_size: usize) -> GpuResult<usize> {
    if world_size == 0 || world_size > GPU_WORLD_SIZE_MAX {
        return Err(GpuCollError::InvalidArgument {
            what: format!("a board needs 1..={GPU_WORLD_SIZE_MAX} ranks, not {world_size}"),
        });
    }
    let words = board_words(world_size);
    if words > SEGMENT_WORDS_MAX {
        return Err(GpuCollError::SharedMemory {
            path: path.display().to_string(),
            reason: format!("{words} words is outside 1..={SEGMENT_WORDS_MAX}"),
        });
    }
    Ok(words * 8)
}

/// The board's error for a failed mapping: the path and the reason, a length mismatch
/// explained in the board's terms.
fn shm_error(e: SharedMapError) -> GpuCollError {
    let reason = match e.reason {
        SharedMapFailure::WrongLength { actual, expected } => {
            format!("is {actual} bytes, expected {expected}; ranks run different builds")
        }
        other => other.to_string(),
    };
    GpuCollError::SharedMemory { path: e.path.display().to_string(), reason }
}
