//! torchrun-style bootstrap: read `RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT`, `LOCAL_RANK`; rank 0 hosts the store; everyone checks in
//! and waits for everyone else.

use std::time::Duration;

use super::{StoreClient, StoreServer};
use crate::error::StoreError;
use crate::transport::WORLD_SIZE_MAX;

/// Where and how to rendezvous.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootstrapConfig {
    /// This rank (`RANK`).
    pub rank: usize,
    /// Number of ranks (`WORLD_SIZE`).
    pub world_size: usize,
    /// Rank on this host (`LOCAL_RANK`, default: `RANK`).
    pub local_rank: usize,
    /// Host of rank 0's store (`MASTER_ADDR`).
    pub master_addr: String,
    /// Port of the store (`MASTER_PORT`).
    pub master_port: u16,
    /// How long to wait for the store and for every rank
    /// (`ACCORD_BOOTSTRAP_TIMEOUT_MS`, default 300000).
    pub timeout: Duration,
    /// The job secret (`ACCORD_JOB_SECRET`, 64 hex digits; `accord launch` sets one): the
    /// store admits only clients that prove it. `None`: an open store.
    pub secret: Option<accord_proto::JobSecret>,
}

fn parse<T: std::str::FromStr>(name: &'static str, value: String, what: &str) -> Result<T, StoreError>
where
    T::Err: std::fmt::Display,
{
    value.trim().parse::<T>().map_err(|e| StoreError::InvalidEnv {
        name,
        value,
        reason: format!("{e}; expected {what}"),
    })
}

impl BootstrapConfig {
    /// From the process environment.
    pub fn from_env() -> Result<BootstrapConfig, StoreError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// From `lookup` (the environment, or a map in tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<BootstrapConfig, StoreError> {
        let need = |name: &'static str| lookup(name).ok_or(StoreError::MissingEnv { name });
        let rank: usize = parse("RANK", need("RANK")?, "a non-negative integer")?;
        let world_value = need("WORLD_SIZE")?;
        let world_size: usize = parse("WORLD_SIZE", world_value.clone(), "a positive integer")?;
        if world_size == 0 || world_size > WORLD_SIZE_MAX {
            return Err(StoreError::InvalidEnv {
                name: "WORLD_SIZE",
                value: world_value,
                reason: format!("must be in 1..={WORLD_SIZE_MAX}"),
            });
        }
        if rank >= world_size {
            return Err(StoreError::InvalidEnv {
                name: "RANK",
                value: rank.to_string(),
                reason: format!("must be below WORLD_SIZE={world_size}"),
            });
        }
        let master_addr = need("MASTER_ADDR")?;
        if master_addr.trim().is_empty() {
            return Err(StoreError::InvalidEnv { name: "MASTER_ADDR", value: master_addr, reason: "is empty".into() });
        }
        let mut master_port: u16 = parse("MASTER_PORT", need("MASTER_PORT")?, "a port number 0..=65535")?;
        if torchrun_agent_holds_master_port(&lookup) {
            // torchrun's elastic agent serves its own store on MASTER_PORT; ours takes the next
            // port, so programs run unchanged under torchrun (the Python package joins the
            // agent's store instead, through torch).
            master_port = master_port.checked_add(1).ok_or(StoreError::InvalidEnv {
                name: "MASTER_PORT",
                value: master_port.to_string(),
                reason: "torchrun holds it and no port follows it for Accord's store".into(),
            })?;
        }
        let local_rank = match lookup("LOCAL_RANK") {
            Some(v) => parse("LOCAL_RANK", v, "a non-negative integer")?,
            None => rank,
        };
        let env: &dyn Fn(&str) -> Option<String> = &lookup;
        let timeout = accord_knobs::get(env, "ACCORD_BOOTSTRAP_TIMEOUT_MS")?.unwrap_or(Duration::from_secs(300));
        let secret = match accord_knobs::get::<String>(env, "ACCORD_JOB_SECRET")? {
            Some(v) => Some(accord_proto::JobSecret::from_hex(&v).ok_or(StoreError::InvalidEnv {
                name: "ACCORD_JOB_SECRET",
                value: "(not shown: a secret)".into(),
                reason: "expected 64 hex digits (32 bytes)".into(),
            })?),
            None => None,
        };
        Ok(BootstrapConfig {
            rank,
            world_size,
            local_rank,
            master_addr: master_addr.trim().to_string(),
            master_port,
            timeout,
            secret,
        })
    }
}

/// Whether the process runs under torchrun's elastic agent, which already serves a store on
/// `MASTER_PORT` (it sets `TORCHELASTIC_USE_AGENT_STORE=True` for its workers).
pub fn torchrun_agent_holds_master_port(lookup: &impl Fn(&str) -> Option<String>) -> bool {
    lookup("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.trim().eq_ignore_ascii_case("true") || v.trim() == "1")
}

/// A rank that has met every other rank at the store.
pub struct Bootstrap {
    config: BootstrapConfig,
    client: StoreClient,
    _server: Option<StoreServer>,
    gathers: u64,
}

fn arrived_key(rank: usize) -> String {
    format!("accord/arrived/{rank}")
}

impl Bootstrap {
    /// [`BootstrapConfig::from_env`] then [`Bootstrap::connect`].
    pub fn from_env() -> Result<Bootstrap, StoreError> {
        Self::connect(BootstrapConfig::from_env()?)
    }

    /// Rank 0 starts the store at `MASTER_ADDR:MASTER_PORT`; every rank
    /// then [`Bootstrap::join`]s.
    pub fn connect(config: BootstrapConfig) -> Result<Bootstrap, StoreError> {
        // The address the launcher names, not every interface: the store is for the job.
        let server = if config.rank == 0 {
            Some(StoreServer::start_with_secret((config.master_addr.as_str(), config.master_port), config.secret)?)
        } else {
            None
        };
        Self::join(config, server)
    }

    /// Checks in at the store (keeping `server` alive, if this rank hosts it)
    /// and waits for every rank; the error names the ranks that never arrived.
    pub fn join(config: BootstrapConfig, server: Option<StoreServer>) -> Result<Bootstrap, StoreError> {
        let mut client = StoreClient::connect_with_secret(
            (config.master_addr.as_str(), config.master_port),
            config.timeout,
            config.secret,
        )?;
        client.set(&arrived_key(config.rank), &[])?;
        let keys: Vec<String> = (0..config.world_size).map(arrived_key).collect();
        match client.wait(&keys, config.timeout) {
            Ok(()) => {}
            Err(StoreError::KeyTimeout { keys, waited }) => {
                let missing = keys
                    .iter()
                    .filter_map(|k| k.strip_prefix("accord/arrived/").and_then(|r| r.parse().ok()))
                    .collect();
                return Err(StoreError::RanksMissing { missing, waited });
            }
            Err(e) => return Err(e),
        }
        tracing::debug!(rank = config.rank, world_size = config.world_size, "bootstrap complete");
        Ok(Bootstrap { config, client, _server: server, gathers: 0 })
    }

    /// The configuration.
    pub fn config(&self) -> &BootstrapConfig {
        &self.config
    }

    /// The store connection, for other keys.
    pub fn store(&mut self) -> &mut StoreClient {
        &mut self.client
    }

    /// All-gather of small blobs through the store (e.g. engine addresses):
    /// every rank's blob, by rank. Every rank must call it the same number of
    /// times; the error names the ranks that did not contribute.
    pub fn all_gather(&mut self, blob: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        let round = self.gathers;
        self.gathers += 1;
        let key = |r: usize| format!("accord/gather/{round}/{r}");
        self.client.set(&key(self.config.rank), blob)?;
        let keys: Vec<String> = (0..self.config.world_size).map(key).collect();
        let prefix = format!("accord/gather/{round}/");
        match self.client.wait(&keys, self.config.timeout) {
            Ok(()) => {}
            Err(StoreError::KeyTimeout { keys, waited }) => {
                let missing =
                    keys.iter().filter_map(|k| k.strip_prefix(&prefix).and_then(|r| r.parse().ok())).collect();
                return Err(StoreError::RanksMissing { missing, waited });
            }
            Err(e) => return Err(e),
        }
        keys.iter().map(|k| self.client.get(k, self.config.timeout)).collect()
    }
}
