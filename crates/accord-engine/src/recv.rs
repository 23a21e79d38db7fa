//! Posted receive buffers for two-sided sends, and the handler that consumes them.

use crate::completion::{dispatch, JobSender};
use accord_proto::wire::RejectReason;
use accord_proto::RecvBufferId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Most receive buffers one engine holds posted at once.
pub const RECV_BUFFERS_MAX: usize = 65_536;
/// Largest receive buffer.
pub const RECV_BUFFER_BYTES_MAX: usize = 64 << 20;

/// A message a peer sent, as the receive handler sees it.
#[derive(Debug)]
pub struct RecvMessage<'a> {
    /// The bytes (valid only during the handler call; copy what you keep).
    pub data: &'a [u8],
    /// The immediate the sender attached, if any.
    pub imm: Option<u32>,
}

/// The receive handler: runs on the completion thread, once per message.
pub type RecvHandler = Arc<dyn Fn(RecvMessage<'_>) + Send + Sync>;

#[derive(Default)]
struct Inner {
    free: Vec<Vec<u8>>,
    claimed: HashMap<u64, Vec<u8>>,
    next_id: u64,
    handler: Option<RecvHandler>,
}

/// The pool, shared by the engine's workers.
#[derive(Default)]
pub(crate) struct RecvPool {
    inner: Arc<Mutex<Inner>>,
}

impl RecvPool {
    /// Adds `count` buffers of `len` bytes and sets the handler. Returns how many were added
    /// (fewer when [`RECV_BUFFERS_MAX`] is reached).
    pub(crate) fn post(&self, len: usize, count: usize, handler: RecvHandler) -> usize {
        let mut inner = self.inner.lock().unwrap();
        let room = RECV_BUFFERS_MAX.saturating_sub(inner.free.len() + inner.claimed.len());
        let added = count.min(room);
        inner.free.extend((0..added).map(|_| vec![0u8; len]));
        inner.handler = Some(handler);
        added
    }

    /// Claims a free buffer at least `msg_len` long.
    pub(crate) fn claim(&self, msg_len: u64) -> Result<RecvBufferId, RejectReason> {
        let mut inner = self.inner.lock().unwrap();
        if inner.free.is_empty() {
            return Err(RejectReason::NoRecvBuffer);
        }
        let Some(i) = inner.free.iter().position(|b| b.len() as u64 >= msg_len) else {
            return Err(RejectReason::MessageTooLarge);
        };
        let buf = inner.free.swap_remove(i);
        inner.next_id += 1;
        let id = inner.next_id;
        inner.claimed.insert(id, buf);
        Ok(RecvBufferId(id))
    }

    /// Copies received bytes into a claimed buffer.
    pub(crate) fn place(&self, id: RecvBufferId, offset: u64, bytes: &[u8]) -> bool {
        let mut inner = self.inner.lock().unwrap();
        let Some(buf) = inner.claimed.get_mut(&id.0) else { return false };
        let start = offset as usize;
        match buf.get_mut(start..start + bytes.len()) {
            Some(dst) => {
                dst.copy_from_slice(bytes);
                true
            }
            None => false,
        }
    }

    /// As [`RecvPool::place`], with the bytes `start..start + len` of a datagram the datapath
    /// lent in place.
    pub(crate) fn place_lent(
        &self,
        id: RecvBufferId,
        offset: u64,
        lent: &accord_net::LentBytes,
        start: usize,
        len: usize,
    ) -> bool {
        let mut inner = self.inner.lock().unwrap();
        let Some(buf) = inner.claimed.get_mut(&id.0) else { return false };
        let at = offset as usize;
        match buf.get_mut(at..at + len) {
            Some(dst) => lent.copy_to_slice(start, dst),
            None => false,
        }
    }

    /// A message filled `len` bytes of `id`: hand it to the handler, then re-post the buffer.
    pub(crate) fn complete(&self, id: RecvBufferId, len: u64, imm: Option<u32>, jobs: &JobSender) {
        let (buf, handler) = {
            let mut inner = self.inner.lock().unwrap();
            let Some(buf) = inner.claimed.remove(&id.0) else { return };
            (buf, inner.handler.clone())
        };
        let inner = self.inner.clone();
        dispatch(jobs, move || {
            if let Some(h) = handler {
                h(RecvMessage { data: &buf[..(len as usize).min(buf.len())], imm });
            }
            inner.lock().unwrap().free.push(buf);
        });
    }

    /// Returns a claimed buffer to the pool without delivering it (a duplicate of a message
    /// already delivered, resent after a failover).
    pub(crate) fn discard(&self, id: RecvBufferId) {
        let mut inner = self.inner.lock().unwrap();
        if let Some(buf) = inner.claimed.remove(&id.0) {
            inner.free.push(buf);
        }
    }

    /// Direct delivery from a peer in the same process: claim, copy, complete.
    pub(crate) fn deliver_local(&self, bytes: &[u8], imm: Option<u32>, jobs: &JobSender) -> Result<(), RejectReason> {
        let id = self.claim(bytes.len() as u64)?;
        self.place(id, 0, bytes);
        self.complete(id, bytes.len() as u64, imm, jobs);
        Ok(())
    }
}
