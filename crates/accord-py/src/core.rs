//! What an `accord.Engine` shares with its regions: the Rust engine (until closed), the weak
//! list of its regions, the receive queue; and the process-wide list of live engines that the
//! `atexit` hook closes.
//!
//! Lock rule of the crate: no lock is ever held while waiting for the GIL. Locks are taken
//! either with the GIL released (inside `Python::detach`) or around code that never needs the
//! GIL, so a thread holding the GIL and waiting for a lock always waits for a holder that can
//! finish.

use crate::errors::closed;
use crate::recv::RecvQueue;
use accord_engine::EngineAddress;
use pyo3::prelude::*;
use std::sync::{Arc, Mutex, RwLock, Weak};

/// The Rust engine, dropped with the GIL released: its drop joins the completion thread,
/// which may be waiting for the GIL to run a Python callback. Where Python cannot be attached
/// to (the interpreter is finalizing or gone, on a thread Python never knew), it is dropped
/// as it is: no Python callback can be waiting then.
pub(crate) struct LiveEngine(Option<accord_engine::Engine>);

impl LiveEngine {
    /// Wraps a freshly built engine.
    pub(crate) fn new(engine: accord_engine::Engine) -> Self {
        LiveEngine(Some(engine))
    }
}

impl std::ops::Deref for LiveEngine {
    type Target = accord_engine::Engine;
    fn deref(&self) -> &accord_engine::Engine {
        self.0.as_ref().expect("only Drop takes the engine")
    }
}

impl Drop for LiveEngine {
    fn drop(&mut self) {
        let mut engine = self.0.take();
        let _ = Python::try_attach(|py| py.detach(|| drop(engine.take())));
        drop(engine);
    }
}

/// What `close` does to each region still alive: take it out of the engine's table. A trait so
/// that the core lists regions without importing the module that defines them (which imports
/// the core); `region::RegionInner` implements it.
pub(crate) trait Deregister: Send + Sync {
    /// Removes the region from `engine`'s table. Called with the GIL released. Idempotent.
    fn deregister(&self, engine: &LiveEngine);
}

/// Regions registered before the list of an engine is pruned of dead entries (then the bound
/// doubles from what survived): the list holds at most twice the live regions, plus this.
const REGION_LIST_PRUNE_MIN: usize = 64;

/// State shared by an `accord.Engine`, its regions and counters.
pub(crate) struct Core {
    engine: RwLock<Option<Arc<LiveEngine>>>,
    /// The engine's address (kept after close, for `repr`).
    pub(crate) address: EngineAddress,
    regions: Mutex<(Vec<Weak<dyn Deregister>>, usize)>,
    /// Messages from peers' sends, when no handler was given to `post_recvs`.
    pub(crate) recv: Arc<RecvQueue>,
}

impl Core {
    /// A core around a built engine, listed for the `atexit` hook.
    pub(crate) fn new(engine: accord_engine::Engine) -> Arc<Core> {
        let core = Arc::new(Core {
            address: engine.address(),
            engine: RwLock::new(Some(Arc::new(LiveEngine::new(engine)))),
            regions: Mutex::new((vec![], REGION_LIST_PRUNE_MIN)),
            recv: Arc::new(RecvQueue::default()),
        });
        let mut cores = LIVE_CORES.lock().unwrap();
        cores.retain(|c| c.strong_count() > 0);
        cores.push(Arc::downgrade(&core));
        core
    }

    /// The live engine, or the `ShutdownError` of `op`.
    pub(crate) fn engine(&self, op: &str) -> PyResult<Arc<LiveEngine>> {
        self.engine.read().unwrap().clone().ok_or_else(|| closed(op))
    }

    /// The live engine, if any.
    pub(crate) fn engine_if_open(&self) -> Option<Arc<LiveEngine>> {
        self.engine.read().unwrap().clone()
    }

    /// Whether `close` ran.
    pub(crate) fn is_closed(&self) -> bool {
        self.engine.read().unwrap().is_none()
    }

    /// Lists a new region so `close` can deregister it.
    pub(crate) fn add_region<R: Deregister + 'static>(&self, region: &Arc<R>) {
        let region: Arc<dyn Deregister> = region.clone();
        let mut guard = self.regions.lock().unwrap();
        let (list, prune_at) = &mut *guard;
        list.push(Arc::downgrade(&region));
        if list.len() >= *prune_at {
            list.retain(|r| r.strong_count() > 0);
            *prune_at = (2 * list.len()).max(REGION_LIST_PRUNE_MIN);
        }
    }

    /// Deregisters every region, then lets the engine go (its workers stop once no call in
    /// flight holds it). Call with the GIL released. Idempotent.
    pub(crate) fn close(&self) {
        let Some(engine) = self.engine.write().unwrap().take() else { return };
        self.recv.close();
        let regions: Vec<_> = self.regions.lock().unwrap().0.drain(..).filter_map(|r| r.upgrade()).collect();
        for region in regions {
            region.deregister(&engine);
        }
        drop(engine);
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        if !self.is_closed() && Python::try_attach(|py| py.detach(|| self.close())).is_none() {
            self.close();
        }
    }
}

/// Every engine of the process, so `accord._accord._close_all` (registered with `atexit`)
/// can stop them before the interpreter goes away.
static LIVE_CORES: Mutex<Vec<Weak<Core>>> = Mutex::new(Vec::new());

/// Closes every engine of the process (the `atexit` hook of the package).
#[pyfunction]
pub(crate) fn _close_all(py: Python<'_>) {
    let cores: Vec<Arc<Core>> = LIVE_CORES.lock().unwrap().drain(..).filter_map(|c| c.upgrade()).collect();
    py.detach(|| cores.iter().for_each(|c| c.close()));
}
