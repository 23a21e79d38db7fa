//! `accord.Communicator`: the collectives of `accord-coll` over the TransferEngine, on arrays.
//!
//! Writable arrays are registered where they are (cached, see `coll_reg`) and the collective
//! runs on them directly: no copy beyond what the algorithm itself makes. Read-only arrays, an
//! input overlapping its output (except an all_gather's input that is this rank's block of the
//! output, which runs in place), and buffers an algorithm may scribble on without the caller
//! wanting the result (a non-root's `reduce`) go through registered
//! staging buffers instead: a copy in and, where results come back, a copy out. Arguments are
//! checked (dtype, size, contiguity, writability, root and peer ranks) before anything is
//! sent. The collective runs on a helper thread while the caller waits with the GIL released,
//! in slices that look for signals, so Ctrl-C interrupts it (the communicator is then
//! unusable: its peers are left mid-collective).

use crate::coll_array::{array, expect_count, same_dtype, Array};
use crate::coll_helper::{background, on_main_thread};
use crate::coll_reg::Registrations;
use crate::coll_staging::{in_place, out_of_place, Staging};
use crate::coll_store::{torchrun_agent_store, PyStore};
use crate::errors::{coll_error, error, Kind};
use accord_coll::engine::{EngineSetupError, EngineTransport};
use accord_coll::store::BootstrapConfig;
use accord_coll::{Algo, AllToAllVLayout, Bufs, CollConfig, CollError, Collective, LocalBuf, ReduceOp, StoreError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

pub(crate) type Comm = accord_coll::Communicator<EngineTransport>;

/// Where the Rust communicator is.
enum State {
    /// Idle, ready for a call.
    Ready(Box<Comm>),
    /// A call on another thread has it.
    Busy,
    /// A call was interrupted; its thread still has it and drops it when done.
    Interrupted,
    /// `close` ran.
    Closed,
    /// `accord.device.DeviceComm` took the communicator over (see [`Communicator::hand_over`]).
    HandedOver,
}

/// A setup failure (rendezvous, engine start) as an exception.
fn setup_error(e: EngineSetupError) -> PyErr {
    let kind = match &e {
        EngineSetupError::Coll(_) => {
            let EngineSetupError::Coll(c) = e else { unreachable!("matched above") };
            return coll_error(c);
        }
        EngineSetupError::Store(StoreError::MissingEnv { .. } | StoreError::InvalidEnv { .. }) => Kind::Config,
        EngineSetupError::Store(
            StoreError::Unreachable { .. } | StoreError::RanksMissing { .. } | StoreError::KeyTimeout { .. },
        ) => Kind::Timeout,
        EngineSetupError::Engine(_) => Kind::Config,
        _ => Kind::Accord,
    };
    error(kind, format!("creating the communicator: {e}"))
}

fn parse_op(op: &str) -> PyResult<ReduceOp> {
    ReduceOp::from_str(op).map_err(|e| error(Kind::InvalidRequest, e.to_string()))
}

fn parse_algo(collective: Collective, algo: Option<&str>) -> PyResult<Option<Algo>> {
    algo.map(|name| Algo::parse_for(collective, name).map_err(|e| error(Kind::InvalidRequest, e.to_string())))
        .transpose()
}

/// Whether the byte ranges `a..a + a_len` and `b..b + b_len` share a byte.
pub(crate) fn overlaps((a, a_len): (usize, usize), (b, b_len): (usize, usize)) -> bool {
    a < b.saturating_add(b_len) && b < a.saturating_add(a_len)
}

/// Checks all_to_allv's counts and displacements against the arrays (one entry per rank,
/// blocks inside the arrays, received blocks not overlapping, the block kept by this rank the
/// same size both ways) and fills absent displacements with the running sums of the counts.
/// The error says what is wrong, without the op's name.
pub(crate) fn all_to_allv_layout(
    world_size: usize,
    rank: usize,
    send: (Vec<usize>, Option<Vec<usize>>, usize),
    recv: (Vec<usize>, Option<Vec<usize>>, usize),
) -> Result<AllToAllVLayout, String> {
    let packed = |counts: &[usize]| -> Vec<usize> {
        counts
            .iter()
            .scan(0usize, |at, &c| {
                let start = *at;
                *at = at.saturating_add(c);
                Some(start)
            })
            .collect()
    };
    let mut sides = Vec::with_capacity(2);
    for (what, (counts, displs, elements)) in [("send", send), ("recv", recv)] {
        if counts.len() != world_size {
            return Err(format!("{what}_counts has {} entries: give one per rank ({world_size})", counts.len()));
        }
        let displs = displs.unwrap_or_else(|| packed(&counts));
        if displs.len() != world_size {
            return Err(format!("{what}_displs has {} entries: give one per rank ({world_size})", displs.len()));
        }
        for (peer, (&count, &displ)) in counts.iter().zip(&displs).enumerate() {
            if displ.checked_add(count).is_none_or(|end| end > elements) {
                return Err(format!(
                    "the {what} block of rank {peer} ({count} elements at {displ}) ends past the {what} array's \
                     {elements} elements"
                ));
            }
        }
        sides.push((counts, displs));
    }
    let (recv_counts, recv_displs) = sides.pop().expect("two sides");
    let (send_counts, send_displs) = sides.pop().expect("two sides");
    let mut blocks: Vec<(usize, usize, usize)> = (0..world_size)
        .filter(|&i| recv_counts[i] > 0)
        .map(|i| (recv_displs[i], recv_displs[i] + recv_counts[i], i))
        .collect();
    blocks.sort_unstable();
    if let Some(w) = blocks.windows(2).find(|w| w[1].0 < w[0].1) {
        return Err(format!("the recv blocks of ranks {} and {} overlap: give disjoint recv_displs", w[0].2, w[1].2));
    }
    if send_counts[rank] != recv_counts[rank] {
        return Err(format!(
            "send_counts[{rank}] is {} but recv_counts[{rank}] is {}: the block this rank keeps is the same both ways",
            send_counts[rank], recv_counts[rank]
        ));
    }
    Ok(AllToAllVLayout { send_counts, send_displs, recv_counts, recv_displs })
}

/// The collectives of one rank of a job, on numpy arrays (and torch CPU tensors).
///
/// With no arguments the job comes from the torchrun variables (``RANK``, ``WORLD_SIZE``,
/// ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``); arguments given replace the variable of
/// the same name for this communicator only (``os.environ`` is left alone). ``timeout``
/// (seconds) bounds the rendezvous and every collective (default: ``ACCORD_BOOTSTRAP_TIMEOUT_MS``
/// and ``ACCORD_COLL_TIMEOUT_MS``).
///
/// Every rank calls the same collectives in the same order with matching arrays. A writable
/// C-contiguous array is registered where it is (once, then cached) and the collective runs on
/// it directly; a read-only array, or an input overlapping its output, goes through registered
/// staging buffers (a copy in and, where results come back, a copy out). Wrong arrays raise ``InvalidBufferError`` before anything is sent; failures
/// involving peers raise ``accord.TimeoutError`` or ``PeerError`` naming the ranks, and leave
/// the communicator unusable (create a new one). ``close()`` (or leaving a ``with`` block
/// normally) ends with a barrier so no rank leaves while others still need it.
#[pyclass(module = "accord", name = "Communicator")]
pub struct Communicator {
    state: Mutex<State>,
    /// Out-of-place calls' registered buffers, taken out for a call and put back after.
    staging: Mutex<Staging>,
    /// Arrays registered in place, taken out for a call and put back after.
    registrations: Mutex<Registrations>,
    rank: usize,
    world_size: usize,
    /// Readable while a call runs (stuck reports).
    progress: std::sync::Arc<accord_coll::report::Progress>,
    /// Whether a call from Python's main thread runs on a helper thread so that Ctrl-C
    /// interrupts its wait (the default), or in place like one from any other thread (see
    /// [`Communicator::off_thread`]).
    interruptible: AtomicBool,
    /// Whether a call that finds another running waits for it (see [`Communicator::take`])
    /// rather than failing at once; `accord.torch` sets it.
    wait_turn: AtomicBool,
    /// Signalled whenever a call gives the communicator back.
    turn: Condvar,
    /// How long a call waits its turn at most: the collective timeout.
    turn_timeout: Duration,
}

impl Communicator {
    /// A communicator that meets its peers through `store` (see `coll_store`).
    fn through_store(
        py: Python<'_>,
        store: PyStore,
        prefix: String,
        (rank, world_size): (usize, usize),
        rendezvous_timeout: Duration,
        config: CollConfig,
    ) -> PyResult<Self> {
        let turn_timeout = config.timeout;
        let comm = background(py, move || -> Result<Comm, EngineSetupError> {
            let mut store = store;
            accord_coll::engine::communicator_through(&mut store, &prefix, rank, world_size, rendezvous_timeout, config)
        })?
        .map_err(setup_error)?;
        Ok(Communicator {
            rank: comm.rank(),
            world_size: comm.world_size(),
            progress: comm.progress(),
            state: Mutex::new(State::Ready(Box::new(comm))),
            staging: Mutex::default(),
            registrations: Mutex::default(),
            interruptible: AtomicBool::new(true),
            wait_turn: AtomicBool::new(false),
            turn: Condvar::new(),
            turn_timeout,
        })
    }

    /// Whether this call runs on a helper thread ([`background`]): from Python's main thread of
    /// an interruptible communicator. Every other call runs in place with the GIL released: a
    /// thread hop costs two wake-ups a call, the fixed cost of every small collective.
    fn off_thread(&self, py: Python<'_>) -> bool {
        self.interruptible.load(Ordering::Relaxed) && on_main_thread(py)
    }

    /// Takes the communicator out for a call. Where another call has it and this communicator
    /// waits its turn (`_wait_turn`, which `accord.torch` sets: its compiled backend runs calls
    /// of its own from threads Python does not see, see `torch_native`), waits with the GIL
    /// released for that call to give it back, up to the collective timeout.
    fn take(&self, py: Python<'_>, op: &str) -> PyResult<Box<Comm>> {
        let deadline = Instant::now() + self.turn_timeout;
        let mut state = self.state.lock().unwrap();
        while matches!(*state, State::Busy) && self.wait_turn.load(Ordering::Relaxed) && Instant::now() < deadline {
            drop(state);
            py.detach(|| self.wait_while_busy(deadline));
            state = self.state.lock().unwrap();
        }
        match std::mem::replace(&mut *state, State::Busy) {
            State::Ready(comm) => Ok(comm),
            other => {
                let message = match other {
                    State::Busy if self.wait_turn.load(Ordering::Relaxed) => format!(
                        "{op}: waited {:?} for another call on this communicator to end, and it still runs: that \
                         call's peers are slow or gone",
                        self.turn_timeout
                    ),
                    State::Busy => format!(
                        "{op}: another call on this communicator is running: call collectives of one communicator \
                         from one thread at a time"
                    ),
                    State::Interrupted => {
                        format!("{op}: an earlier call was interrupted: create a new accord.Communicator")
                    }
                    State::HandedOver => format!(
                        "{op}: this communicator was handed to an accord.device.DeviceComm: call the DeviceComm's \
                         barrier(), or create another accord.Communicator for host collectives"
                    ),
                    _ => format!("{op}: the communicator is closed: create a new accord.Communicator"),
                };
                let kind = match other {
                    State::Busy if self.wait_turn.load(Ordering::Relaxed) => Kind::Timeout,
                    State::Busy => Kind::InvalidRequest,
                    _ => Kind::Shutdown,
                };
                *state = other;
                Err(error(kind, message))
            }
        }
    }

    /// Waits until no call has the communicator, or until `deadline`.
    fn wait_while_busy(&self, deadline: Instant) {
        let mut state = self.state.lock().unwrap();
        while matches!(*state, State::Busy) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            state = self.turn.wait_timeout(state, left).unwrap().0;
        }
    }

    /// Puts the communicator into `next` after a call, and wakes the calls waiting their turn.
    fn give_back(&self, next: State) {
        *self.state.lock().unwrap() = next;
        self.turn.notify_all();
    }

    /// Runs `job` on the communicator, off the GIL; see [`background`].
    fn run<R: Send + 'static>(
        &self,
        py: Python<'_>,
        op: &str,
        job: impl FnOnce(&mut Comm) -> Result<R, CollError> + Send + 'static,
    ) -> PyResult<R> {
        let mut comm = self.take(py, op)?;
        let work = move || {
            let outcome = job(&mut comm);
            (comm, outcome)
        };
        let finished = if self.off_thread(py) { background(py, work) } else { Ok(py.detach(work)) };
        match finished {
            Ok((comm, outcome)) => {
                self.give_back(State::Ready(comm));
                outcome.map_err(coll_error)
            }
            Err(e) => {
                self.give_back(State::Interrupted);
                Err(e)
            }
        }
    }

    fn check_rank(&self, op: &str, what: &str, rank: usize) -> PyResult<()> {
        if rank >= self.world_size {
            return Err(error(
                Kind::InvalidRequest,
                format!("{op}: {what} {rank} is out of range: ranks are 0..{} here", self.world_size),
            ));
        }
        Ok(())
    }

    fn check_peer(&self, op: &str, peer: usize) -> PyResult<()> {
        self.check_rank(op, "peer", peer)?;
        if peer == self.rank {
            return Err(error(Kind::InvalidRequest, format!("{op}: peer {peer} is this rank: pass another rank")));
        }
        Ok(())
    }

    /// Runs `job` on the registrations of `arrays` (all writable: `addr` set), looked up or
    /// registered on this thread, with the collective itself off the GIL (see [`Self::run`]).
    /// The registrations go back into the cache whatever the outcome, unless interrupted.
    fn run_direct<R: Send + 'static>(
        &self,
        py: Python<'_>,
        op: &str,
        arrays: &[&Array<'_>],
        job: impl FnOnce(&mut Comm, &[&LocalBuf]) -> Result<R, CollError> + Send + 'static,
    ) -> PyResult<R> {
        let mut comm = self.take(py, op)?;
        let mut regs = std::mem::take(&mut *self.registrations.lock().unwrap());
        regs.begin();
        let ids: PyResult<Vec<u64>> = arrays.iter().map(|a| regs.lookup(&comm, a)).collect();
        let ids = match ids {
            Ok(ids) => ids,
            Err(e) => {
                *self.registrations.lock().unwrap() = regs;
                self.give_back(State::Ready(comm));
                return Err(e);
            }
        };
        let work = move || {
            let bufs: Vec<&LocalBuf> = ids.iter().map(|&id| regs.buf(id)).collect();
            let outcome = job(&mut comm, &bufs);
            drop(bufs);
            (comm, regs, outcome)
        };
        // Python runs signal handlers on its main thread only, so a call from another thread
        // (the torch backend's worker) has nothing to interrupt it: it runs right here with the
        // GIL released, without starting a helper thread per call.
        let finished = if self.off_thread(py) { background(py, work) } else { Ok(py.detach(work)) };
        match finished {
            Ok((comm, regs, outcome)) => {
                *self.registrations.lock().unwrap() = regs;
                self.give_back(State::Ready(comm));
                outcome.map_err(coll_error)
            }
            Err(e) => {
                self.give_back(State::Interrupted);
                Err(e)
            }
        }
    }

    /// A collective on one array in place. With `direct` (the algorithm may use the caller's
    /// memory: its result is wanted there, or it only reads it) and a writable array, it runs
    /// on the array's own registered memory; otherwise on a staged copy, the result copied
    /// back with `copy_back`.
    fn run_in_place(
        &self,
        py: Python<'_>,
        op: &str,
        data: &Array<'_>,
        direct: bool,
        copy_back: bool,
        f: impl FnOnce(&mut Comm, Bufs<'_>) -> Result<(), CollError> + Send + 'static,
    ) -> PyResult<()> {
        if direct && data.addr.is_some() {
            let len = data.nbytes;
            return self.run_direct(py, op, &[data], move |c, bufs| f(c, Bufs::in_place(bufs[0].slice(0, len))));
        }
        let bytes = data.to_vec()?;
        let out = self.run(py, op, move |comm| in_place(comm, bytes, f))?;
        if copy_back {
            data.write(&out)?;
        }
        Ok(())
    }

    /// An out-of-place call. When both arrays are writable and do not overlap, it runs on
    /// their own registered memory. Otherwise it copies the input in, runs, and copies the
    /// output back; with `partial_output` (the collective may leave parts of the output alone)
    /// the output is copied in first too, so those parts come back as they were.
    fn run_out_of_place(
        &self,
        py: Python<'_>,
        op: &str,
        input: &Array<'_>,
        output: &Array<'_>,
        partial_output: bool,
        f: impl FnOnce(&mut Comm, Bufs<'_>) -> Result<(), CollError> + Send + 'static,
    ) -> PyResult<()> {
        if let (Some(a), Some(b)) = (input.addr, output.addr) {
            if !overlaps((a, input.nbytes), (b, output.nbytes)) {
                let (n_in, n_out) = (input.nbytes, output.nbytes);
                return self.run_direct(py, op, &[input, output], move |c, bufs| {
                    f(c, Bufs { send: bufs[0].slice(0, n_in), recv: bufs[1].slice(0, n_out) })
                });
            }
        }
        let bytes = input.to_vec()?;
        let output_bytes = if partial_output { output.to_vec()? } else { vec![0; output.nbytes] };
        let mut staging = std::mem::take(&mut *self.staging.lock().unwrap());
        let (staging, out) = self.run(py, op, move |comm| {
            out_of_place(comm, &mut staging, bytes, output_bytes, partial_output, f).map(|out| (staging, out))
        })?;
        *self.staging.lock().unwrap() = staging;
        output.write(&out)
    }

    /// Drops the communicator; with `barrier`, after a barrier (whose error is returned).
    fn shut(&self, py: Python<'_>, barrier: bool) -> PyResult<()> {
        let comm = {
            let mut state = self.state.lock().unwrap();
            match std::mem::replace(&mut *state, State::Closed) {
                State::Ready(comm) => comm,
                State::Busy => {
                    *state = State::Busy;
                    return Err(error(
                        Kind::InvalidRequest,
                        "close: another call on this communicator is running: close it once that call returns",
                    ));
                }
                State::Interrupted | State::Closed => return Ok(()),
                State::HandedOver => {
                    *state = State::HandedOver;
                    return Ok(());
                }
            }
        };
        let mut regs = std::mem::take(&mut *self.registrations.lock().unwrap());
        let outcome = background(py, move || {
            let mut comm = comm;
            let outcome = if barrier { comm.barrier() } else { Ok(()) };
            regs.clear(&comm);
            drop(comm);
            outcome
        })?;
        outcome.map_err(coll_error)
    }

    /// (this rank, the world size).
    pub(crate) fn place(&self) -> (usize, usize) {
        (self.rank, self.world_size)
    }

    /// Runs `job` on memory earlier calls registered, each region `(addr, nbytes)` exactly as
    /// registered (cache hits), on this thread, which needs no GIL: `accord.torch`'s compiled
    /// backend calls it (see `torch_native`). `None` where a region is not registered or the
    /// communicator is not ready (another call has it, or it is closed): the caller then goes
    /// the Python way, which registers, waits its turn or says what is wrong. Nothing is
    /// counted as a hit unless every region is one.
    pub(crate) fn run_registered<R>(
        &self,
        regions: &[(usize, usize)],
        job: impl FnOnce(&mut Comm, &[&LocalBuf]) -> Result<R, CollError>,
    ) -> Option<Result<R, CollError>> {
        let mut comm = {
            let mut state = self.state.lock().unwrap();
            match std::mem::replace(&mut *state, State::Busy) {
                State::Ready(comm) => comm,
                other => {
                    *state = other;
                    return None;
                }
            }
        };
        let mut regs = std::mem::take(&mut *self.registrations.lock().unwrap());
        regs.begin();
        let outcome = regs.hit_all(regions).map(|ids| {
            let bufs: Vec<&LocalBuf> = ids.iter().map(|&id| regs.buf(id)).collect();
            job(&mut comm, &bufs)
        });
        *self.registrations.lock().unwrap() = regs;
        self.give_back(State::Ready(comm));
        outcome
    }

    /// Gives the Rust communicator to a device communicator (`accord.device.DeviceComm`), which
    /// owns it from then on: the arrays this object registered and its staging buffers are
    /// deregistered first, and every later call on this object raises `ShutdownError` saying
    /// where the communicator went. A communicator has one owner because its collectives are
    /// sequenced: two owners would interleave their exchanges.
    pub(crate) fn hand_over(&self, py: Python<'_>) -> PyResult<Comm> {
        let comm = self.take(py, "accord.device.DeviceComm")?;
        self.give_back(State::HandedOver);
        let mut regs = std::mem::take(&mut *self.registrations.lock().unwrap());
        let staging = std::mem::take(&mut *self.staging.lock().unwrap());
        let comm = py.detach(move || {
            regs.clear(&comm);
            staging.deregister(&comm);
            comm
        });
        Ok(*comm)
    }
}

#[pymethods]
impl Communicator {
    #[new]
    #[pyo3(signature = (rank = None, world_size = None, master_addr = None, master_port = None, *, timeout = None, store = None, store_prefix = "accord/"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        rank: Option<usize>,
        world_size: Option<usize>,
        master_addr: Option<String>,
        master_port: Option<u16>,
        timeout: Option<f64>,
        store: Option<Py<PyAny>>,
        store_prefix: &str,
    ) -> PyResult<Self> {
        let timeout = match timeout {
            None => None,
            Some(t) if t.is_finite() && t > 0.0 => Some(Duration::from_secs_f64(t.min(1e9))),
            Some(t) => return Err(error(Kind::Config, format!("timeout {t} is not valid: give seconds > 0, or None"))),
        };
        let explicit = [
            ("RANK", rank.map(|r| r.to_string())),
            ("WORLD_SIZE", world_size.map(|n| n.to_string())),
            ("MASTER_ADDR", master_addr),
            ("MASTER_PORT", master_port.map(|p| p.to_string())),
        ];
        let lookup = |name: &str| match explicit.iter().find(|(n, _)| *n == name) {
            Some((_, Some(value))) => Some(value.clone()),
            _ => std::env::var(name).ok(),
        };
        let mut coll_config =
            CollConfig::from_env().map_err(|e| error(Kind::Config, format!("creating the communicator: {e}")))?;
        if let Some(t) = timeout {
            coll_config.timeout = t;
        }
        if let Some(store) = store {
            let (Some(rank), Some(world_size)) = (rank, world_size) else {
                return Err(error(
                    Kind::Config,
                    "creating the communicator: with store=, pass rank and world_size too",
                ));
            };
            let rendezvous = timeout.unwrap_or(Duration::from_secs(300));
            let prefix = store_prefix.to_string();
            return Self::through_store(py, PyStore(store), prefix, (rank, world_size), rendezvous, coll_config);
        }
        let mut bootstrap_config = BootstrapConfig::from_lookup(lookup).map_err(|e| setup_error(e.into()))?;
        if let Some(t) = timeout {
            bootstrap_config.timeout = t;
        }
        if master_port.is_none() {
            // Under torchrun's agent the bootstrap already moved Accord's own store to the port
            // after MASTER_PORT; the agent's store, which torch can reach, is on MASTER_PORT.
            let agent_holds_port = accord_coll::store::torchrun_agent_holds_master_port(&lookup);
            let port = bootstrap_config.master_port - u16::from(agent_holds_port);
            let addr = bootstrap_config.master_addr.clone();
            if let Some((store, prefix)) =
                torchrun_agent_store(py, &addr, port, bootstrap_config.rank, bootstrap_config.timeout)?
            {
                let (rank, world_size) = (bootstrap_config.rank, bootstrap_config.world_size);
                return Self::through_store(
                    py,
                    PyStore(store),
                    prefix,
                    (rank, world_size),
                    bootstrap_config.timeout,
                    coll_config,
                );
            }
            // Without torch to reach the agent's store, ours is on the next port (see above).
        }
        let turn_timeout = coll_config.timeout;
        let comm = background(py, move || -> Result<Comm, EngineSetupError> {
            accord_coll::engine::communicator_from_config(bootstrap_config, coll_config)
        })?
        .map_err(setup_error)?;
        Ok(Communicator {
            progress: comm.progress(),
            rank: comm.rank(),
            world_size: comm.world_size(),
            state: Mutex::new(State::Ready(Box::new(comm))),
            staging: Mutex::default(),
            registrations: Mutex::default(),
            interruptible: AtomicBool::new(true),
            wait_turn: AtomicBool::new(false),
            turn: Condvar::new(),
            turn_timeout,
        })
    }

    /// Whether a collective called from Python's main thread waits interruptibly (Ctrl-C raises
    /// `KeyboardInterrupt` during the wait; the default) on a helper thread, or runs in place
    /// with the GIL released, as from any other thread: no thread hop, and Ctrl-C is seen when
    /// the call returns (within its timeout), as with Gloo. The torch backend turns it off.
    #[getter]
    fn interruptible(&self) -> bool {
        self.interruptible.load(Ordering::Relaxed)
    }

    #[setter]
    fn set_interruptible(&self, on: bool) {
        self.interruptible.store(on, Ordering::Relaxed);
    }

    /// Whether a call that finds another call of this communicator running (on another thread)
    /// waits for it to end, up to the collective timeout, instead of raising at once. Off by
    /// default; `accord.torch` turns it on, since its compiled backend runs all_reduces of its
    /// own on the threads that call them.
    fn _set_wait_turn(&self, on: bool) {
        self.wait_turn.store(on, Ordering::Relaxed);
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// The address of this object's Rust state, for `accord.torch`'s compiled backend, which
    /// calls the functions of `accord._accord._torch_native_api()` on it without the GIL. The
    /// caller keeps this object alive for as long as it uses the address.
    fn _native_handle(&self) -> usize {
        self as *const Self as usize
    }

    /// Number of ranks.
    #[getter]
    fn world_size(&self) -> usize {
        self.world_size
    }

    /// This rank's stuck report now, as JSON: the collective in progress (name, sequence
    /// number, step), the ranks it waits for and the engine's view of them. Safe to call from
    /// another thread while a collective runs.
    fn stuck_report(&self, py: Python<'_>) -> PyResult<String> {
        let progress = self.progress.clone();
        let report = py.detach(move || progress.report("api"));
        serde_json::to_string(&report).map_err(|e| error(Kind::Accord, e.to_string()))
    }

    /// Writes this rank's stuck report into `directory` (default: `ACCORD_REPORT_DIR`) and
    /// returns the file's path; `accord doctor` merges the reports of every rank.
    #[pyo3(signature = (directory = None))]
    fn write_stuck_report(&self, py: Python<'_>, directory: Option<std::path::PathBuf>) -> PyResult<String> {
        let Some(dir) = directory.or_else(accord_coll::report::report_dir) else {
            return Err(error(Kind::Config, "no directory given and ACCORD_REPORT_DIR is not set".to_string()));
        };
        let progress = self.progress.clone();
        let written = py.detach(move || accord_coll::report::write_report(&dir, &progress.report("api")));
        written
            .map(|p| p.display().to_string())
            .map_err(|e| error(Kind::Accord, format!("writing the stuck report: {e}")))
    }

    /// The registration cache: (arrays registered, their bytes, hits, misses). For tests and
    /// diagnostics; empty while a call runs.
    fn _registration_stats(&self) -> (usize, usize, u64, u64) {
        self.registrations.lock().unwrap().stats()
    }

    /// Whether `close` ran (or the communicator was dropped after an interrupted call).
    #[getter]
    fn closed(&self) -> bool {
        !matches!(*self.state.lock().unwrap(), State::Ready(_) | State::Busy)
    }

    /// Reduces `array` element-wise over all ranks, in place (`op`: sum, prod, min, max, avg;
    /// avg truncates for integers). `algo` overrides the algorithm choice.
    #[pyo3(signature = (array, op = "sum", *, algo = None))]
    fn all_reduce(&self, py: Python<'_>, array: &Bound<'_, PyAny>, op: &str, algo: Option<&str>) -> PyResult<()> {
        let name = "all_reduce";
        let data = crate::coll_array::array(array, name, "array", true)?;
        let (op, algo) = (parse_op(op)?, parse_algo(Collective::AllReduce, algo)?);
        let (count, dtype) = (data.count, data.dtype);
        self.run_in_place(py, name, &data, true, true, move |c, b| c.all_reduce(b, count, dtype, op, algo))
    }

    /// Reduces `array` element-wise over all ranks into `root`'s `array` (others' arrays are
    /// left as they were).
    #[pyo3(signature = (array, root, op = "sum", *, algo = None))]
    fn reduce(
        &self,
        py: Python<'_>,
        array: &Bound<'_, PyAny>,
        root: usize,
        op: &str,
        algo: Option<&str>,
    ) -> PyResult<()> {
        let name = "reduce";
        self.check_rank(name, "root", root)?;
        let is_root = root == self.rank;
        let data = crate::coll_array::array(array, name, "array", is_root)?;
        let (op, algo) = (parse_op(op)?, parse_algo(Collective::Reduce, algo)?);
        let (count, dtype) = (data.count, data.dtype);
        self.run_in_place(py, name, &data, is_root, is_root, move |c, b| c.reduce(b, count, dtype, op, root, algo))
    }

    /// Copies `root`'s `array` into every other rank's `array`.
    #[pyo3(signature = (array, root, *, algo = None))]
    fn broadcast(&self, py: Python<'_>, array: &Bound<'_, PyAny>, root: usize, algo: Option<&str>) -> PyResult<()> {
        let name = "broadcast";
        self.check_rank(name, "root", root)?;
        let is_root = root == self.rank;
        let data = crate::coll_array::array(array, name, "array", !is_root)?;
        let algo = parse_algo(Collective::Broadcast, algo)?;
        let (count, dtype) = (data.count, data.dtype);
        // The root's array is only read (both broadcast algorithms send from it and copy it
        // onto itself, a no-op in place), so it too is used where it is.
        self.run_in_place(py, name, &data, true, !is_root, move |c, b| c.broadcast(b, count, dtype, root, algo))
    }

    /// Gathers every rank's `input` into `output` (world_size times as many elements), by rank.
    /// `input` may be this rank's block of `output` (in place).
    #[pyo3(signature = (input, output, *, algo = None))]
    fn all_gather(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        algo: Option<&str>,
    ) -> PyResult<()> {
        let name = "all_gather";
        let (input, output) = (array(input, name, "input", false)?, array(output, name, "output", true)?);
        same_dtype(name, &input, &output)?;
        expect_count(name, "output", &output, input.count * self.world_size, "world_size times the input")?;
        let algo = parse_algo(Collective::AllGather, algo)?;
        let (count, dtype) = (input.count, input.dtype);
        let (n_in, n_out, at) = (input.nbytes, output.nbytes, self.rank * input.nbytes);
        if let (Some(a), Some(b)) = (input.addr, output.addr) {
            // In place (NCCL's rule: the input is this rank's block of the output, as FSDP2 calls
            // it): the collective runs on the output alone, no staging; the schedules skip the
            // copy of a block onto itself.
            if a == b + at {
                return self.run_direct(py, name, &[&output], move |c, bufs| {
                    c.all_gather(
                        Bufs { send: bufs[0].slice(at, n_in), recv: bufs[0].slice(0, n_out) },
                        count,
                        dtype,
                        algo,
                    )
                });
            }
        }
        self.run_out_of_place(py, name, &input, &output, false, move |c, b| c.all_gather(b, count, dtype, algo))
    }

    /// Reduces `input` (world_size blocks) over all ranks; rank r's `output` gets block r.
    #[pyo3(signature = (input, output, op = "sum", *, algo = None))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        op: &str,
        algo: Option<&str>,
    ) -> PyResult<()> {
        let name = "reduce_scatter";
        let (input, output) = (array(input, name, "input", false)?, array(output, name, "output", true)?);
        same_dtype(name, &input, &output)?;
        expect_count(name, "input", &input, output.count * self.world_size, "world_size times the output")?;
        let (op, algo) = (parse_op(op)?, parse_algo(Collective::ReduceScatter, algo)?);
        let (count, dtype) = (output.count, output.dtype);
        self.run_out_of_place(py, name, &input, &output, false, move |c, b| c.reduce_scatter(b, count, dtype, op, algo))
    }

    /// Block j of `input` goes to rank j, landing at block r (this rank) of its `output`;
    /// both hold world_size equal blocks.
    #[pyo3(signature = (input, output, *, algo = None))]
    fn all_to_all(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        algo: Option<&str>,
    ) -> PyResult<()> {
        let name = "all_to_all";
        let (input, output) = (array(input, name, "input", false)?, array(output, name, "output", true)?);
        same_dtype(name, &input, &output)?;
        expect_count(name, "output", &output, input.count, "as many elements as the input")?;
        if input.count % self.world_size != 0 {
            return Err(error(
                Kind::InvalidBuffer,
                format!(
                    "all_to_all: the input has {} elements, not a multiple of world_size {}: pass world_size \
                     equal blocks",
                    input.count, self.world_size
                ),
            ));
        }
        let algo = parse_algo(Collective::AllToAll, algo)?;
        let (count, dtype) = (input.count / self.world_size, input.dtype);
        self.run_out_of_place(py, name, &input, &output, false, move |c, b| c.all_to_all(b, count, dtype, algo))
    }

    /// Block j of `input` (``send_counts[j]`` elements from ``send_displs[j]``) goes to rank j;
    /// block i of `output` (``recv_counts[i]`` elements at ``recv_displs[i]``) comes from rank i.
    /// Displacements default to the running sums of the counts (blocks packed in rank order).
    /// The count this rank sends to j must equal the count j expects from it.
    #[pyo3(signature = (input, output, send_counts, recv_counts, send_displs = None, recv_displs = None, *, algo = None))]
    #[allow(clippy::too_many_arguments)]
    fn all_to_allv(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
        send_displs: Option<Vec<usize>>,
        recv_displs: Option<Vec<usize>>,
        algo: Option<&str>,
    ) -> PyResult<()> {
        let name = "all_to_allv";
        let (input, output) = (array(input, name, "input", false)?, array(output, name, "output", true)?);
        same_dtype(name, &input, &output)?;
        let layout = all_to_allv_layout(
            self.world_size,
            self.rank,
            (send_counts, send_displs, input.count),
            (recv_counts, recv_displs, output.count),
        )
        .map_err(|message| error(Kind::InvalidBuffer, format!("{name}: {message}")))?;
        let algo = parse_algo(Collective::AllToAllV, algo)?;
        let dtype = input.dtype;
        self.run_out_of_place(py, name, &input, &output, true, move |c, b| c.all_to_allv(b, &layout, dtype, algo))
    }

    /// Sends `send` to `send_peer` while receiving from `recv_peer` into `recv` (a ring shift
    /// when every rank does it: no ordering needed to avoid a deadlock). Both arrays have the
    /// same size and dtype; the peers may be the same rank.
    fn send_recv(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        send_peer: usize,
        recv: &Bound<'_, PyAny>,
        recv_peer: usize,
    ) -> PyResult<()> {
        let name = "send_recv";
        self.check_peer(name, send_peer)?;
        self.check_peer(name, recv_peer)?;
        let (input, output) = (array(send, name, "send array", false)?, array(recv, name, "recv array", true)?);
        same_dtype(name, &input, &output)?;
        expect_count(name, "recv array", &output, input.count, "as many elements as the send array")?;
        let (count, dtype) = (input.count, input.dtype);
        self.run_out_of_place(py, name, &input, &output, false, move |c, b| {
            c.send_recv((send_peer, b.send), (recv_peer, b.recv), count, dtype)
        })
    }

    /// Sends `array` to `peer`, which calls `recv` with an array of the same size and dtype.
    fn send(&self, py: Python<'_>, array: &Bound<'_, PyAny>, peer: usize) -> PyResult<()> {
        let name = "send";
        self.check_peer(name, peer)?;
        let data = crate::coll_array::array(array, name, "array", false)?;
        let (count, dtype) = (data.count, data.dtype);
        self.run_in_place(py, name, &data, true, false, move |c, b| c.send(peer, b.send, count, dtype))
    }

    /// Receives into `array` what `peer` sends.
    fn recv(&self, py: Python<'_>, array: &Bound<'_, PyAny>, peer: usize) -> PyResult<()> {
        let name = "recv";
        self.check_peer(name, peer)?;
        let data = crate::coll_array::array(array, name, "array", true)?;
        let (count, dtype) = (data.count, data.dtype);
        self.run_in_place(py, name, &data, true, true, move |c, b| c.recv(peer, b.recv, count, dtype))
    }

    /// Returns once every rank has called it.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, "barrier", |c| c.barrier())
    }

    /// A barrier, then releases the communicator (idempotent). Every rank calls it.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.shut(py, true)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaving normally closes (with its barrier); leaving on an exception releases the
    /// communicator without one (peers then time out naming this rank).
    #[pyo3(signature = (*exc))]
    fn __exit__(&self, py: Python<'_>, exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        let failed = exc.get_item(0).is_ok_and(|t| !t.is_none());
        if failed {
            let _ = self.shut(py, false);
            Ok(false)
        } else {
            self.shut(py, true).map(|()| false)
        }
    }

    fn __repr__(&self) -> String {
        let state = match *self.state.lock().unwrap() {
            State::Ready(_) => "open",
            State::Busy => "busy",
            State::Interrupted => "interrupted",
            State::Closed => "closed",
            State::HandedOver => "handed over to a DeviceComm",
        };
        format!("Communicator(rank={}, world_size={}, {state})", self.rank, self.world_size)
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        let state = std::mem::replace(self.state.get_mut().unwrap_or_else(|e| e.into_inner()), State::Closed);
        if let State::Ready(comm) = state {
            // Dropping waits for writes in flight to be acknowledged: do it without the GIL.
            let mut comm = Some(comm);
            let _ = Python::try_attach(|py| py.detach(|| drop(comm.take())));
            drop(comm);
        }
    }
}
