//! Element types of collective buffers, and the [`Element`] trait that ties a
//! Rust type to its [`DType`].

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};

/// The element type of a collective buffer.
///
/// Buffers are byte slices; the dtype says how to interpret them (native
/// endianness, as on the GPU and the host of the same machine).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary64.
    F64,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    BF16,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
}

impl DType {
    /// Every dtype, in a fixed order (for tests and tables).
    pub const ALL: [DType; 8] =
        [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32, DType::I64];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }

    /// The short name nccl-tests prints (`float`, `half`, `bfloat16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::F64 => "double",
            DType::F16 => "half",
            DType::BF16 => "bfloat16",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::I32 => "int32",
            DType::I64 => "int64",
        }
    }

    /// Whether this is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// A one-byte code used on the wire (handshakes).
    pub const fn code(self) -> u8 {
        match self {
            DType::F32 => 0,
            DType::F64 => 1,
            DType::F16 => 2,
            DType::BF16 => 3,
            DType::I8 => 4,
            DType::U8 => 5,
            DType::I32 => 6,
            DType::I64 => 7,
        }
    }

    /// Inverse of [`DType::code`].
    pub fn from_code(code: u8) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.code() == code)
    }

    /// Number of whole elements in `bytes`, or an error if `bytes` is not a
    /// multiple of the element size.
    pub fn count_of(self, bytes: usize) -> Result<usize, ReduceError> {
        if bytes % self.size_bytes() != 0 {
            return Err(ReduceError::NotWholeElements { bytes, dtype: self });
        }
        Ok(bytes / self.size_bytes())
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = ReduceError;

    /// Accepts the nccl-tests names and the Rust names (`f32`, `bf16`, ...).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let d = match s.to_ascii_lowercase().as_str() {
            "float" | "f32" | "float32" => DType::F32,
            "double" | "f64" | "float64" => DType::F64,
            "half" | "f16" | "float16" => DType::F16,
            "bfloat16" | "bf16" => DType::BF16,
            "int8" | "i8" => DType::I8,
            "uint8" | "u8" => DType::U8,
            "int32" | "i32" | "int" => DType::I32,
            "int64" | "i64" => DType::I64,
            _ => return Err(ReduceError::UnknownDType { name: s.to_string() }),
        };
        Ok(d)
    }
}

/// A Rust element type with a [`DType`]: plain old data, so slices of it can be
/// viewed as bytes and back.
pub trait Element: bytemuck::Pod + PartialEq + fmt::Debug + Send + Sync + 'static {
    /// The dtype of this Rust type.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => { $(impl Element for $t { const DTYPE: DType = DType::$d; })* };
}
element!(f32 => F32, f64 => F64, f16 => F16, bf16 => BF16, i8 => I8, u8 => U8, i32 => I32, i64 => I64);

#[cfg(test)]
mod tests;

/// Errors of the element-wise reduction kernels and of parsing their types and ops (here, beside
/// [`DType`], which one of them names; `crate::error` re-exports it with the other error enums).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReduceError {
    /// A byte length is not a whole number of elements.
    #[error("{bytes} bytes is not a whole number of {dtype} elements; pass a length that is a multiple of {}", dtype.size_bytes())]
    NotWholeElements {
        /// The offending length.
        bytes: usize,
        /// The element type.
        dtype: DType,
    },
    /// Destination and source lengths differ.
    #[error("reduction destination has {dst_bytes} bytes but source has {src_bytes}; pass slices of equal length")]
    LengthMismatch {
        /// Destination length.
        dst_bytes: usize,
        /// Source length.
        src_bytes: usize,
    },
    /// A dtype name was not recognised.
    #[error("unknown dtype {name:?}; use one of float, double, half, bfloat16, int8, uint8, int32, int64")]
    UnknownDType {
        /// The name given.
        name: String,
    },
    /// A reduction op name was not recognised.
    #[error("unknown reduction op {name:?}; use one of sum, prod, min, max, avg")]
    UnknownOp {
        /// The name given.
        name: String,
    },
}
