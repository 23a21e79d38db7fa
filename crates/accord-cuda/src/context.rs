//! Opening a GPU (its primary context) and peer access between two GPUs.

use std::fmt;
use std::sync::Arc;

use crate::error::{CudaError, Result};
use crate::ffi::driver::{self, RawContext};

struct GpuInner {
    ordinal: usize,
    device: i32,
    ctx: RawContext,
    /// A context of our own ([`Gpu::open_private`]) rather than the primary one.
    private: bool,
    name: String,
    compute_capability: (i32, i32),
    multiprocessor_count: u32,
}

impl Drop for GpuInner {
    fn drop(&mut self) {
        // Errors cannot be returned from drop; a failed release only leaks a retain.
        if self.private {
            let _ = driver::private_ctx_destroy(self.ctx);
        } else {
            let _ = driver::primary_ctx_release(self.device);
        }
    }
}

/// One GPU, opened through its primary context (the one PyTorch and the CUDA
/// runtime share). Cheap to clone; the context is released when the last
/// clone and every object made from it are gone.
///
/// Every operation makes the context current on the calling thread first, so
/// a `Gpu` can be used from any thread.
#[derive(Clone)]
pub struct Gpu {
    inner: Arc<GpuInner>,
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.inner.ordinal)
            .field("name", &self.inner.name)
            .field("compute_capability", &self.inner.compute_capability)
            .finish()
    }
}

impl Gpu {
    /// Opens GPU `ordinal` (as numbered under `CUDA_VISIBLE_DEVICES`).
    ///
    /// Fails with [`CudaError::NotAvailable`] where there is no driver or no
    /// GPU, and with [`CudaError::InvalidArgument`] for an ordinal out of range.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        Gpu::open_with(ordinal, false)
    }

    /// Opens GPU `ordinal` through a context of this handle's own, not the primary one.
    ///
    /// Why: the driver serialises calls per context. While any thread of the process sits in a
    /// synchronous pageable `cudaMemcpy` that waits for a kernel, copies submitted in the
    /// primary context from other threads block until that kernel ends (measured on H100/H200
    /// with the CUDA 13 driver, `docs/design/same-host-copy-engine-route.md`). If the kernel
    /// waits for those very copies (NCCL's, fed by a net plugin), the process deadlocks. Copies
    /// submitted here do not wait, for memory that no context owns (`cuMemCreate`, see
    /// [`crate::memory::has_owner_context`]) and for registered host memory.
    ///
    /// A private context costs device memory (some hundreds of MiB) and is slow to create:
    /// open it once. The calling thread's current context is left as it was.
    pub fn open_private(ordinal: usize) -> Result<Gpu> {
        Gpu::open_with(ordinal, true)
    }

    fn open_with(ordinal: usize, private: bool) -> Result<Gpu> {
        driver::ensure_driver()?;
        let count = driver::device_count()?;
        if count == 0 {
            return Err(CudaError::NotAvailable {
                reason: "the driver sees no GPU; check nvidia-smi and CUDA_VISIBLE_DEVICES".into(),
            });
        }
        if ordinal >= count as usize {
            return Err(CudaError::InvalidArgument {
                what: format!("GPU ordinal {ordinal} is out of range; this host has {count} GPU(s)"),
            });
        }
        let device = driver::device_get(ordinal as i32)?;
        let name = driver::device_name(device)?;
        let compute_capability = driver::compute_capability(device)?;
        let multiprocessor_count = driver::multiprocessor_count(device)?.max(1) as u32;
        let ctx = if private { driver::private_ctx_create(device)? } else { driver::primary_ctx_retain(device)? };
        let inner = GpuInner { ordinal, device, ctx, private, name, compute_capability, multiprocessor_count };
        let gpu = Gpu { inner: Arc::new(inner) };
        if !private {
            gpu.bind()?;
        }
        Ok(gpu)
    }

    /// Makes this GPU's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        driver::ctx_set_current(self.inner.ctx)
    }

    /// Makes this GPU's context current until the returned guard drops, which restores the
    /// thread's previous context: for code that may run on a thread it does not own (a drop
    /// on NCCL's proxy thread, say), so the thread's owner never finds our context current.
    pub fn bind_scoped(&self) -> Result<CurrentContextGuard> {
        let restore = CurrentContextGuard::save();
        self.bind()?;
        Ok(restore)
    }

    /// Blocks until all work of this GPU's context completed.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        driver::ctx_synchronize()
    }

    /// Whether this handle has a context of its own ([`Gpu::open_private`]).
    pub fn is_private(&self) -> bool {
        self.inner.private
    }

    /// The ordinal this GPU was opened with.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Compute capability `(major, minor)`, for example `(9, 0)` on H100/H200.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.inner.compute_capability
    }

    /// Number of streaming multiprocessors.
    pub fn multiprocessor_count(&self) -> u32 {
        self.inner.multiprocessor_count
    }

    /// The widest row pitch a 2D copy may use on this GPU, in bytes
    /// (`CU_DEVICE_ATTRIBUTE_MAX_PITCH`; 2^31 - 1 on current GPUs): strided copies with a wider
    /// stride must go row by row.
    pub fn max_pitch(&self) -> Result<u64> {
        driver::max_pitch(self.inner.device)
    }

    /// Whether two handles are the same GPU.
    pub fn same_device(&self, other: &Gpu) -> bool {
        self.inner.device == other.inner.device
    }

    pub(crate) fn raw_device(&self) -> i32 {
        self.inner.device
    }

    pub(crate) fn raw_context(&self) -> RawContext {
        self.inner.ctx
    }

    /// Whether this GPU can map `peer`'s memory (NVLink or PCIe P2P).
    pub fn can_access_peer(&self, peer: &Gpu) -> Result<bool> {
        if self.same_device(peer) {
            return Ok(true);
        }
        driver::can_access_peer(self.inner.device, peer.inner.device)
    }

    /// Lets kernels and copies of this GPU's context reach `peer`'s memory
    /// directly. Idempotent: enabling twice is not an error. Access is one
    /// direction; call it on both GPUs for both directions.
    pub fn enable_peer_access(&self, peer: &Gpu) -> Result<PeerAccess> {
        if self.same_device(peer) {
            return Ok(PeerAccess::SameDevice);
        }
        if !self.can_access_peer(peer)? {
            return Ok(PeerAccess::Unsupported);
        }
        self.bind()?;
        Ok(if driver::ctx_enable_peer_access(peer.raw_context())? {
            PeerAccess::Enabled
        } else {
            PeerAccess::AlreadyEnabled
        })
    }
}

/// Restores, when dropped, the context that was current on the thread when it was made. Code that
/// binds contexts on a thread it does not own (a library's callback thread) holds one, so the
/// thread's owner finds its own context current afterwards.
#[must_use = "the previous context is restored when this guard drops"]
pub struct CurrentContextGuard {
    previous: Option<RawContext>,
}

impl CurrentContextGuard {
    /// Remembers the calling thread's current context (nothing to restore without a driver).
    pub fn save() -> CurrentContextGuard {
        let previous = driver::ensure_driver().ok().and_then(|()| driver::current_context().ok());
        CurrentContextGuard { previous }
    }
}

impl Drop for CurrentContextGuard {
    fn drop(&mut self) {
        if let Some(previous) = self.previous {
            let _ = driver::ctx_set_current(previous);
        }
    }
}

/// Outcome of [`Gpu::enable_peer_access`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerAccess {
    /// Access was enabled by this call.
    Enabled,
    /// Access had been enabled before.
    AlreadyEnabled,
    /// Both handles are the same GPU; nothing to enable.
    SameDevice,
    /// The hardware cannot do it; peer copies still work, staged through the host.
    Unsupported,
}

impl PeerAccess {
    /// Whether direct access is in effect after the call.
    pub fn is_direct(self) -> bool {
        !matches!(self, PeerAccess::Unsupported)
    }
}
