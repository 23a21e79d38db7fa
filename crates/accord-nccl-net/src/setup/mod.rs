//! Connection setup: a TCP side channel used only to exchange engine addresses and comm
//! descriptors; every byte of data then moves over the engine. `listen` binds a non-blocking
//! listener; `connect` and `accept` are state machines that advance a step per call and
//! return `None` until the comm is ready, as NCCL's ABI requires.

pub mod frame;

use crate::abi::NET_HANDLE_BYTES_MAX;
use crate::comm::recv::PreparedRecv;
use crate::comm::send::PreparedSend;
use crate::comm::{RecvComm, SendComm};
use crate::error::{PluginError, Result};
use crate::handle::{machine_fingerprint, Handle};
use crate::runtime::Runtime;
use accord_engine::{EngineAddress, MrDescriptor};
use frame::{FrameReader, FrameWriter};
use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Most `connect`s in progress at once in this process.
pub const CONNECTS_PENDING_MAX: usize = 1024;

/// What the connecting (sending) side tells the listener.
#[derive(Serialize, Deserialize)]
struct SenderHello {
    nonce: u64,
    address: EngineAddress,
    send_index: u32,
    ring: MrDescriptor,
}

/// The listener's answer.
#[derive(Serialize, Deserialize)]
struct ReceiverHello {
    address: EngineAddress,
    recv_index: u32,
    sizes: MrDescriptor,
    /// The receive comm's bounce pool (present when the receiver accepts GPU memory).
    #[serde(default)]
    bounce: Option<MrDescriptor>,
}

fn setup_error(peer: SocketAddr, reason: impl std::fmt::Display) -> PluginError {
    PluginError::Setup { peer: peer.to_string(), reason: reason.to_string() }
}

fn check_timeout(rt: &Runtime, started: Instant, peer: SocketAddr) -> Result<()> {
    if started.elapsed() > rt.config.setup_timeout {
        return Err(setup_error(
            peer,
            format!("no progress for {:?} (ACCORD_NET_SETUP_TIMEOUT_MS)", rt.config.setup_timeout),
        ));
    }
    Ok(())
}

/// A listen comm (NCCL's `listenComm`).
pub struct ListenComm {
    rt: Arc<Runtime>,
    listener: TcpListener,
    nonce: u64,
    accepting: Mutex<Option<Accepting>>,
}

impl std::fmt::Debug for ListenComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenComm").field("listener", &self.listener.local_addr().ok()).finish_non_exhaustive()
    }
}

struct Accepting {
    stream: TcpStream,
    peer: SocketAddr,
    started: Instant,
    stage: AcceptStage,
}

enum AcceptStage {
    Reading(FrameReader),
    Replying(FrameWriter, RecvComm),
}

static NONCES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl ListenComm {
    /// Binds the setup listener on device `dev` (never blocks); the handle to give peers.
    pub fn new(rt: Arc<Runtime>, dev: i32) -> Result<(ListenComm, Handle)> {
        let ip = rt.device(dev)?.ip;
        let bind = SocketAddr::new(ip, 0);
        let listener = TcpListener::bind(bind).map_err(|e| setup_error(bind, format!("binding the listener: {e}")))?;
        listener.set_nonblocking(true).map_err(|e| setup_error(bind, e))?;
        let addr = listener.local_addr().map_err(|e| setup_error(bind, e))?;
        let nonce = (u64::from(std::process::id()) << 32)
            ^ NONCES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ^ rt.engine.id().0.rotate_left(17);
        let handle = Handle { addr, nonce, stage: 0, machine: machine_fingerprint() };
        Ok((ListenComm { rt, listener, nonce, accepting: Mutex::new(None) }, handle))
    }

    /// Advances the accept; the receive comm once the sender is connected.
    pub fn accept(&self) -> Result<Option<RecvComm>> {
        let mut slot = self.accepting.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    stream.set_nonblocking(true).map_err(|e| setup_error(peer, e))?;
                    let _ = stream.set_nodelay(true);
                    let stage = AcceptStage::Reading(FrameReader::default());
                    *slot = Some(Accepting { stream, peer, started: Instant::now(), stage });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => return Ok(None),
                Err(e) => return Err(setup_error(self.listener.local_addr().unwrap_or(([0, 0, 0, 0], 0).into()), e)),
            }
        }
        let mut accepting = slot.take().expect("set above");
        match self.advance(&mut accepting) {
            Ok(Some(comm)) => Ok(Some(comm)),
            Ok(None) => {
                *slot = Some(accepting);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn advance(&self, a: &mut Accepting) -> Result<Option<RecvComm>> {
        check_timeout(&self.rt, a.started, a.peer)?;
        if let AcceptStage::Reading(reader) = &mut a.stage {
            let Some(payload) = reader.advance(&mut a.stream).map_err(|e| setup_error(a.peer, e))? else {
                return Ok(None);
            };
            let hello: SenderHello =
                serde_json::from_slice(&payload).map_err(|e| setup_error(a.peer, format!("malformed hello: {e}")))?;
            if hello.nonce != self.nonce {
                return Err(setup_error(a.peer, "the hello names another listener (stale handle?)"));
            }
            self.rt.engine.add_peer(&hello.address)?;
            let prepared = PreparedRecv::new(self.rt.clone())?;
            let reply = ReceiverHello {
                address: self.rt.engine.address(),
                recv_index: prepared.index(),
                sizes: prepared.sizes_descriptor(),
                bounce: prepared.bounce_descriptor(),
            };
            let payload = serde_json::to_vec(&reply).expect("hellos serialise");
            let comm = prepared.finish(hello.address.id, hello.send_index, hello.ring);
            a.stage = AcceptStage::Replying(FrameWriter::new(&payload), comm);
        }
        let AcceptStage::Replying(writer, _) = &mut a.stage else { unreachable!("read stage handled above") };
        if !writer.advance(&mut a.stream).map_err(|e| setup_error(a.peer, e))? {
            return Ok(None);
        }
        let stage = std::mem::replace(&mut a.stage, AcceptStage::Reading(FrameReader::default()));
        let AcceptStage::Replying(_, comm) = stage else { unreachable!("matched above") };
        Ok(Some(comm))
    }
}

/// A `connect` in progress.
struct Connecting {
    peer: SocketAddr,
    nonce: u64,
    started: Instant,
    stage: ConnectStage,
    prepared: Option<PreparedSend>,
}

enum ConnectStage {
    Connecting(Socket),
    Writing(TcpStream, FrameWriter),
    Reading(TcpStream, FrameReader),
}

#[derive(Default)]
struct ConnectTable {
    pending: HashMap<u64, Connecting>,
    next_id: u64,
}

static CONNECTS: Mutex<Option<ConnectTable>> = Mutex::new(None);

/// Refuses a handle whose listener is on a loopback address of another machine: connecting
/// would reach our own loopback (nothing, or the wrong process) and hang until the setup
/// timeout. Unknown fingerprints (0, on either side) are not judged.
fn check_reachable_loopback(handle: &Handle, here: u64) -> Result<()> {
    if handle.addr.ip().is_loopback() && handle.machine != 0 && here != 0 && handle.machine != here {
        return Err(PluginError::LoopbackAcrossMachines { peer: handle.addr.to_string() });
    }
    Ok(())
}

/// Advances the connect to the listener named by `handle` (NCCL's copy of the peer's handle,
/// passed again on every retry); the send comm once connected.
pub fn connect(rt: &Arc<Runtime>, dev: i32, handle: &mut [u8; NET_HANDLE_BYTES_MAX]) -> Result<Option<SendComm>> {
    let decoded = Handle::decode(handle)?;
    let existing = {
        let mut table = CONNECTS.lock().unwrap_or_else(|e| e.into_inner());
        table.get_or_insert_with(Default::default).pending.remove(&decoded.stage)
    };
    let mut connecting = match existing {
        Some(c) => c,
        None => start_connect(rt, dev, decoded)?,
    };
    match advance_connect(rt, &mut connecting) {
        Ok(Some(comm)) => {
            Handle::set_stage(handle, 0);
            Ok(Some(comm))
        }
        Ok(None) => {
            let mut table = CONNECTS.lock().unwrap_or_else(|e| e.into_inner());
            let table = table.get_or_insert_with(Default::default);
            if table.pending.len() >= CONNECTS_PENDING_MAX {
                return Err(PluginError::TableFull { what: "the pending-connect table", max: CONNECTS_PENDING_MAX });
            }
            table.next_id += 1;
            let id = table.next_id;
            table.pending.insert(id, connecting);
            Handle::set_stage(handle, id);
            Ok(None)
        }
        Err(e) => {
            Handle::set_stage(handle, 0);
            Err(e)
        }
    }
}

fn start_connect(rt: &Arc<Runtime>, dev: i32, handle: Handle) -> Result<Connecting> {
    let local = rt.device(dev)?.ip;
    let peer = handle.addr;
    check_reachable_loopback(&handle, machine_fingerprint())?;
    let socket = Socket::new(Domain::for_address(peer), Type::STREAM, Some(Protocol::TCP))
        .map_err(|e| setup_error(peer, format!("creating a socket: {e}")))?;
    socket.set_nonblocking(true).map_err(|e| setup_error(peer, e))?;
    let _ = socket.set_nodelay(true);
    if local.is_ipv4() == peer.is_ipv4() {
        // Leave from the device's address when we can; routing decides otherwise.
        let _ = socket.bind(&SockAddr::from(SocketAddr::new(local, 0)));
    }
    match socket.connect(&SockAddr::from(peer)) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) || e.kind() == ErrorKind::WouldBlock => {}
        Err(e) => return Err(setup_error(peer, format!("connecting: {e}"))),
    }
    Ok(Connecting {
        peer,
        nonce: handle.nonce,
        started: Instant::now(),
        stage: ConnectStage::Connecting(socket),
        prepared: Some(PreparedSend::new(rt.clone())?),
    })
}

fn advance_connect(rt: &Arc<Runtime>, c: &mut Connecting) -> Result<Option<SendComm>> {
    check_timeout(rt, c.started, c.peer)?;
    let peer = c.peer;
    if let ConnectStage::Connecting(socket) = &c.stage {
        if let Some(e) = socket.take_error().map_err(|e| setup_error(peer, e))? {
            return Err(setup_error(peer, format!("connecting: {e}")));
        }
        match socket.peer_addr() {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotConnected => return Ok(None),
            Err(e) => return Err(setup_error(peer, format!("connecting: {e}"))),
        }
        let prepared = c.prepared.as_ref().expect("present until finished");
        let hello = SenderHello {
            nonce: c.nonce,
            address: rt.engine.address(),
            send_index: prepared.index(),
            ring: prepared.ring_descriptor(),
        };
        let payload = serde_json::to_vec(&hello).expect("hellos serialise");
        let socket = socket.try_clone().map_err(|e| setup_error(peer, e))?;
        c.stage = ConnectStage::Writing(TcpStream::from(socket), FrameWriter::new(&payload));
    }
    if let ConnectStage::Writing(stream, writer) = &mut c.stage {
        if !writer.advance(stream).map_err(|e| setup_error(peer, e))? {
            return Ok(None);
        }
        let stream = stream.try_clone().map_err(|e| setup_error(peer, e))?;
        c.stage = ConnectStage::Reading(stream, FrameReader::default());
    }
    let ConnectStage::Reading(stream, reader) = &mut c.stage else { unreachable!("earlier stages handled above") };
    let Some(payload) = reader.advance(stream).map_err(|e| setup_error(peer, e))? else {
        return Ok(None);
    };
    let reply: ReceiverHello =
        serde_json::from_slice(&payload).map_err(|e| setup_error(peer, format!("malformed reply: {e}")))?;
    rt.engine.add_peer(&reply.address)?;
    let prepared = c.prepared.take().expect("present until finished");
    Ok(Some(prepared.finish(reply.address.id, reply.recv_index, reply.sizes, reply.bounce)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(addr: &str, machine: u64) -> Handle {
        Handle { addr: addr.parse().unwrap(), nonce: 1, stage: 0, machine }
    }

    #[test]
    fn only_another_machines_loopback_is_refused() {
        let refused = |h: &Handle, here: u64| check_reachable_loopback(h, here).is_err();
        assert!(refused(&handle("127.0.0.1:9", 7), 8), "another machine's loopback");
        assert!(refused(&handle("[::1]:9", 7), 8), "IPv6 loopback too");
        assert!(!refused(&handle("127.0.0.1:9", 7), 7), "our own loopback");
        assert!(!refused(&handle("10.0.0.2:9", 7), 8), "a routable address on another machine");
        assert!(!refused(&handle("127.0.0.1:9", 0), 8), "an older handle: unknown machine");
        assert!(!refused(&handle("127.0.0.1:9", 7), 0), "our machine unknown");
        let e = check_reachable_loopback(&handle("127.0.0.1:9", 7), 8).unwrap_err();
        assert_eq!(e.code(), crate::abi::NCCL_INVALID_USAGE);
        assert!(e.to_string().contains("ACCORD_NET_IFS"), "{e}");
    }
}
