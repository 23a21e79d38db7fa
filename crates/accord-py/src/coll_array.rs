//! Arrays as collective buffers: what `accord.Communicator` accepts (any C-contiguous buffer
//! of a supported element type: numpy arrays, torch CPU tensors through `.numpy()` or DLPack),
//! checked before anything is sent; the bytes copied out of it into a `Vec` the communicator
//! registers, and the result copied back in.
//!
//! The element type comes from the buffer's struct format (`f` float32, `d` float64, `e`
//! float16, `b`/`B` int8/uint8, signed integers of 4 or 8 bytes int32/int64). bfloat16 has no
//! buffer-protocol format: a torch `bfloat16` tensor or an `ml_dtypes.bfloat16` numpy array is
//! recognised by its `dtype` and read through a 16-bit integer view of the same memory.

use crate::errors::{error, Kind};
use accord_coll::DType;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyMemoryView, PyString, PyType};

/// A checked array: its flat byte view (format `B`), element type and count.
pub(crate) struct Array<'py> {
    /// The object the caller passed (kept alive by a registration of its memory).
    pub(crate) obj: Bound<'py, PyAny>,
    /// `memoryview(obj).cast("B")`: reading gives the bytes, slice assignment writes them back.
    /// `None` for a torch CPU tensor or numpy array read without one ([`torch_cpu_tensor`],
    /// [`numpy_array`]): made when first needed ([`Array::bytes_view`]), which a call on memory
    /// registered already never is.
    pub(crate) bytes_view: Option<Bound<'py, PyAny>>,
    /// The address of the first byte, for writable arrays (only those are registered in place:
    /// a registration lets peers write, which read-only memory must never see).
    pub(crate) addr: Option<usize>,
    pub(crate) dtype: DType,
    pub(crate) count: usize,
    pub(crate) nbytes: usize,
}

fn invalid(message: String) -> PyErr {
    error(Kind::InvalidBuffer, message)
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "object".into())
}

/// Whether a struct-module format names a byte order other than this machine's.
fn foreign_byte_order(format: &str) -> bool {
    if cfg!(target_endian = "little") {
        format.starts_with(['>', '!'])
    } else {
        format.starts_with('<')
    }
}

/// The element type collectives take for numbers of `kind` (numpy's letters: `f` float, `i`
/// signed, `u` unsigned integer) and `size` bytes: the one table both array readers use.
fn dtype_of_kind(kind: char, size: usize) -> Option<DType> {
    match (kind, size) {
        ('f', 4) => Some(DType::F32),
        ('f', 8) => Some(DType::F64),
        ('f', 2) => Some(DType::F16),
        ('i', 1) => Some(DType::I8),
        ('u', 1) => Some(DType::U8),
        ('i', 4) => Some(DType::I32),
        ('i', 8) => Some(DType::I64),
        _ => None,
    }
}

/// The element type of a struct-module format with `itemsize` bytes (its byte order is the
/// caller's to check: see [`foreign_byte_order`]).
fn dtype_of(format: &str, itemsize: usize) -> Option<DType> {
    let kind = match format.trim_start_matches(['@', '=', '<', '>', '!']) {
        "f" | "d" | "e" => 'f',
        "b" | "h" | "i" | "l" | "q" | "n" => 'i',
        "B" => 'u',
        _ => return None,
    };
    dtype_of_kind(kind, itemsize)
}

/// Whether `obj` is a torch tensor or numpy array of bfloat16 (`str(obj.dtype)` is
/// `torch.bfloat16` or `bfloat16`, the name `ml_dtypes` gives numpy's extension type).
fn is_bfloat16(obj: &Bound<'_, PyAny>) -> bool {
    let Ok(dtype) = obj.getattr("dtype") else { return false };
    dtype.str().is_ok_and(|s| matches!(s.to_cow().as_deref(), Ok("torch.bfloat16" | "bfloat16")))
}

/// Whether `obj` is a torch tensor on a GPU (`obj.is_cuda`).
fn is_cuda_tensor(obj: &Bound<'_, PyAny>) -> bool {
    obj.getattr("is_cuda").is_ok_and(|v| v.is_truthy().unwrap_or(false))
}

/// A 16-bit integer view of a bfloat16 array or tensor: same memory, a buffer-protocol format.
fn bfloat16_bits<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let viewed = if obj.hasattr("numpy")? {
        let int16 = py.import("torch")?.getattr("int16")?;
        obj.call_method0("detach").and_then(|t| t.call_method1("view", (int16,)))
    } else {
        let uint16 = py.import("numpy")?.getattr("uint16")?;
        obj.call_method1("view", (uint16,))
    };
    viewed.map_err(|e| invalid(format!("cannot read the bfloat16 {name} as 16-bit words: {}", e.value(py))))
}

/// The memoryview of `obj`: the buffer protocol directly, else (torch tensors) `obj.numpy()`,
/// else `numpy.from_dlpack(obj)`.
fn memoryview_of<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Bound<'py, PyMemoryView>> {
    if let Ok(view) = PyMemoryView::from(obj) {
        return Ok(view);
    }
    let py = obj.py();
    if is_cuda_tensor(obj) {
        return Err(invalid(format!(
            "a {name} on a GPU is not accepted by accord.Communicator, which works on host memory: pass \
             tensor.cpu() (and copy the result back), or use the GPU communicator"
        )));
    }
    let converted = if obj.hasattr("numpy")? {
        obj.call_method0("detach").and_then(|t| t.call_method0("numpy"))
    } else if obj.hasattr("__dlpack__")? {
        py.import("numpy").and_then(|np| np.call_method1("from_dlpack", (obj,)))
    } else {
        return Err(invalid(format!(
            "a {name} is not an array: pass a numpy array (or a torch CPU tensor) of float32, float64, float16, \
             bfloat16, int8, uint8, int32 or int64"
        )));
    };
    let converted = converted.map_err(|e| invalid(format!("cannot use a {name} as a host array: {}", e.value(py))))?;
    PyMemoryView::from(&converted).map_err(|e| invalid(format!("cannot read a {name}: {}", e.value(py))))
}

/// Checks `obj` for `what` (`"input"`, `"output"`...) of `op`; `writable` when results are
/// written into it.
pub(crate) fn array<'py>(obj: &Bound<'py, PyAny>, op: &str, what: &str, writable: bool) -> PyResult<Array<'py>> {
    if let Some(tensor) = torch_cpu_tensor(obj)? {
        return Ok(tensor);
    }
    if let Some(ndarray) = numpy_array(obj)? {
        return Ok(ndarray);
    }
    let name = type_name(obj);
    let bfloat16 = is_bfloat16(obj);
    let view = if bfloat16 { memoryview_of(&bfloat16_bits(obj, &name)?, &name)? } else { memoryview_of(obj, &name)? };
    if writable && view.getattr("readonly")?.is_truthy()? {
        return Err(invalid(format!(
            "{op}: the {what} ({name}) is read-only but results are written into it: pass a writable array \
             (array.copy())"
        )));
    }
    if !view.getattr("c_contiguous")?.is_truthy()? {
        return Err(invalid(format!(
            "{op}: the {what} ({name}) is not C-contiguous (a strided slice or a transposed array): pass \
             numpy.ascontiguousarray(x) and copy the result back"
        )));
    }
    let format: String = view.getattr("format")?.extract()?;
    let itemsize: usize = view.getattr("itemsize")?.extract()?;
    let dtype = if bfloat16 { Some(DType::BF16) } else { dtype_of(&format, itemsize) };
    if foreign_byte_order(&format) {
        return Err(invalid(format!(
            "{op}: the {what} ({name}) is in the other byte order (format {format:?}): pass \
             array.astype(array.dtype.newbyteorder(\"=\"))"
        )));
    }
    let dtype = dtype.ok_or_else(|| {
        invalid(format!(
            "{op}: the {what} ({name}) has elements of format {format:?} ({itemsize} bytes), which collectives do \
             not reduce: use float32, float64, float16, bfloat16, int8, uint8, int32 or int64"
        ))
    })?;
    let nbytes: usize = view.getattr("nbytes")?.extract()?;
    if nbytes == 0 {
        return Err(invalid(format!("{op}: the {what} ({name}) is empty: pass at least one element")));
    }
    let bytes_view = view.call_method1("cast", ("B",))?;
    let addr = if view.getattr("readonly")?.is_truthy()? { None } else { Some(address_of(&bytes_view)?) };
    Ok(Array { obj: obj.clone(), bytes_view: Some(bytes_view), addr, dtype, count: nbytes / itemsize, nbytes })
}

/// Module `name` if the program imported it (this module imports neither torch nor numpy).
fn imported<'py>(py: Python<'py>, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(py.import("sys")?.getattr("modules")?.get_item(name).ok())
}

static NDARRAY: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// `numpy.ndarray`, or `None` while the program has not imported numpy.
fn ndarray_type(py: Python<'_>) -> PyResult<Option<&Py<PyType>>> {
    if let Some(t) = NDARRAY.get(py) {
        return Ok(Some(t));
    }
    let Some(numpy) = imported(py, "numpy")? else { return Ok(None) };
    let _ = NDARRAY.set(py, numpy.getattr("ndarray")?.cast_into::<PyType>()?.unbind());
    Ok(NDARRAY.get(py))
}

/// The element type of a numpy `typestr` in this machine's byte order (`<f4`, `|u1`...).
fn dtype_of_typestr(typestr: &str) -> Option<DType> {
    let native = if cfg!(target_endian = "little") { '<' } else { '>' };
    let mut chars = typestr.chars();
    let (order, kind) = (chars.next()?, chars.next()?);
    if order != native && order != '|' && order != '=' {
        return None;
    }
    dtype_of_kind(kind, chars.as_str().parse().ok()?)
}

/// A plain `numpy.ndarray`, C-contiguous (no strides given), writable, not empty and of a
/// dtype collectives take in this machine's byte order, as an array read through one
/// `__array_interface__` lookup: no memoryview and no ctypes object. Anything else is `None`,
/// left to the general path, which checks it and words the error. Why: as for torch tensors
/// (see [`torch_cpu_tensor`]), that path cost a 4 KiB call about 4 us on a fast core, most of
/// it in Python objects made and dropped.
fn numpy_array<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Option<Array<'py>>> {
    let py = obj.py();
    let Some(ndarray) = ndarray_type(py)? else { return Ok(None) };
    if !obj.get_type().is(ndarray.bind(py)) {
        return Ok(None);
    }
    let interface = obj.getattr(intern!(py, "__array_interface__"))?;
    if !interface.get_item(intern!(py, "strides"))?.is_none() {
        return Ok(None);
    }
    let typestr: String = interface.get_item(intern!(py, "typestr"))?.extract()?;
    let Some(dtype) = dtype_of_typestr(&typestr) else { return Ok(None) };
    let shape: Vec<usize> = interface.get_item(intern!(py, "shape"))?.extract()?;
    let (addr, readonly): (usize, bool) = interface.get_item(intern!(py, "data"))?.extract()?;
    let count: usize = shape.iter().product();
    if shape.is_empty() || count == 0 || readonly {
        return Ok(None);
    }
    let nbytes = count * dtype.size_bytes();
    Ok(Some(Array { obj: obj.clone(), bytes_view: None, addr: Some(addr), dtype, count, nbytes }))
}

/// `torch.Tensor` and the array element type of each torch dtype collectives take, looked up
/// once torch is imported (this module never imports it itself).
struct TorchTypes {
    tensor: Py<PyType>,
    /// `torch.strided`, the dense layout.
    strided: Py<PyAny>,
    dtypes: Vec<(Py<PyAny>, DType)>,
}

static TORCH_TYPES: PyOnceLock<TorchTypes> = PyOnceLock::new();

/// The torch types, or `None` while the program has not imported torch.
fn torch_types(py: Python<'_>) -> PyResult<Option<&TorchTypes>> {
    if let Some(types) = TORCH_TYPES.get(py) {
        return Ok(Some(types));
    }
    let Some(torch) = imported(py, "torch")? else { return Ok(None) };
    let tensor = torch.getattr("Tensor")?.cast_into::<PyType>()?.unbind();
    let strided = torch.getattr("strided")?.unbind();
    let named = [
        ("float32", DType::F32),
        ("float64", DType::F64),
        ("float16", DType::F16),
        ("bfloat16", DType::BF16),
        ("int8", DType::I8),
        ("uint8", DType::U8),
        ("int32", DType::I32),
        ("int64", DType::I64),
    ];
    let dtypes = named.iter().map(|&(n, d)| Ok((torch.getattr(n)?.unbind(), d))).collect::<PyResult<Vec<_>>>()?;
    let _ = TORCH_TYPES.set(py, TorchTypes { tensor, strided, dtypes });
    Ok(TORCH_TYPES.get(py))
}

/// Whether `obj` is a torch tensor (a subclass too), without importing torch: false while the
/// program has not imported it.
pub(crate) fn is_torch_tensor(obj: &Bound<'_, PyAny>) -> bool {
    matches!(torch_types(obj.py()), Ok(Some(types)) if obj.is_instance(types.tensor.bind(obj.py())).unwrap_or(false))
}

/// A plain `torch.Tensor` on the CPU, dense, contiguous, of a dtype collectives take and not
/// empty, as an array read through the tensor's own accessors (`data_ptr`, `numel`, `dtype`):
/// no numpy array, memoryview or ctypes object is made. Anything else (a subclass, a sparse,
/// strided or empty tensor, a negative view, a complex dtype) is `None`, left to the general path, which
/// checks it and words the error. Why: that path made five Python objects a tensor and read
/// eight attributes; on the 2xH200 host's cores the Python side of a 1 MiB call through
/// `torch.distributed` cost up to a third of its time (stop 45, torch_overhead_probe.py).
fn torch_cpu_tensor<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Option<Array<'py>>> {
    let py = obj.py();
    let Some(types) = torch_types(py)? else { return Ok(None) };
    if !obj.get_type().is(types.tensor.bind(py)) {
        return Ok(None);
    }
    // Names interned once (`intern!`): a `&str` would make and hash a new Python string per
    // lookup, seven a tensor.
    let called = |method: &Bound<'py, PyString>| -> PyResult<bool> { obj.call_method0(method)?.is_truthy() };
    // The dtype first: only real dtypes are taken, and torch sets the conjugate bit on complex
    // tensors alone, so `is_conj` need not be asked; the element size follows from the dtype.
    let dtype_obj = obj.getattr(intern!(py, "dtype"))?;
    let Some(dtype) = types.dtypes.iter().find(|(d, _)| d.bind(py).is(&dtype_obj)).map(|&(_, d)| d) else {
        return Ok(None);
    };
    // Dense before contiguous: a sparse layout has no `is_contiguous` to ask.
    if !obj.getattr(intern!(py, "is_cpu"))?.is_truthy()?
        || !obj.getattr(intern!(py, "layout"))?.is(types.strided.bind(py))
        || !called(intern!(py, "is_contiguous"))?
        || called(intern!(py, "is_neg"))?
    {
        return Ok(None);
    }
    let count: usize = obj.call_method0(intern!(py, "numel"))?.extract()?;
    if count == 0 {
        return Ok(None);
    }
    let addr: usize = obj.call_method0(intern!(py, "data_ptr"))?.extract()?;
    let nbytes = count * dtype.size_bytes();
    Ok(Some(Array { obj: obj.clone(), bytes_view: None, addr: Some(addr), dtype, count, nbytes }))
}

/// The address of a writable, non-empty byte memoryview's first byte (through `ctypes`, as
/// the stable ABI this module builds for has no buffer-protocol access before Python 3.11).
fn address_of(bytes_view: &Bound<'_, PyAny>) -> PyResult<usize> {
    let ctypes = bytes_view.py().import("ctypes")?;
    let first = ctypes.getattr("c_char")?.call_method1("from_buffer", (bytes_view,))?;
    ctypes.call_method1("addressof", (first,))?.extract()
}

impl<'py> Array<'py> {
    /// `memoryview(obj).cast("B")`, made now where [`torch_cpu_tensor`] or [`numpy_array`] read
    /// the array without one.
    pub(crate) fn bytes_view(&self) -> PyResult<Bound<'py, PyAny>> {
        if let Some(view) = &self.bytes_view {
            return Ok(view.clone());
        }
        let name = type_name(&self.obj);
        let view = if self.dtype == DType::BF16 {
            memoryview_of(&bfloat16_bits(&self.obj, &name)?, &name)?
        } else {
            memoryview_of(&self.obj, &name)?
        };
        view.call_method1("cast", ("B",))
    }

    /// A copy of the array's bytes.
    pub(crate) fn to_vec(&self) -> PyResult<Vec<u8>> {
        let bytes = self.bytes_view()?.call_method0("tobytes")?;
        Ok(bytes.cast::<PyBytes>()?.as_bytes().to_vec())
    }

    /// Writes `bytes` (exactly `nbytes` of them) into the array.
    pub(crate) fn write(&self, bytes: &[u8]) -> PyResult<()> {
        debug_assert_eq!(bytes.len(), self.nbytes);
        let view = self.bytes_view()?;
        view.set_item(pyo3::types::PySlice::full(view.py()), PyBytes::new(view.py(), bytes))
    }
}

/// `InvalidBufferError` unless `a` and `b` have the same element type.
pub(crate) fn same_dtype(op: &str, a: &Array<'_>, b: &Array<'_>) -> PyResult<()> {
    if a.dtype != b.dtype {
        return Err(invalid(format!(
            "{op}: input has elements of {} but output of {}: pass arrays of one dtype",
            a.dtype, b.dtype
        )));
    }
    Ok(())
}

/// `InvalidBufferError` unless `array` has `count` elements.
pub(crate) fn expect_count(op: &str, what: &str, array: &Array<'_>, count: usize, why: &str) -> PyResult<()> {
    if array.count != count {
        return Err(invalid(format!("{op}: the {what} has {} elements but needs {count} ({why})", array.count)));
    }
    Ok(())
}
