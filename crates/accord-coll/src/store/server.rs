//! The store server: one thread accepting, one thread per connection (at most
//! [`CONNECTIONS_MAX`]), a map under a mutex with a condvar for blocking gets.

use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::wire::*;
use crate::error::StoreError;

/// Most client connections the server serves at once.
pub const CONNECTIONS_MAX: usize = 4096;
/// Longest a single blocking request may wait, whatever the client asks.
pub const REQUEST_WAIT_MAX: Duration = Duration::from_secs(3600);

/// How long a client has to answer the admission challenge before its connection is closed.
pub const CHALLENGE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct State {
    /// When set, clients must prove they hold it before any request (see `admit`).
    secret: Option<accord_proto::JobSecret>,
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
    stop: AtomicBool,
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_conn: std::sync::atomic::AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running store server; stops (and closes its connections) on drop.
pub struct StoreServer {
    addr: SocketAddr,
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Binds `addr` (port 0 for an ephemeral port) and starts serving anyone who connects.
    pub fn start(addr: impl ToSocketAddrs) -> Result<StoreServer, StoreError> {
        Self::start_with_secret(addr, None)
    }

    /// Binds `addr` and starts serving; with a `secret`, only clients that answer a fresh
    /// challenge with its proof get a request served (the secret never travels).
    pub fn start_with_secret(
        addr: impl ToSocketAddrs,
        secret: Option<accord_proto::JobSecret>,
    ) -> Result<StoreServer, StoreError> {
        let listener = TcpListener::bind(addr).map_err(|e| {
            io("binding the bootstrap store at MASTER_ADDR:MASTER_PORT (is it this host's, and free?)", e)
        })?;
        let addr = listener.local_addr().map_err(|e| io("reading the store's address", e))?;
        let state = Arc::new(State { secret, ..State::default() });
        let st = state.clone();
        let accept = std::thread::Builder::new()
            .name("accord-store".into())
            .spawn(move || accept_loop(listener, st))
            .map_err(|e| io("spawning the store thread", e))?;
        Ok(StoreServer { addr, state, accept: Some(accept) })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        self.state.changed.notify_all();
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        for (_, c) in lock(&self.state.conns).drain() {
            let _ = c.shutdown(Shutdown::Both);
        }
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop(listener: TcpListener, state: Arc<State>) {
    for stream in listener.incoming() {
        if state.stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = stream else { continue };
        let id = state.next_conn.fetch_add(1, Ordering::Relaxed);
        {
            let mut conns = lock(&state.conns);
            if conns.len() >= CONNECTIONS_MAX {
                tracing::warn!("bootstrap store: connection limit {CONNECTIONS_MAX} reached, refusing");
                continue;
            }
            if let Ok(c) = stream.try_clone() {
                conns.insert(id, c);
            }
        }
        let st = state.clone();
        let _ = std::thread::Builder::new().name("accord-store-conn".into()).spawn(move || {
            serve(&stream, &st);
            lock(&st.conns).remove(&id);
            let _ = stream.shutdown(Shutdown::Both);
        });
    }
}

/// Greets a new client and, when the store has a secret, checks its answer to a fresh
/// challenge. False: the client is refused (told why when it can be) and must be dropped.
fn admit(mut stream: &TcpStream, state: &State) -> bool {
    let Some(secret) = &state.secret else {
        return write_frame(&mut stream, &[GREET_OPEN]).is_ok();
    };
    let mut nonce = [0u8; NONCE_BYTES];
    let random = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut nonce));
    if random.is_err() {
        tracing::error!("bootstrap store: no randomness for a challenge; refusing the client");
        return false;
    }
    let mut greeting = vec![GREET_CHALLENGE];
    greeting.extend_from_slice(&nonce);
    if write_frame(&mut stream, &greeting).is_err() || stream.set_read_timeout(Some(CHALLENGE_TIMEOUT)).is_err() {
        return false;
    }
    let answer = read_frame(&mut stream);
    let proven = matches!(&answer, Ok(Some(proof))
        if accord_proto::admission::verify_challenge(secret, CHALLENGE_LABEL, &nonce, proof));
    if !proven {
        tracing::warn!(peer = ?stream.peer_addr().ok(), "bootstrap store: a client without the job secret was refused");
        let reason = "not admitted: this store requires the job secret (ACCORD_JOB_SECRET)";
        let _ = write_frame(&mut stream, &Enc::default().u8(ST_ERROR).bytes(reason.as_bytes()).into_bytes());
        return false;
    }
    stream.set_read_timeout(None).is_ok() && write_frame(&mut stream, &[ST_OK]).is_ok()
}

fn serve(mut stream: &TcpStream, state: &State) {
    let _ = stream.set_nodelay(true);
    if !admit(stream, state) {
        return;
    }
    loop {
        let frame = match read_frame(&mut stream) {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) => {
                // Oversized or broken frame: say why, then drop the client.
                let _ =
                    write_frame(&mut stream, &Enc::default().u8(ST_ERROR).bytes(e.to_string().as_bytes()).into_bytes());
                return;
            }
        };
        let reply = match handle(&frame, state) {
            Ok(r) => r,
            Err(e) => Enc::default().u8(ST_ERROR).bytes(e.to_string().as_bytes()).into_bytes(),
        };
        if write_frame(&mut stream, &reply).is_err() || state.stop.load(Ordering::SeqCst) {
            return;
        }
    }
}

fn wait_for(state: &State, timeout_ms: u64, keys: &[String]) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms).min(REQUEST_WAIT_MAX);
    let mut map = lock(&state.map);
    loop {
        let missing: Vec<String> = keys.iter().filter(|k| !map.contains_key(*k)).cloned().collect();
        let now = Instant::now();
        if missing.is_empty() || now >= deadline || state.stop.load(Ordering::SeqCst) {
            return missing;
        }
        map = state.changed.wait_timeout(map, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
    }
}

fn handle(frame: &[u8], state: &State) -> Result<Vec<u8>, StoreError> {
    let mut d = Dec::new(frame);
    let ok = Enc::default().u8(ST_OK);
    match d.u8()? {
        OP_SET => {
            let key = d.key()?;
            let value = d.bytes(VALUE_BYTES_MAX)?.to_vec();
            d.end()?;
            let mut map = lock(&state.map);
            if !map.contains_key(&key) && map.len() >= KEYS_MAX {
                return Err(StoreError::Refused { reason: format!("the store holds {KEYS_MAX} keys already") });
            }
            map.insert(key, value);
            state.changed.notify_all();
            Ok(ok.into_bytes())
        }
        OP_GET => {
            let key = d.key()?;
            let timeout_ms = d.u64()?;
            d.end()?;
            if !wait_for(state, timeout_ms, std::slice::from_ref(&key)).is_empty() {
                return Ok(Enc::default().u8(ST_TIMEOUT).u64(1).bytes(key.as_bytes()).into_bytes());
            }
            let map = lock(&state.map);
            Ok(ok.bytes(&map[&key]).into_bytes())
        }
        OP_ADD => {
            let key = d.key()?;
            let delta = d.u64()? as i64;
            d.end()?;
            let mut map = lock(&state.map);
            let current = match map.get(&key) {
                None => 0,
                Some(v) => decode_counter(v)
                    .ok_or_else(|| StoreError::Refused { reason: format!("key {key:?} does not hold a counter") })?,
            };
            if !map.contains_key(&key) && map.len() >= KEYS_MAX {
                return Err(StoreError::Refused { reason: format!("the store holds {KEYS_MAX} keys already") });
            }
            let new = current.wrapping_add(delta);
            map.insert(key, new.to_le_bytes().to_vec());
            state.changed.notify_all();
            Ok(ok.u64(new as u64).into_bytes())
        }
        OP_WAIT => {
            let n = d.u32()? as usize;
            if n > WAIT_KEYS_MAX {
                return Err(protocol(format!("wait names {n} keys, limit {WAIT_KEYS_MAX}")));
            }
            let keys = (0..n).map(|_| d.key()).collect::<Result<Vec<_>, _>>()?;
            let timeout_ms = d.u64()?;
            d.end()?;
            let missing = wait_for(state, timeout_ms, &keys);
            if missing.is_empty() {
                return Ok(ok.into_bytes());
            }
            let mut e = Enc::default().u8(ST_TIMEOUT).u64(missing.len() as u64);
            for k in &missing {
                e = e.bytes(k.as_bytes());
            }
            Ok(e.into_bytes())
        }
        op => Err(protocol(format!("unknown store op {op}"))),
    }
}
