//! Registering caller memory: turning a Python object into a checked range of host memory
//! (buffer protocol or DLPack) or of CUDA device memory (DLPack), the [`MemoryRegion`] that keeps it alive while registered, and
//! the bookkeeping that lets a region be released only when no transfer still reads it.
//!
//! The buffer protocol's C API is not in Python's limited API before 3.11, so the crate (an
//! abi3 wheel for 3.9+) reaches the bytes through `memoryview` (for the checks) and
//! `ctypes.c_char.from_buffer` (for the address; the ctypes object holds the buffer export, so
//! the exporter cannot resize or free the memory while we hold it).

use crate::core::{Core, Deregister, LiveEngine};
use crate::dlpack;
use crate::errors::{error, register_error, Kind};
use crate::values::{wait_in_slices, Descriptor};
use accord_engine::{MemoryKind, MrDescriptor, MrHandle, Transfer};
use pyo3::prelude::*;
use pyo3::types::PyMemoryView;
use std::sync::{Arc, Mutex, RwLock};

/// What holds registered memory alive: the object the caller passed, and what exported its
/// memory to us (a ctypes view holding a buffer export, or a DLPack capsule).
pub(crate) struct Keep {
    obj: Py<PyAny>,
    _export: Py<PyAny>,
}

/// A checked range of writable, C-contiguous memory (host, or one CUDA device's), and what
/// keeps it alive.
pub(crate) struct Acquired {
    pub(crate) ptr: usize,
    pub(crate) nbytes: usize,
    pub(crate) kind: MemoryKind,
    pub(crate) keep: Keep,
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "object".into())
}

fn invalid(message: String) -> PyErr {
    error(Kind::InvalidBuffer, message)
}

/// Checks `obj` and finds its memory: the buffer protocol first, DLPack (`torch` tensors and
/// other array libraries) second.
pub(crate) fn acquire(obj: &Bound<'_, PyAny>) -> PyResult<Acquired> {
    let name = type_name(obj);
    match PyMemoryView::from(obj) {
        Ok(view) => acquire_buffer(obj, view.as_any(), &name),
        Err(buffer_err) => {
            if obj.hasattr("__dlpack__")? {
                return acquire_dlpack(obj, &name);
            }
            Err(invalid(format!(
                "cannot register a {name}: it supports neither the buffer protocol nor DLPack ({}): pass a numpy \
                 array, a bytearray, a torch CPU tensor or another writable buffer",
                buffer_err.value(obj.py())
            )))
        }
    }
}

fn acquire_buffer(obj: &Bound<'_, PyAny>, view: &Bound<'_, PyAny>, name: &str) -> PyResult<Acquired> {
    if view.getattr("readonly")?.is_truthy()? {
        return Err(invalid(format!(
            "cannot register a read-only {name}: peers write into registered memory; register a writable copy \
             (bytearray(data), array.copy()) instead"
        )));
    }
    if !view.getattr("c_contiguous")?.is_truthy()? {
        return Err(invalid(format!(
            "cannot register a {name} that is not C-contiguous (a strided slice or a transposed array): register \
             numpy.ascontiguousarray(x) and copy back, or register the whole base array and use offsets"
        )));
    }
    let format: String = view.getattr("format")?.extract()?;
    if format.contains('O') {
        return Err(invalid(format!(
            "cannot register a {name} of Python objects (format {format:?}): peers would overwrite object \
             pointers; register numeric data (e.g. dtype uint8 or float32)"
        )));
    }
    let nbytes: usize = view.getattr("nbytes")?.extract()?;
    if nbytes == 0 {
        return Err(invalid(format!("cannot register an empty {name}: a region holds at least one byte")));
    }
    let ctypes = obj.py().import("ctypes")?;
    let export = ctypes.getattr("c_char")?.call_method1("from_buffer", (view,))?;
    let ptr: usize = ctypes.call_method1("addressof", (&export,))?.extract()?;
    Ok(Acquired {
        ptr,
        nbytes,
        kind: MemoryKind::Host,
        keep: Keep { obj: obj.clone().unbind(), _export: export.unbind() },
    })
}

/// `obj.__dlpack__()`; for a torch CUDA tensor with that tensor's device made current first
/// (torch refuses to export a tensor of another device than the current one).
fn export_dlpack<'py>(obj: &Bound<'py, PyAny>, device_type: i32, device_id: i32) -> PyResult<Bound<'py, PyAny>> {
    let torch_device = if device_type == dlpack::DEVICE_CUDA && obj.hasattr("is_cuda")? {
        let torch = obj.py().import("torch")?;
        Some(torch.getattr("cuda")?.getattr("device")?.call1((device_id,))?)
    } else {
        None
    };
    let Some(guard) = torch_device else { return obj.call_method0("__dlpack__") };
    guard.call_method0("__enter__")?;
    let exported = obj.call_method0("__dlpack__");
    let py = obj.py();
    guard.call_method1("__exit__", (py.None(), py.None(), py.None()))?;
    exported
}

fn acquire_dlpack(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Acquired> {
    let (device_type, device_id): (i32, i32) = obj.call_method0("__dlpack_device__")?.extract()?;
    let kind = match device_type {
        dlpack::DEVICE_CPU | dlpack::DEVICE_CUDA_HOST | dlpack::DEVICE_ROCM_HOST => MemoryKind::Host,
        // CUDA device memory: the engine moves it with the copy engine between engines of this
        // host (it needs the CUDA driver at run time and says so when it is missing).
        dlpack::DEVICE_CUDA => match u32::try_from(device_id) {
            Ok(ordinal) => MemoryKind::CudaDevice { ordinal },
            Err(_) => return Err(invalid(format!("cannot register a {name}: CUDA device id {device_id} is negative"))),
        },
        dlpack::DEVICE_CUDA_MANAGED | dlpack::DEVICE_ROCM => {
            return Err(invalid(format!(
                "cannot register a {name} in {} (DLPack device {device_type}:{device_id}): only host memory and \
                 CUDA device memory can be registered; register a host copy (tensor.cpu()) instead",
                if device_type == dlpack::DEVICE_ROCM { "ROCm memory" } else { "CUDA managed memory" }
            )));
        }
        other => {
            return Err(invalid(format!(
                "cannot register a {name} on DLPack device type {other}: only host memory and CUDA device memory \
                 can be registered"
            )));
        }
    };
    let capsule = export_dlpack(obj, device_type, device_id)
        .map_err(|e| invalid(format!("cannot register a {name}: its __dlpack__() failed: {}", e.value(obj.py()))))?;
    let view = dlpack::read_capsule(&capsule).map_err(|why| invalid(format!("cannot register a {name}: {why}")))?;
    if view.device_type != device_type {
        return Err(invalid(format!(
            "cannot register a {name}: __dlpack_device__() said device type {device_type} but its capsule says {}",
            view.device_type
        )));
    }
    if view.nbytes == 0 {
        return Err(invalid(format!("cannot register an empty {name}: a region holds at least one byte")));
    }
    Ok(Acquired {
        ptr: view.ptr,
        nbytes: view.nbytes,
        kind,
        keep: Keep { obj: obj.clone().unbind(), _export: capsule.unbind() },
    })
}

/// Transfers tracked before the pending list of a region is pruned of finished ones (then the
/// bound doubles from what is still running): at most twice the transfers in flight, plus this.
const PENDING_PRUNE_MIN: usize = 64;

/// One registration: handle, descriptor, the memory's keeper, and the transfers reading it.
pub(crate) struct RegionInner {
    core: Arc<Core>,
    pub(crate) handle: MrHandle,
    pub(crate) descriptor: MrDescriptor,
    ptr: usize,
    /// Whether the engine still has the region in its table; submissions read it under the
    /// read lock, deregistration flips it under the write lock.
    registered: RwLock<bool>,
    /// Transfers that read this region (its sources), and the length that triggers a prune.
    pending: Mutex<(Vec<Transfer>, usize)>,
    keep: Mutex<Option<Keep>>,
}

impl RegionInner {
    /// Registers `acquired` with `engine`.
    pub(crate) fn register(core: &Arc<Core>, engine: &LiveEngine, acquired: Acquired) -> PyResult<Arc<Self>> {
        // Safety of the contract of `register_raw` (it is `unsafe` because we vouch for the
        // memory): `Keep` holds the exporter for as long as the region is registered and until
        // every transfer reading it completed (`close` below waits for them before dropping it).
        #[allow(unsafe_code)]
        // Safety: see above; the range was checked writable and contiguous by `acquire`.
        let registered = unsafe { engine.register_raw(acquired.ptr as *mut u8, acquired.nbytes, acquired.kind) };
        let (handle, descriptor) = registered.map_err(register_error)?;
        let inner = Arc::new(RegionInner {
            core: core.clone(),
            handle,
            descriptor,
            ptr: acquired.ptr,
            registered: RwLock::new(true),
            pending: Mutex::new((vec![], PENDING_PRUNE_MIN)),
            keep: Mutex::new(Some(acquired.keep)),
        });
        core.add_region(&inner);
        Ok(inner)
    }

    /// Registers every one of `acquired` with `engine` in one call of the engine, or none.
    pub(crate) fn register_many(
        core: &Arc<Core>,
        engine: &LiveEngine,
        acquired: Vec<Acquired>,
    ) -> PyResult<Vec<Arc<Self>>> {
        let raw: Vec<accord_engine::RawBuffer> = acquired
            .iter()
            .map(|a| accord_engine::RawBuffer { ptr: a.ptr as *mut u8, len: a.nbytes, kind: a.kind, owner: None })
            .collect();
        // Safety: as in `register`: each `Keep` holds its exporter for as long as its region is
        // registered and until every transfer reading it completed; `acquire` checked each range.
        #[allow(unsafe_code)]
        let registered = unsafe { engine.register_many(&raw) }.map_err(register_error)?;
        let mut out = Vec::with_capacity(registered.len());
        for ((handle, descriptor), a) in registered.into_iter().zip(acquired) {
            let inner = Arc::new(RegionInner {
                core: core.clone(),
                handle,
                descriptor,
                ptr: a.ptr,
                registered: RwLock::new(true),
                pending: Mutex::new((vec![], PENDING_PRUNE_MIN)),
                keep: Mutex::new(Some(a.keep)),
            });
            core.add_region(&inner);
            out.push(inner);
        }
        Ok(out)
    }

    /// Runs `submit` with the handle while the region is registered (so it cannot be released
    /// meanwhile), and tracks the transfer it returns. `None` when the region was closed.
    /// Call with the GIL released.
    pub(crate) fn submit<E>(
        &self,
        submit: impl FnOnce(&MrHandle) -> Result<Transfer, E>,
    ) -> Option<Result<Transfer, E>> {
        let registered = self.registered.read().unwrap();
        if !*registered {
            return None;
        }
        let result = submit(&self.handle);
        if let Ok(transfer) = &result {
            let mut guard = self.pending.lock().unwrap();
            let (list, prune_at) = &mut *guard;
            list.push(transfer.clone());
            if list.len() >= *prune_at {
                list.retain(|t| !t.is_done());
                *prune_at = (2 * list.len()).max(PENDING_PRUNE_MIN);
            }
        }
        Some(result)
    }

    /// Deregisters, waits for the transfers reading the region (in slices, Ctrl-C raises when
    /// `interruptible`; the region then stays held until the next `close`), then releases the
    /// memory.
    pub(crate) fn close(&self, py: Python<'_>, interruptible: bool) -> PyResult<()> {
        py.detach(|| {
            if let Some(engine) = self.core.engine_if_open() {
                self.deregister(&engine);
            } else {
                // The engine's close deregistered every region already.
                *self.registered.write().unwrap() = false;
            }
        });
        loop {
            let next = self.pending.lock().unwrap().0.pop();
            let Some(transfer) = next else { break };
            if interruptible {
                let waited = wait_in_slices(py, None, |slice| {
                    let _ = transfer.wait_timeout(slice);
                    transfer.is_done().then_some(())
                });
                if let Err(interrupted) = waited {
                    self.pending.lock().unwrap().0.push(transfer);
                    return Err(interrupted);
                }
            } else {
                py.detach(|| {
                    let _ = transfer.wait();
                });
            }
        }
        let keep = self.keep.lock().unwrap().take();
        drop(keep);
        Ok(())
    }

    /// Whether the region was registered through `core`'s engine.
    pub(crate) fn belongs_to(&self, core: &Arc<Core>) -> bool {
        Arc::ptr_eq(&self.core, core)
    }

    fn is_closed(&self) -> bool {
        self.keep.lock().unwrap().is_none()
    }
}

impl Deregister for RegionInner {
    /// Removes the region from the engine's table (no peer write lands once this returned).
    /// Call with the GIL released. Idempotent.
    fn deregister(&self, engine: &LiveEngine) {
        let mut registered = self.registered.write().unwrap();
        if *registered {
            engine.deregister(&self.handle);
            *registered = false;
        }
    }
}

impl Drop for RegionInner {
    fn drop(&mut self) {
        if !self.is_closed() {
            // Without Python (interpreter gone) the kept objects cannot be released either;
            // `Keep`'s references then leak with the interpreter, harmlessly.
            let _ = Python::try_attach(|py| self.close(py, false));
        }
    }
}

/// A registered range of caller memory (from `Engine.register` or `Engine.alloc`).
///
/// Give `descriptor` to peers that write here; pass the region itself as the source of writes.
/// It holds the registered object alive until closed; `close()` (or leaving a `with` block, or
/// garbage collection) deregisters it — no peer write lands afterwards — waits for transfers
/// still reading it, then lets the object go.
#[pyclass(module = "accord", frozen)]
pub struct MemoryRegion {
    pub(crate) inner: Arc<RegionInner>,
}

#[pymethods]
impl MemoryRegion {
    /// What peers need to write here (picklable; `str()` gives JSON).
    #[getter]
    fn descriptor(&self) -> Descriptor {
        Descriptor { inner: self.inner.descriptor }
    }

    /// Length in bytes.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.inner.handle.len()
    }

    /// Address of the first byte (diagnostics, interop).
    #[getter]
    fn data_ptr(&self) -> usize {
        self.inner.ptr
    }

    /// The registered object, or None once closed.
    #[getter]
    fn obj(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.inner.keep.lock().unwrap().as_ref().map(|k| k.obj.clone_ref(py))
    }

    /// Whether the region was closed.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Deregisters, waits for transfers still reading the region, releases the object.
    /// Idempotent; Ctrl-C interrupts the wait (call `close` again to finish).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.inner.close(py, true)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = if self.inner.is_closed() { "closed" } else { "registered" };
        format!("MemoryRegion(nbytes={}, region={}, {state})", self.inner.handle.len(), self.inner.descriptor.region)
    }
}
