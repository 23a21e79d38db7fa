//! A job not started by `accord launch` / `accord.run` gets its secret by hand: every rank is
//! given the same `ACCORD_JOB_SECRET` (64 hex digits), which both its bootstrap store and its
//! engine read. Such a job runs as a launched one does, and a process without the secret (or
//! with another) can neither read its store nor reach its engines. Without any secret the
//! store and the engines admit whoever reaches their ports (see the README's security notes).

use accord_coll::engine::EngineTransport;
use accord_coll::store::{Bootstrap, BootstrapConfig, StoreClient};
use accord_coll::{Bufs, CollConfig, Communicator, DType, ReduceOp, StoreError};
use accord_engine::{Engine, EngineConfig, WriteOp};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// The environment one rank of a two-rank job sees, with `secret` set by hand.
fn env(rank: usize, port: u16, secret: Option<&str>) -> HashMap<&'static str, String> {
    let mut vars: HashMap<&str, String> = [
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", "2".to_string()),
        ("MASTER_ADDR", "127.0.0.1".to_string()),
        ("MASTER_PORT", port.to_string()),
        ("ACCORD_SHM", "0".to_string()),
        ("ACCORD_BOOTSTRAP_TIMEOUT_MS", "20000".to_string()),
    ]
    .into();
    if let Some(s) = secret {
        vars.insert("ACCORD_JOB_SECRET", s.to_string());
    }
    vars
}

/// An engine configured from `vars` only (as `Engine::builder()` reads the process's).
fn engine_from(vars: &HashMap<&'static str, String>) -> Arc<Engine> {
    let config = EngineConfig::default().with_overrides_from(|k| vars.get(k).cloned()).unwrap();
    Arc::new(Engine::builder().ignore_env().config(config).force_network(true).build().unwrap())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn a_secret_shared_by_hand_admits_the_job_and_refuses_everyone_else() {
    let secret = "3c".repeat(32);
    let port = free_port();
    let sums = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let (vars, secret) = (env(rank, port, Some(&secret)), &secret);
                s.spawn(move || {
                    let config = BootstrapConfig::from_lookup(|k| vars.get(k).cloned()).unwrap();
                    assert_eq!(config.secret.map(|s| s.0), Some([0x3c; 32]), "the store reads {secret}");
                    let engine = engine_from(&vars);
                    let transport = EngineTransport::join(Bootstrap::connect(config).unwrap(), engine).unwrap();
                    let mut c = Communicator::new(transport, CollConfig::default()).unwrap();
                    let buf = c.register_typed(&[rank as f32 + 1.0; 1000]).unwrap();
                    c.all_reduce(Bufs::in_place(buf.all()), 1000, DType::F32, ReduceOp::Sum, None).unwrap();
                    let sum = c.read_typed::<f32>(buf.all()).unwrap();
                    if rank == 0 {
                        // While rank 0's store runs: no secret, or another one, reads nothing.
                        let e =
                            StoreClient::connect(("127.0.0.1", port), WAIT).err().expect("an outsider read the store");
                        assert!(matches!(e, StoreError::Refused { .. }), "{e}");
                        let other = accord_proto::JobSecret([0x5a; 32]);
                        let e = StoreClient::connect_with_secret(("127.0.0.1", port), WAIT, Some(other)).err();
                        assert!(matches!(e, Some(StoreError::Refused { .. })), "another job's secret read the store");
                        // And an engine without the secret gets no byte into this rank.
                        let mut vars = env(0, port, None);
                        vars.insert("ACCORD_IDLE_TIMEOUT_MS", "300".into());
                        vars.insert("ACCORD_PEER_DEAD_MS", "1000".into());
                        let outsider = engine_from(&vars);
                        let engine = c.transport().engine();
                        outsider.add_peer(&engine.address()).unwrap();
                        let dst = engine.alloc(64).unwrap();
                        let (src, d) = (outsider.alloc(64).unwrap(), dst.descriptor());
                        src.fill(9);
                        let h = src.handle();
                        let op = WriteOp { src: &h, src_offset: 0, dst: &d, dst_offset: 0, len: 64, imm: None };
                        assert!(outsider.write(&op).unwrap().wait_timeout(WAIT).is_err(), "an outsider wrote");
                        assert_eq!(dst.to_vec(), vec![0u8; 64], "not one byte landed");
                    }
                    c.barrier().unwrap();
                    sum
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    });
    for sum in sums {
        assert!(sum.iter().all(|&v| v == 3.0), "the job's all-reduce ran");
    }
}

/// Without a secret the store is open: any process that reaches it reads what the ranks
/// published (which is why the launchers always set one).
#[test]
fn without_a_secret_the_store_admits_anyone() {
    let port = free_port();
    let vars = env(0, port, None);
    let config = BootstrapConfig::from_lookup(|k| vars.get(k).cloned()).unwrap();
    assert_eq!(config.secret, None);
    let config = BootstrapConfig { world_size: 1, ..config };
    let _store = Bootstrap::connect(config).unwrap();
    assert!(StoreClient::connect(("127.0.0.1", port), WAIT).is_ok(), "an open store admits a client with no secret");
}
