//! [`LocalTransport`]: an in-process [`CollTransport`] for ranks that are
//! threads of one process — the test transport, and the same-process fast
//! path. A write is a `memcpy` into the peer's registered buffer followed by a
//! bump of the peer's immediate counter, so writes complete synchronously and
//! [`CollTransport::flush`] has nothing to wait for.
//!
//! Registered memory lives in a fabric-wide table of `Mutex<Vec<u8>>`; a write
//! locks source and destination in id order (one lock when they are the same
//! buffer), so concurrent writers can never deadlock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::error::TransportError;
use crate::transport::{
    BufSlice, CheckedWrite, CollTransport, LocalAccessFn, LocalBuf, RemoteBufDesc, CTRL_MESSAGE_BYTES_MAX,
    WORLD_SIZE_MAX,
};

/// Most distinct immediate values one rank may have pending (arrived, not yet
/// consumed).
pub const IMM_VALUES_PENDING_MAX: usize = 1 << 16;
/// Most control messages one rank may have pending.
pub const CTRL_PENDING_MAX: usize = 1 << 16;

type Mem = Arc<Mutex<Vec<u8>>>;

struct BufEntry {
    owner: usize,
    key: u64,
    mem: Mem,
}

#[derive(Default)]
struct Inbox {
    imms: HashMap<u32, u64>,
    ctrl: HashMap<(usize, u32), Vec<u8>>,
    /// Stuck reports by reporter (bounded by the world size).
    stuck: std::collections::BTreeMap<usize, usize>,
}

#[derive(Default)]
struct RankState {
    inbox: Mutex<Inbox>,
    arrived: Condvar,
}

struct Fabric {
    world_size: usize,
    bufs: Mutex<HashMap<u64, BufEntry>>,
    next_id: AtomicU64,
    ranks: Vec<RankState>,
}

/// Creates the [`LocalTransport`]s of one in-process world.
pub struct LocalFabric;

impl LocalFabric {
    /// One transport per rank of a world of `world_size` ranks (1..=1024).
    pub fn create(world_size: usize) -> Result<Vec<LocalTransport>, TransportError> {
        if world_size == 0 || world_size > WORLD_SIZE_MAX {
            return Err(TransportError::BadRank { rank: world_size, world_size: WORLD_SIZE_MAX });
        }
        let fabric = Arc::new(Fabric {
            world_size,
            bufs: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            ranks: (0..world_size).map(|_| RankState::default()).collect(),
        });
        Ok((0..world_size)
            .map(|rank| LocalTransport {
                fabric: fabric.clone(),
                rank,
                writes_until_stop: AtomicUsize::new(usize::MAX),
                stopped: AtomicBool::new(false),
                deaths: Mutex::default(),
            })
            .collect())
    }
}

/// One rank's handle on an in-process fabric.
pub struct LocalTransport {
    fabric: Arc<Fabric>,
    rank: usize,
    writes_until_stop: AtomicUsize,
    stopped: AtomicBool,
    /// Ranks this rank's view holds dead, with the reason (see [`Self::declare_dead`]).
    deaths: Mutex<std::collections::HashMap<usize, String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking rank thread must not take the others down with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn key_of(id: u64) -> u64 {
    id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5bd1_e995
}

impl LocalTransport {
    /// Fault injection: after `writes` more writes/signals/control sends, this
    /// rank stops — later ones are silently dropped and its waits fail with
    /// [`TransportError::Stopped`], as if the process had died mid-collective.
    pub fn stop_after_writes(&self, writes: usize) {
        self.writes_until_stop.store(writes, Ordering::SeqCst);
        if writes == 0 {
            self.stopped.store(true, Ordering::SeqCst);
        }
    }

    /// Fault injection: from now on this rank's transport says `rank` is dead for `reason`,
    /// as an engine's liveness watch does once a peer's process exits.
    pub fn declare_dead(&self, rank: usize, reason: &str) {
        lock(&self.deaths).insert(rank, reason.to_string());
    }

    /// Whether this rank has stopped (see [`Self::stop_after_writes`]).
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Counts one outgoing operation; false if it must be dropped.
    fn admit_outgoing(&self) -> bool {
        if self.is_stopped() {
            return false;
        }
        let left = self.writes_until_stop.load(Ordering::SeqCst);
        if left == usize::MAX {
            return true;
        }
        if left == 0 {
            self.stopped.store(true, Ordering::SeqCst);
            return false;
        }
        self.writes_until_stop.store(left - 1, Ordering::SeqCst);
        true
    }

    fn local_mem(&self, buf: &LocalBuf) -> Result<Mem, TransportError> {
        let bufs = lock(&self.fabric.bufs);
        match bufs.get(&buf.id()) {
            Some(e) if e.owner == self.rank => Ok(e.mem.clone()),
            _ => Err(TransportError::NotRegistered { what: format!("local buffer {}", buf.id()) }),
        }
    }

    fn remote_mem(&self, desc: &RemoteBufDesc) -> Result<(u64, Mem), TransportError> {
        let not_registered = || TransportError::NotRegistered { what: format!("remote buffer of rank {}", desc.rank) };
        if desc.token.len() != 16 {
            return Err(not_registered());
        }
        let mut token = accord_proto::frame::FrameReader::new(&desc.token);
        let (Ok(id), Ok(key)) = (token.u64(), token.u64()) else { return Err(not_registered()) };
        let bufs = lock(&self.fabric.bufs);
        match bufs.get(&id) {
            Some(e) if e.owner == desc.rank && e.key == key => Ok((id, e.mem.clone())),
            _ => Err(not_registered()),
        }
    }

    fn deliver_imm(&self, peer: usize, imm: u32) -> Result<(), TransportError> {
        let state = &self.fabric.ranks[peer];
        let mut inbox = lock(&state.inbox);
        if !inbox.imms.contains_key(&imm) && inbox.imms.len() >= IMM_VALUES_PENDING_MAX {
            return Err(TransportError::LimitReached { what: "pending immediates", limit: IMM_VALUES_PENDING_MAX });
        }
        *inbox.imms.entry(imm).or_insert(0) += 1;
        state.arrived.notify_all();
        Ok(())
    }

    /// Blocks on this rank's inbox until `ready` yields a value or the deadline.
    fn wait_inbox<R>(
        &self,
        deadline: Instant,
        what: &dyn Fn() -> String,
        mut ready: impl FnMut(&mut Inbox) -> Option<R>,
    ) -> Result<R, TransportError> {
        let start = Instant::now();
        let state = &self.fabric.ranks[self.rank];
        let mut inbox = lock(&state.inbox);
        loop {
            if self.is_stopped() {
                return Err(TransportError::Stopped);
            }
            if let Some((&reported_by, &waiting_on)) = inbox.stuck.iter().next() {
                return Err(TransportError::Aborted { reported_by, waiting_on });
            }
            if let Some(r) = ready(&mut inbox) {
                return Ok(r);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TransportError::Timeout { what: what(), waited: now - start });
            }
            inbox = state.arrived.wait_timeout(inbox, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// Copies `len` bytes between two regions of one vector (they may overlap).
fn copy_within(v: &mut [u8], src: usize, dst: usize, len: usize) {
    v.copy_within(src..src + len, dst);
}

impl CollTransport for LocalTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.fabric.world_size
    }

    fn register(&self, memory: Vec<u8>) -> Result<LocalBuf, TransportError> {
        let id = self.fabric.next_id.fetch_add(1, Ordering::Relaxed);
        let key = key_of(id);
        let len = memory.len();
        let mut token = id.to_le_bytes().to_vec();
        token.extend_from_slice(&key.to_le_bytes());
        let desc = RemoteBufDesc { rank: self.rank, len: len as u64, token };
        lock(&self.fabric.bufs).insert(id, BufEntry { owner: self.rank, key, mem: Arc::new(Mutex::new(memory)) });
        Ok(LocalBuf::new(id, len, desc))
    }

    fn deregister(&self, buf: LocalBuf) -> Result<Vec<u8>, TransportError> {
        let mut bufs = lock(&self.fabric.bufs);
        match bufs.get(&buf.id()) {
            Some(e) if e.owner == self.rank => {
                let entry = bufs.remove(&buf.id()).expect("present");
                drop(bufs);
                let memory = std::mem::take(&mut *lock(&entry.mem));
                Ok(memory)
            }
            _ => Err(TransportError::NotRegistered { what: format!("local buffer {}", buf.id()) }),
        }
    }

    fn write_checked(&self, write: CheckedWrite<'_>) -> Result<(), TransportError> {
        let CheckedWrite { peer, src, dst, imm } = write;
        let src_mem = self.local_mem(src.buf)?;
        let (dst_id, dst_mem) = self.remote_mem(dst.desc)?;
        if !self.admit_outgoing() {
            return Ok(());
        }
        if src.len > 0 {
            if Arc::ptr_eq(&src_mem, &dst_mem) {
                copy_within(&mut lock(&src_mem), src.offset, dst.offset, src.len);
            } else {
                let (first, second) = if src.buf.id() < dst_id { (&src_mem, &dst_mem) } else { (&dst_mem, &src_mem) };
                let mut a = lock(first);
                let mut b = lock(second);
                let (s, d) = if src.buf.id() < dst_id { (&*a, &mut *b) } else { (&*b, &mut *a) };
                d[dst.offset..dst.offset + src.len].copy_from_slice(&s[src.offset..src.offset + src.len]);
            }
        }
        if let Some(imm) = imm {
            self.deliver_imm(peer, imm)?;
        }
        Ok(())
    }

    fn signal(&self, peer: usize, imm: u32) -> Result<(), TransportError> {
        self.check_peer(peer)?;
        if !self.admit_outgoing() {
            return Ok(());
        }
        self.deliver_imm(peer, imm)
    }

    fn host_memory_dir(&self) -> Option<std::path::PathBuf> {
        Some("/dev/shm".into())
    }

    fn flush(&self, _deadline: Instant) -> Result<(), TransportError> {
        if self.is_stopped() {
            return Err(TransportError::Stopped);
        }
        Ok(())
    }

    fn wait_imm(&self, imm: u32, count: u32, deadline: Instant) -> Result<(), TransportError> {
        let what = || format!("{count} immediate(s) {:?}", crate::transport::Imm::decode(imm));
        self.wait_inbox(deadline, &what, |inbox| {
            let have = inbox.imms.get(&imm).copied().unwrap_or(0);
            if have < u64::from(count) {
                return None;
            }
            if have == u64::from(count) {
                inbox.imms.remove(&imm);
            } else {
                inbox.imms.insert(imm, have - u64::from(count));
            }
            Some(())
        })
    }

    fn send_ctrl(&self, peer: usize, tag: u32, bytes: &[u8]) -> Result<(), TransportError> {
        self.check_peer(peer)?;
        if bytes.len() > CTRL_MESSAGE_BYTES_MAX {
            return Err(TransportError::LimitReached { what: "control message bytes", limit: CTRL_MESSAGE_BYTES_MAX });
        }
        if !self.admit_outgoing() {
            return Ok(());
        }
        let state = &self.fabric.ranks[peer];
        let mut inbox = lock(&state.inbox);
        if inbox.ctrl.len() >= CTRL_PENDING_MAX {
            return Err(TransportError::LimitReached { what: "pending control messages", limit: CTRL_PENDING_MAX });
        }
        inbox.ctrl.insert((self.rank, tag), bytes.to_vec());
        state.arrived.notify_all();
        Ok(())
    }

    fn recv_ctrl(&self, peer: usize, tag: u32, deadline: Instant) -> Result<Vec<u8>, TransportError> {
        self.check_peer(peer)?;
        let what = || format!("control message {:?} from rank {peer}", crate::transport::Imm::decode(tag));
        self.wait_inbox(deadline, &what, |inbox| inbox.ctrl.remove(&(peer, tag)))
    }

    fn access_local(
        &self,
        src: BufSlice<'_>,
        dst: BufSlice<'_>,
        f: &mut LocalAccessFn<'_>,
    ) -> Result<(), TransportError> {
        let src_mem = self.local_mem(src.buf)?;
        let dst_mem = self.local_mem(dst.buf)?;
        crate::transport::check_local_access(src, dst, Arc::ptr_eq(&src_mem, &dst_mem))?;
        if Arc::ptr_eq(&src_mem, &dst_mem) {
            let (s0, d0) = (src.offset, dst.offset);
            let mut v = lock(&src_mem);
            if s0 + src.len <= d0 {
                let (left, right) = v.split_at_mut(d0);
                f(&left[s0..s0 + src.len], &mut right[..dst.len]);
            } else {
                let (left, right) = v.split_at_mut(s0);
                f(&right[..src.len], &mut left[d0..d0 + dst.len]);
            }
        } else {
            let (first, second) = if src.buf.id() < dst.buf.id() { (&src_mem, &dst_mem) } else { (&dst_mem, &src_mem) };
            let mut a = lock(first);
            let mut b = lock(second);
            let (s, d) = if src.buf.id() < dst.buf.id() { (&*a, &mut *b) } else { (&*b, &mut *a) };
            f(&s[src.offset..src.offset + src.len], &mut d[dst.offset..dst.offset + dst.len]);
        }
        Ok(())
    }

    fn read_local(&self, src: BufSlice<'_>, out: &mut [u8]) -> Result<(), TransportError> {
        src.check("local read")?;
        let mem = self.local_mem(src.buf)?;
        let v = lock(&mem);
        let n = out.len().min(src.len);
        out[..n].copy_from_slice(&v[src.offset..src.offset + n]);
        Ok(())
    }

    fn write_local(&self, dst: BufSlice<'_>, data: &[u8]) -> Result<(), TransportError> {
        dst.check("local write")?;
        let mem = self.local_mem(dst.buf)?;
        let mut v = lock(&mem);
        let n = data.len().min(dst.len);
        v[dst.offset..dst.offset + n].copy_from_slice(&data[..n]);
        Ok(())
    }

    fn report_stuck(&self, waiting_on: usize) {
        for (peer, state) in self.fabric.ranks.iter().enumerate() {
            if peer == self.rank || self.is_stopped() {
                continue;
            }
            let mut inbox = lock(&state.inbox);
            inbox.stuck.entry(self.rank).or_insert(waiting_on);
            state.arrived.notify_all();
        }
    }

    fn stuck_reports(&self) -> Vec<(usize, usize)> {
        lock(&self.fabric.ranks[self.rank].inbox).stuck.iter().map(|(&r, &w)| (r, w)).collect()
    }

    fn peer_death(&self, rank: usize) -> Option<String> {
        lock(&self.deaths).get(&rank).cloned()
    }
}

#[cfg(test)]
mod tests;
