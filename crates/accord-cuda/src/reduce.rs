//! Element-wise reductions `dst = a op b` on the GPU, for the reduce steps of
//! host-driven collectives (ring reduce-scatter, recursive halving, ...).

pub mod host_reference;
pub mod source;

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;

use crate::context::Gpu;
use crate::error::{CudaError, Result};
use crate::ffi::launch;
use crate::kernels::{Kernel, Module};
use crate::memory::{check_device_range, DevicePtr};
use crate::stream::Stream;
use source::{reduce_grid_blocks, reduce_kernel_name, reduce_module_source, REDUCE_BLOCK_THREADS};

/// Element types the reduction kernels support.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16 (`__half`).
    F16,
    /// bfloat16 (`__nv_bfloat16`).
    BF16,
    /// 32-bit signed integer (wrapping).
    I32,
    /// 64-bit signed integer (wrapping).
    I64,
}

impl DType {
    /// Every supported type.
    pub const ALL: [DType; 5] = [DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64];

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
        }
    }

    /// Short name, as in kernel names (`f32`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }

    /// The CUDA C++ type.
    pub fn c_type(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::F16 => "__half",
            DType::BF16 => "__nv_bfloat16",
            DType::I32 => "int",
            DType::I64 => "long long",
        }
    }
}

/// A reduction operation. `Avg` computes `(a + b) / divisor` (integer
/// division for integer types), so a collective sums in every step but the
/// last and passes the number of ranks there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// `a + b`.
    Sum,
    /// `a * b`.
    Prod,
    /// `min(a, b)`; NaN wins.
    Min,
    /// `max(a, b)`; NaN wins.
    Max,
    /// `(a + b) / divisor`, divisor at least 1.
    Avg {
        /// What the sum is divided by (usually the number of ranks).
        divisor: u32,
    },
}

impl ReduceOp {
    /// The kernel family of this operation.
    pub fn kind(self) -> ReduceOpKind {
        match self {
            ReduceOp::Sum => ReduceOpKind::Sum,
            ReduceOp::Prod => ReduceOpKind::Prod,
            ReduceOp::Min => ReduceOpKind::Min,
            ReduceOp::Max => ReduceOpKind::Max,
            ReduceOp::Avg { .. } => ReduceOpKind::Avg,
        }
    }

    /// The divisor passed to the kernel (1 for operations other than `Avg`).
    pub fn divisor(self) -> u32 {
        match self {
            ReduceOp::Avg { divisor } => divisor,
            _ => 1,
        }
    }
}

/// An operation without its parameters: one kernel per kind and type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum ReduceOpKind {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Average.
    Avg,
}

impl ReduceOpKind {
    /// Every kind.
    pub const ALL: [ReduceOpKind; 5] =
        [ReduceOpKind::Sum, ReduceOpKind::Prod, ReduceOpKind::Min, ReduceOpKind::Max, ReduceOpKind::Avg];

    /// Short name, as in kernel names.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOpKind::Sum => "sum",
            ReduceOpKind::Prod => "prod",
            ReduceOpKind::Min => "min",
            ReduceOpKind::Max => "max",
            ReduceOpKind::Avg => "avg",
        }
    }

    /// The `ACCORD_OP_*` macro of the kernel source.
    pub fn macro_name(self) -> &'static str {
        match self {
            ReduceOpKind::Sum => "ACCORD_OP_SUM",
            ReduceOpKind::Prod => "ACCORD_OP_PROD",
            ReduceOpKind::Min => "ACCORD_OP_MIN",
            ReduceOpKind::Max => "ACCORD_OP_MAX",
            ReduceOpKind::Avg => "ACCORD_OP_AVG",
        }
    }
}

/// The reduction kernels of one GPU, compiled once (NVRTC, cached per
/// source and architecture) and loaded into its context. Create one per GPU
/// and share it.
#[derive(Debug)]
pub struct Reducer {
    gpu: Gpu,
    kernels: HashMap<(ReduceOpKind, DType), Kernel>,
    _module: Arc<Module>,
    /// The most blocks one launch uses (0: [`reduce_grid_blocks`]'s, which fill every SM).
    blocks_max: u32,
}

impl Reducer {
    /// Compiles and loads the kernels of every operation and type.
    pub fn new(gpu: &Gpu) -> Result<Reducer> {
        Reducer::with_types(gpu, &DType::ALL)
    }

    /// Compiles and loads the kernels of every operation for `dtypes` only
    /// (leave out F16/BF16 where the CUDA headers are not available).
    pub fn with_types(gpu: &Gpu, dtypes: &[DType]) -> Result<Reducer> {
        let source = reduce_module_source(&ReduceOpKind::ALL, dtypes);
        let module = Module::compile_and_load(gpu, &source, "accord_reduce.cu")?;
        let mut kernels = HashMap::new();
        for dtype in dtypes {
            for op in ReduceOpKind::ALL {
                kernels.insert((op, *dtype), module.kernel(&reduce_kernel_name(op, *dtype))?);
            }
        }
        Ok(Reducer { gpu: gpu.clone(), kernels, _module: module, blocks_max: 0 })
    }

    /// Caps every launch at `blocks_max` blocks (0: no cap beyond [`reduce_grid_blocks`]'s).
    /// Why: a reduction queued beside other work (DDP's backward pass) takes every SM for its
    /// few microseconds with the full grid; a small grid leaves SMs to that work and loops more.
    pub fn with_blocks_max(mut self, blocks_max: u32) -> Reducer {
        self.blocks_max = blocks_max;
        self
    }

    /// The blocks a launch of `count` elements of `dtype` uses.
    pub fn grid_blocks(&self, count: usize, dtype: DType) -> u32 {
        let blocks = reduce_grid_blocks(count as u64, dtype.size_bytes(), self.gpu.multiprocessor_count());
        if self.blocks_max > 0 {
            blocks.min(self.blocks_max)
        } else {
            blocks
        }
    }

    /// Queues `dst[i] = a[i] op b[i]` for `count` elements of `dtype` on
    /// `stream`. `dst` may be exactly `a` or `b` (in place), but not
    /// partially overlap them. All three ranges are checked to be inside live
    /// allocations of this GPU's address space.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce(
        &self,
        dst: DevicePtr,
        a: DevicePtr,
        b: DevicePtr,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        if op.divisor() == 0 {
            return Err(CudaError::InvalidArgument { what: "ReduceOp::Avg needs a divisor of at least 1".into() });
        }
        if !stream.gpu().same_device(&self.gpu) {
            return Err(CudaError::InvalidArgument {
                what: "the stream must belong to the Reducer's GPU; create a Reducer per GPU".into(),
            });
        }
        let kernel = self.kernels.get(&(op.kind(), dtype)).ok_or_else(|| CudaError::InvalidArgument {
            what: format!("this Reducer was built without {} kernels; use Reducer::new", dtype.name()),
        })?;
        let len_bytes = count.checked_mul(dtype.size_bytes()).ok_or_else(|| CudaError::InvalidArgument {
            what: format!("{count} elements overflow the address space"),
        })?;
        for (name, ptr) in [("a", a), ("b", b)] {
            if overlaps_partially(dst, ptr, len_bytes) {
                return Err(CudaError::InvalidArgument {
                    what: format!(
                        "dst partially overlaps {name}; use the same pointer for in-place or disjoint ranges"
                    ),
                });
            }
        }
        self.gpu.bind()?;
        for ptr in [dst, a, b] {
            check_device_range(ptr, len_bytes)?;
        }
        let blocks = self.grid_blocks(count, dtype);
        launch::reduce(
            kernel,
            launch::ReduceLaunch {
                grid_blocks: blocks,
                block_threads: REDUCE_BLOCK_THREADS,
                dst,
                a,
                b,
                count: count as u64,
                divisor: f64::from(op.divisor()),
            },
            stream,
        )
    }
}

/// Whether two ranges of `len_bytes` overlap without being identical.
pub fn overlaps_partially(x: DevicePtr, y: DevicePtr, len_bytes: usize) -> bool {
    x != y && x.0 < y.0.saturating_add(len_bytes as u64) && y.0 < x.0.saturating_add(len_bytes as u64)
}

#[cfg(test)]
mod tests;
