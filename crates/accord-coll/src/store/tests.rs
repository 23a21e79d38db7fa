use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::*;
use crate::error::StoreError;

fn cfg(rank: usize, world_size: usize, port: u16, timeout_ms: u64) -> BootstrapConfig {
    BootstrapConfig {
        rank,
        world_size,
        local_rank: rank,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        timeout: Duration::from_millis(timeout_ms),
        secret: None,
    }
}

#[test]
fn set_get_add_wait() {
    let server = StoreServer::start("127.0.0.1:0").unwrap();
    let mut c = StoreClient::connect(server.local_addr(), Duration::from_secs(5)).unwrap();
    c.set("a", b"hello").unwrap();
    assert_eq!(c.get("a", Duration::from_millis(10)).unwrap(), b"hello");
    assert_eq!(c.add("n", 5).unwrap(), 5);
    assert_eq!(c.add("n", -2).unwrap(), 3);
    assert!(matches!(c.add("a", 1), Err(StoreError::Refused { .. })));
    let e = c.get("nope", Duration::from_millis(50)).unwrap_err();
    assert!(matches!(&e, StoreError::KeyTimeout { keys, .. } if keys == &["nope".to_string()]), "{e}");
    let e = c.wait(&["a".into(), "b".into(), "c".into()], Duration::from_millis(50)).unwrap_err();
    assert!(matches!(&e, StoreError::KeyTimeout { keys, .. } if keys == &["b".to_string(), "c".to_string()]));
    // A blocking get is released by another client's set.
    let addr = server.local_addr();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        StoreClient::connect(addr, Duration::from_secs(5)).unwrap().set("late", b"x").unwrap();
    });
    assert_eq!(c.get("late", Duration::from_secs(5)).unwrap(), b"x");
    t.join().unwrap();
}

#[test]
fn bootstrap_gathers_every_rank() {
    let server = StoreServer::start("127.0.0.1:0").unwrap();
    let port = server.local_addr().port();
    let mut server = Some(server);
    let n = 5;
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let srv = if r == 0 { server.take() } else { None };
            std::thread::spawn(move || {
                let mut b = Bootstrap::join(cfg(r, n, port, 10_000), srv).unwrap();
                let all = b.all_gather(format!("rank{r}").as_bytes()).unwrap();
                let again = b.all_gather(&[r as u8]).unwrap();
                // Keep rank 0 (the server) alive until everyone has read.
                b.store().add("done", 1).unwrap();
                if r == 0 {
                    while b.store().add("done", 0).unwrap() < n as i64 {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                (all, again)
            })
        })
        .collect();
    for h in handles {
        let (all, again) = h.join().unwrap();
        assert_eq!(all, (0..n).map(|r| format!("rank{r}").into_bytes()).collect::<Vec<_>>());
        assert_eq!(again, (0..n).map(|r| vec![r as u8]).collect::<Vec<_>>());
    }
}

#[test]
fn missing_ranks_are_named() {
    let server = StoreServer::start("127.0.0.1:0").unwrap();
    let port = server.local_addr().port();
    let start = Instant::now();
    let other = std::thread::spawn(move || Bootstrap::join(cfg(1, 4, port, 300), None).err());
    let e = Bootstrap::join(cfg(0, 4, port, 300), Some(server)).err().unwrap();
    assert!(matches!(&e, StoreError::RanksMissing { missing, .. } if missing == &vec![2, 3]), "{e}");
    assert!(e.to_string().contains("[2, 3]"));
    assert!(other.join().unwrap().is_some());
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn unreachable_store_is_an_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let e = Bootstrap::join(cfg(1, 2, port, 200), None).err().unwrap();
    assert!(matches!(e, StoreError::Unreachable { .. }), "{e}");
}

#[test]
fn bad_client_input_is_answered_not_fatal() {
    let server = StoreServer::start("127.0.0.1:0").unwrap();
    // An oversized frame: the server answers with an error and drops the client.
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    s.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    assert_eq!(&reply[..5], &[1, 0, 0, 0, wire::GREET_OPEN], "the open store's greeting first");
    assert_eq!(reply[5 + 4], 2, "error status");
    // Garbage inside a valid frame: an error reply, connection kept.
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    let mut greeting = [0u8; 5];
    s.read_exact(&mut greeting).unwrap();
    for garbage in [&[9u8][..], &[1, 0xff, 0xff, 0xff, 0xff], &[2, 1, 0, 0, 0, b'k'], &[]] {
        s.write_all(&(garbage.len() as u32).to_le_bytes()).unwrap();
        s.write_all(garbage).unwrap();
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut body).unwrap();
        assert_eq!(body[0], 2, "garbage {garbage:?} must get an error reply");
    }
    // The server still serves well-behaved clients.
    let mut c = StoreClient::connect(server.local_addr(), Duration::from_secs(5)).unwrap();
    c.set("k", b"v").unwrap();
    assert_eq!(c.get("k", Duration::ZERO).unwrap(), b"v");
}

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |k| m.get(k).cloned()
}

#[test]
fn torchrun_environment() {
    let full = [
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("LOCAL_RANK", "1"),
    ];
    let c = BootstrapConfig::from_lookup(env(&full)).unwrap();
    assert_eq!((c.rank, c.world_size, c.local_rank, c.master_port), (3, 8, 1, 29500));
    assert_eq!(c.master_addr, "10.0.0.1");
    let e = BootstrapConfig::from_lookup(env(&full[1..])).unwrap_err();
    assert!(matches!(e, StoreError::MissingEnv { name: "RANK" }), "{e}");
    let e = BootstrapConfig::from_lookup(env(&[full[0], ("WORLD_SIZE", "eight"), full[2], full[3]])).unwrap_err();
    assert!(e.to_string().contains("WORLD_SIZE"), "{e}");
    let e = BootstrapConfig::from_lookup(env(&[("RANK", "8"), full[1], full[2], full[3]])).unwrap_err();
    assert!(e.to_string().contains("below WORLD_SIZE"), "{e}");
    let e = BootstrapConfig::from_lookup(env(&[full[0], full[1], full[2], ("MASTER_PORT", "70000")])).unwrap_err();
    assert!(e.to_string().contains("MASTER_PORT"), "{e}");
    let c = BootstrapConfig::from_lookup(env(&full[..4])).unwrap();
    assert_eq!(c.local_rank, 3);
}

/// An in-memory [`KeyValueStore`] shared by threads, as a framework's store would be.
#[derive(Clone, Default)]
struct SharedMap(std::sync::Arc<(std::sync::Mutex<Entries>, std::sync::Condvar)>);

type Entries = HashMap<String, Vec<u8>>;

impl KeyValueStore for SharedMap {
    fn set(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.0 .0.lock().unwrap().insert(key.into(), value.into());
        self.0 .1.notify_all();
        Ok(())
    }

    fn get(&mut self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        let deadline = Instant::now() + timeout;
        let mut map = self.0 .0.lock().unwrap();
        loop {
            if let Some(v) = map.get(key) {
                return Ok(v.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(StoreError::KeyTimeout { keys: vec![key.into()], waited: timeout });
            }
            map = self.0 .1.wait_timeout(map, left).unwrap().0;
        }
    }
}

#[test]
fn all_gather_through_an_external_store() {
    let store = SharedMap::default();
    let handles: Vec<_> = (0..3)
        .map(|rank| {
            let mut store = store.clone();
            std::thread::spawn(move || {
                all_gather_through(
                    &mut store,
                    "job/",
                    rank,
                    3,
                    format!("addr{rank}").as_bytes(),
                    Duration::from_secs(5),
                )
            })
        })
        .collect();
    for h in handles {
        let blobs = h.join().unwrap().unwrap();
        assert_eq!(blobs, vec![b"addr0".to_vec(), b"addr1".to_vec(), b"addr2".to_vec()]);
    }
}

#[test]
fn all_gather_through_names_the_missing_rank() {
    let mut store = SharedMap::default();
    store.set("job/0", b"a").unwrap();
    // Rank 1 publishes and waits; rank 2 never comes.
    let e = all_gather_through(&mut store, "job/", 1, 3, b"b", Duration::from_millis(50)).unwrap_err();
    assert!(matches!(&e, StoreError::RanksMissing { missing, .. } if missing == &[2]), "{e}");
    let e = all_gather_through(&mut store, "job/", 3, 3, b"b", Duration::from_millis(50)).unwrap_err();
    assert!(matches!(e, StoreError::InvalidEnv { .. }), "{e}");
}

#[test]
fn store_client_is_a_key_value_store() {
    let server = StoreServer::start("127.0.0.1:0").unwrap();
    let addr = server.local_addr();
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let mut c = StoreClient::connect(addr, Duration::from_secs(5)).unwrap();
                all_gather_through(&mut c, "g/", rank, 2, &[rank as u8], Duration::from_secs(5)).unwrap()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), vec![vec![0u8], vec![1u8]]);
    }
}

/// A store with the job secret serves its holders and refuses everyone else before reading a
/// single request: no secret, a wrong one, or a raw client that skips the challenge (the
/// engine addresses and region keys it holds never reach an outsider).
#[test]
fn a_store_with_a_secret_refuses_clients_without_it() {
    let secret = accord_proto::JobSecret([9; 32]);
    let server = StoreServer::start_with_secret("127.0.0.1:0", Some(secret)).unwrap();
    let addr = server.local_addr();
    let mut insider = StoreClient::connect_with_secret(addr, Duration::from_secs(5), Some(secret)).unwrap();
    insider.set("accord/addr/0", b"engine address and control key").unwrap();
    for outsider in [None, Some(accord_proto::JobSecret([8; 32]))] {
        let e = StoreClient::connect_with_secret(addr, Duration::from_secs(5), outsider).err().expect("refused");
        assert!(matches!(&e, StoreError::Refused { .. }), "{e}");
    }
    // A raw client ignores the challenge and sends a GET: it gets the refusal, not the value.
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let get = wire::Enc::default().u8(wire::OP_GET).bytes(b"accord/addr/0").u64(0).into_bytes();
    wire::write_frame(&mut raw, &get).unwrap();
    let mut everything = Vec::new();
    let _ = raw.read_to_end(&mut everything);
    assert!(!everything.windows(14).any(|w| w == b"engine address"), "the value leaked");
    assert_eq!(insider.get("accord/addr/0", Duration::from_millis(10)).unwrap(), b"engine address and control key");
}

/// The bootstrap takes the secret from ACCORD_JOB_SECRET (never echoing a bad value) and its
/// store binds MASTER_ADDR rather than every interface.
#[test]
fn bootstrap_reads_the_secret_and_binds_master_addr() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let env = |secret: &str| {
        let vars: HashMap<&str, String> = [
            ("RANK", "0".to_string()),
            ("WORLD_SIZE", "1".to_string()),
            ("MASTER_ADDR", "127.0.0.1".to_string()),
            ("MASTER_PORT", port.to_string()),
            ("ACCORD_JOB_SECRET", secret.to_string()),
        ]
        .into();
        BootstrapConfig::from_lookup(|k| vars.get(k).cloned())
    };
    let e = env("not-a-secret").expect_err("a bad secret is refused").to_string();
    assert!(!e.contains("not-a-secret"), "{e}");
    let config = env(&"ab".repeat(32)).unwrap();
    assert_eq!(config.secret, Some(accord_proto::JobSecret([0xab; 32])));
    let _boot = Bootstrap::connect(config).unwrap();
    // Another loopback address of this host reaches a store bound to 0.0.0.0, not one bound
    // to MASTER_ADDR.
    let elsewhere = std::net::SocketAddr::from(([127, 0, 0, 2], port));
    assert!(TcpStream::connect_timeout(&elsewhere, Duration::from_secs(2)).is_err(), "bound to MASTER_ADDR only");
    let e = StoreClient::connect(("127.0.0.1", port), Duration::from_secs(5)).err().expect("no secret, no store");
    assert!(matches!(e, StoreError::Refused { .. }));
}

/// Under torchrun's elastic agent (which serves its own store on MASTER_PORT) the bootstrap's
/// store takes the next port, so programs run under torchrun unchanged; elsewhere MASTER_PORT.
#[test]
fn under_torchrun_the_store_takes_the_port_after_the_agents() {
    let env = |agent: Option<&str>, port: &str| {
        let mut vars: HashMap<&str, String> = [
            ("RANK", "0".to_string()),
            ("WORLD_SIZE", "2".to_string()),
            ("MASTER_ADDR", "127.0.0.1".to_string()),
            ("MASTER_PORT", port.to_string()),
        ]
        .into();
        if let Some(a) = agent {
            vars.insert("TORCHELASTIC_USE_AGENT_STORE", a.to_string());
        }
        BootstrapConfig::from_lookup(|k| vars.get(k).cloned())
    };
    assert_eq!(env(None, "29500").unwrap().master_port, 29500);
    assert_eq!(env(Some("False"), "29500").unwrap().master_port, 29500);
    assert_eq!(env(Some("True"), "29500").unwrap().master_port, 29501);
    assert!(env(Some("True"), "65535").is_err(), "no port after 65535");
}
