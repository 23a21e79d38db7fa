//! Peer death on loopback: a peer process is killed (or stopped) while this process has work
//! pending on it, and that work must end in an error naming it, never hang.
//!
//! The peer is a child process running `peer_child` (`accord_testkit`): it builds an engine,
//! says its address and a region, hears ours, and idles until killed (or until its stdin
//! closes; the kit kills it at the group's bound at the latest).

use accord_engine::{
    Engine, EngineAddress, EngineConfig, MrDescriptor, PeerDeath, PeerWaitError, TransferError, WriteOp,
};
use accord_testkit::{hear, say, Group, Spawn};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// The hang guard of every wait here: far above the documented bounds (a pidfd wake plus
/// `liveness::WAIT_SLICE` on one host; keepalive + peer_dead_after by probe), so only a
/// hang reaches it.
const HANG_GUARD: Duration = Duration::from_secs(60);
/// The longest a peer lives: its group kills it there (no process is left behind).
const CHILD_LIFETIME: Duration = Duration::from_secs(120);
const REGION_BYTES: usize = 64 << 20;

#[derive(Serialize, Deserialize)]
struct Hello {
    address: EngineAddress,
    region: MrDescriptor,
}

#[test]
fn peer_child() {
    if accord_testkit::child().is_none() {
        return;
    }
    let engine = Engine::builder().ignore_env().build().expect("peer engine");
    let region = engine.alloc(REGION_BYTES).expect("peer region");
    let hello = Hello { address: engine.address(), region: region.descriptor() };
    say(&serde_json::to_string(&hello).unwrap());
    if let Some(line) = hear() {
        let parent = EngineAddress::parse(&line).expect("parent address");
        engine.add_peer(&parent).expect("add parent");
    }
    while hear().is_some() {}
}

/// A peer process, introduced both ways; dropping it kills it (its group's drop).
struct Peer {
    group: Group,
    hello: Hello,
}

impl Peer {
    fn spawn(parent: &Engine) -> Peer {
        let mut group = Spawn::new("peer_child", 1).bound(CHILD_LIFETIME).start().expect("spawn the peer");
        let (_, line) = group.said().expect("the peer said hello");
        let hello: Hello = serde_json::from_str(&line).expect("hello parses");
        group.send(0, &parent.address().to_string_compact()).expect("the peer hears our address");
        parent.add_peer(&hello.address).expect("add the peer");
        Peer { group, hello }
    }

    fn signal(&self, sig: i32) {
        self.group.signal(0, sig).unwrap_or_else(|e| panic!("signal {sig} to the peer: {e}"));
    }

    fn kill(&mut self) -> Instant {
        self.group.kill(0);
        Instant::now()
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
