//! A Python object as the rendezvous store of a `Communicator` (`store=`), and the choice of
//! rendezvous when none is given.
//!
//! Why: under torchrun or inside `torch.distributed`, a store already exists and its port is
//! taken. The communicator then publishes its engine address there instead of hosting a store
//! of its own. The object needs two methods: `set(key: str, value: bytes)` and
//! `get(key: str, timeout: float) -> bytes` (waits up to `timeout` seconds for the key, raises
//! on timeout). `accord.torch` wraps c10d stores this way.

use accord_coll::store::KeyValueStore;
use accord_coll::StoreError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::time::Duration;

/// Set by torchrun's elastic agent when it hosts the job's TCPStore on `MASTER_PORT`.
pub const AGENT_STORE_ENV: &str = "TORCHELASTIC_USE_AGENT_STORE";

/// A Python store object seen as a [`KeyValueStore`]. Called from the communicator's setup
/// thread, which takes the GIL for each call (the caller waits with it released).
pub struct PyStore(pub Py<PyAny>);

fn refused(what: &str, key: &str, e: PyErr) -> StoreError {
    StoreError::Refused { reason: format!("store.{what}({key:?}) raised {e}") }
}

/// Whether a Python exception raised by `get` is a timeout (the builtin `TimeoutError`, or
/// an exception whose type or message says so, as c10d's `DistStoreError` does).
fn is_timeout(py: Python<'_>, e: &PyErr) -> bool {
    if e.is_instance_of::<pyo3::exceptions::PyTimeoutError>(py) {
        return true;
    }
    let type_name = e.get_type(py).name().map(|n| n.to_string()).unwrap_or_default();
    type_name.contains("Timeout") || e.to_string().to_lowercase().contains("timeout")
}

impl KeyValueStore for PyStore {
    fn set(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        Python::attach(|py| {
            self.0
                .bind(py)
                .call_method1("set", (key, PyBytes::new(py, value)))
                .map(|_| ())
                .map_err(|e| refused("set", key, e))
        })
    }

    fn get(&mut self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        Python::attach(|py| match self.0.bind(py).call_method1("get", (key, timeout.as_secs_f64())) {
            Ok(value) => value.extract::<Vec<u8>>().map_err(|e| refused("get", key, e)),
            Err(e) if is_timeout(py, &e) => {
                Err(StoreError::KeyTimeout { keys: vec![key.to_string()], waited: timeout })
            }
            Err(e) => Err(refused("get", key, e)),
        })
    }
}

/// Under torchrun's agent store (`TORCHELASTIC_USE_AGENT_STORE=True`) the agent holds
/// `MASTER_PORT`: asks `accord._torchrun.agent_store` for a client of it (needs torch) and the
/// key prefix for this communicator. `None` when not under the agent store or without torch.
pub fn torchrun_agent_store(
    py: Python<'_>,
    master_addr: &str,
    master_port: u16,
    rank: usize,
    timeout: Duration,
) -> PyResult<Option<(Py<PyAny>, String)>> {
    if !std::env::var(AGENT_STORE_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1") {
        return Ok(None);
    }
    let helper = py.import("accord._torchrun")?;
    let found = helper.call_method1("agent_store", (master_addr, master_port, rank, timeout.as_secs_f64()))?;
    if found.is_none() {
        return Ok(None);
    }
    let (store, prefix): (Py<PyAny>, String) = found.extract()?;
    Ok(Some((store, prefix)))
}
