//! Peer death on loopback: a peer process is killed (or stopped) while this process has work
//! pending on it, and that work must end in an error naming it, never hang.
//!
//! The test binary re-executes itself as the peer (`peer_child`, selected by
//! `ACCORD_PEER_DEATH_ROLE`): it builds an engine, prints its address and a region, learns ours
//! from stdin, and idles until killed (or until stdin closes, or a bounded time passes).

use accord_engine::{
    Engine, EngineAddress, EngineConfig, MrDescriptor, PeerDeath, PeerWaitError, TransferError, WriteOp,
};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROLE_ENV: &str = "ACCORD_PEER_DEATH_ROLE";
/// The hang guard of every wait here: far above the documented bounds (a pidfd wake plus
/// `liveness::WAIT_SLICE` on one host; keepalive + peer_dead_after by probe), so only a
/// hang reaches it.
const HANG_GUARD: Duration = Duration::from_secs(60);
/// The longest a peer idles before it leaves on its own (no process is left behind).
const CHILD_LIFETIME: Duration = Duration::from_secs(120);
const REGION_BYTES: usize = 64 << 20;

#[derive(Serialize, Deserialize)]
struct Hello {
    address: EngineAddress,
    region: MrDescriptor,
}

#[test]
fn peer_child() {
    if std::env::var(ROLE_ENV).is_err() {
        return;
    }
    std::thread::spawn(|| {
        std::thread::sleep(CHILD_LIFETIME);
        std::process::exit(3);
    });
    let engine = Engine::builder().ignore_env().build().expect("peer engine");
    let region = engine.alloc(REGION_BYTES).expect("peer region");
    let hello = Hello { address: engine.address(), region: region.descriptor() };
    println!("@@HELLO {}", serde_json::to_string(&hello).unwrap());
    std::io::stdout().flush().unwrap();
    let mut lines = BufReader::new(std::io::stdin()).lines();
    if let Some(Ok(line)) = lines.next() {
        let parent = EngineAddress::parse(&line).expect("parent address");
        engine.add_peer(&parent).expect("add parent");
    }
    for _ in lines.map_while(Result::ok) {}
}

/// A peer process, introduced both ways.
struct Peer {
    child: Child,
    hello: Hello,
}

impl Peer {
    fn spawn(parent: &Engine) -> Peer {
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new(exe)
            .args(["--exact", "peer_child", "--nocapture", "--test-threads=1"])
            .env(ROLE_ENV, "peer")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the peer");
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut hello = None;
        for line in out.lines().map_while(Result::ok) {
            if let Some(at) = line.find("@@HELLO ") {
                hello = Some(serde_json::from_str::<Hello>(&line[at + 8..]).expect("hello parses"));
                break;
            }
        }
        let hello = hello.expect("the peer said hello");
        let stdin = child.stdin.as_mut().unwrap();
        writeln!(stdin, "{}", parent.address().to_string_compact()).unwrap();
        stdin.flush().unwrap();
        parent.add_peer(&hello.address).expect("add the peer");
        Peer { child, hello }
    }

    fn signal(&self, sig: i32) {
        // Safety: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "signal {sig} to the peer");
    }

    fn kill(&mut self) -> Instant {
        self.child.kill().expect("kill -9 the peer");
        Instant::now()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn parent_engine(config: EngineConfig) -> Engine {
    Engine::builder().ignore_env().config(config).build().expect("engine")
}

/// Writes the whole peer region (one shard: `write_unsharded`).
fn big_write(engine: &Engine, src: &accord_engine::MrBuffer, dst: &MrDescriptor) -> accord_engine::Transfer {
    let h = src.handle();
    let op = WriteOp { src: &h, src_offset: 0, dst, dst_offset: 0, len: REGION_BYTES as u64, imm: Some(9) };
    engine.write_unsharded(&op).expect("submit")
}

#[test]
fn immediate_wait_on_a_killed_peer_fails_naming_it() {
    let engine = parent_engine(EngineConfig::default());
    let mut peer = Peer::spawn(&engine);
    let (peer_id, pid) = (peer.hello.address.id, peer.hello.address.pid);
    let waiter = {
        let engine = std::sync::Arc::new(engine);
        let e = engine.clone();
        (engine, std::thread::spawn(move || e.take_imm_from(77, 1, HANG_GUARD, peer_id)))
    };
    std::thread::sleep(Duration::from_millis(200));
    let killed = peer.kill();
    let result = waiter.1.join().unwrap();
    eprintln!("immediate wait ended {:?} after the kill: {result:?}", killed.elapsed());
    assert_eq!(result, Err(PeerWaitError::PeerDied { peer: peer_id, cause: PeerDeath::Exited { pid } }));
    // Later work on the dead peer fails at once, naming it.
    let engine = waiter.0;
    assert_eq!(engine.peer_death(peer_id), Some(PeerDeath::Exited { pid }));
    let src = engine.alloc(REGION_BYTES).unwrap();
    let err = big_write(&engine, &src, &peer.hello.region).wait_timeout(HANG_GUARD).unwrap_err();
    assert_eq!(err, TransferError::PeerDied { peer: peer_id, cause: PeerDeath::Exited { pid } });
    assert!(err.to_string().contains(&format!("{:x}", peer_id.0)), "the message names the peer: {err}");
}

#[test]
fn write_in_flight_to_a_killed_peer_fails_naming_it() {
    let engine = parent_engine(EngineConfig::default());
    let mut peer = Peer::spawn(&engine);
    let (peer_id, pid) = (peer.hello.address.id, peer.hello.address.pid);
    let src = engine.alloc(REGION_BYTES).unwrap();
    // A stopped peer acknowledges nothing, so the write stays in flight until the kill.
    peer.signal(libc::SIGSTOP);
    let transfer = big_write(&engine, &src, &peer.hello.region);
    std::thread::sleep(Duration::from_millis(200));
    assert!(transfer.poll().is_none(), "a stopped peer cannot have acknowledged 64 MiB");
    let killed = peer.kill();
    let result = transfer.wait_timeout(HANG_GUARD);
    eprintln!("write ended {:?} after the kill: {result:?}", killed.elapsed());
    assert_eq!(result, Err(TransferError::PeerDied { peer: peer_id, cause: PeerDeath::Exited { pid } }));
}

#[test]
fn a_silent_peer_is_declared_dead_by_keepalive() {
    // No pidfd: the peer is judged as one on another host would be, by probes alone.
    let config = EngineConfig {
        pidfd: false,
        keepalive: Duration::from_millis(100),
        peer_dead_after: Duration::from_millis(500),
        ..EngineConfig::default()
    };
    let engine = parent_engine(config);
    let peer = Peer::spawn(&engine);
    let peer_id = peer.hello.address.id;
    // Alive and answering: a wait times out on its own terms, the peer is not declared dead.
    let alive = engine.take_imm_from(78, 1, Duration::from_millis(800), peer_id);
    assert!(matches!(alive, Err(PeerWaitError::Timeout { value: 0 })), "{alive:?}");
    assert_eq!(engine.peer_death(peer_id), None);
    peer.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    let result = engine.take_imm_from(78, 1, HANG_GUARD, peer_id);
    eprintln!("keepalive declared the stopped peer dead after {:?}: {result:?}", stopped.elapsed());
    match result {
        Err(PeerWaitError::PeerDied { peer, cause: PeerDeath::Silent { ms } }) => {
            assert_eq!(peer, peer_id);
            assert!(ms >= 500, "declared silent only after peer_dead_after: {ms} ms");
        }
        other => panic!("expected a keepalive death, got {other:?}"),
    }
    drop(peer); // kill -9 works on a stopped process
}
