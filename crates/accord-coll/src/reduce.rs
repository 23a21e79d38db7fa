//! Element-wise reduction kernels over byte slices.
//!
//! `dst = dst (op) src`, element by element. The loops are written over typed
//! slices (viewed through `bytemuck`, no `unsafe`) as plain zips so the
//! compiler vectorises them for f32/f64 and the integer types; f16/bf16 are
//! widened to f32, combined and narrowed back ([`halves`]: vectorised integer
//! conversions for bfloat16, F16C for float16, chosen at run time). Slices whose address is not aligned to the element size fall
//! back to an unaligned element-by-element path with identical results.
//!
//! Semantics:
//! - integer `Sum` and `Prod` wrap on overflow (two's complement), like NCCL;
//! - `Avg` reduces as `Sum`; the collective then calls [`finish_avg`], which
//!   divides by the world size — for integers this is Rust's truncating
//!   division (towards zero), for floats an IEEE division;
//! - float `Min`/`Max` of a NaN input are unspecified (either operand).

use std::fmt;
use std::str::FromStr;

use bytemuck::Pod;
use half::{bf16, f16};

use crate::dtype::DType;
use crate::error::ReduceError;

/// A reduction operator.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (wrapping for integers).
    Sum,
    /// Product (wrapping for integers).
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Sum, then divide by the world size (truncating for integers).
    Avg,
}

impl ReduceOp {
    /// Every op, in a fixed order.
    pub const ALL: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg];

    /// The name nccl-tests prints.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// A one-byte wire code.
    pub const fn code(self) -> u8 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Min => 2,
            ReduceOp::Max => 3,
            ReduceOp::Avg => 4,
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = ReduceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ReduceOp::ALL
            .into_iter()
            .find(|o| o.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| ReduceError::UnknownOp { name: s.to_string() })
    }
}

/// The binary operation on one element type.
trait Arith: Pod {
    fn combine(op: ReduceOp, d: &mut [Self], s: &[Self]);
    fn div_by(x: Self, n: usize) -> Self;
}

macro_rules! arith_int {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            fn combine(op: ReduceOp, d: &mut [Self], s: &[Self]) {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => d.iter_mut().zip(s).for_each(|(a, b)| *a = a.wrapping_add(*b)),
                    ReduceOp::Prod => d.iter_mut().zip(s).for_each(|(a, b)| *a = a.wrapping_mul(*b)),
                    ReduceOp::Min => d.iter_mut().zip(s).for_each(|(a, b)| *a = (*a).min(*b)),
                    ReduceOp::Max => d.iter_mut().zip(s).for_each(|(a, b)| *a = (*a).max(*b)),
                }
            }
            fn div_by(x: Self, n: usize) -> Self {
                // World sizes are far below every type's max except i8/u8; a
                // divisor that does not fit saturates, which truncates to 0
                // (or stays x/MAX), matching exact truncating division.
                let n = <$t>::try_from(n).unwrap_or(<$t>::MAX);
                x / n
            }
        }
    )*};
}
arith_int!(i8, u8, i32, i64);

macro_rules! arith_float {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            fn combine(op: ReduceOp, d: &mut [Self], s: &[Self]) {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => d.iter_mut().zip(s).for_each(|(a, b)| *a += *b),
                    ReduceOp::Prod => d.iter_mut().zip(s).for_each(|(a, b)| *a *= *b),
                    ReduceOp::Min => d.iter_mut().zip(s).for_each(|(a, b)| *a = if *b < *a { *b } else { *a }),
                    ReduceOp::Max => d.iter_mut().zip(s).for_each(|(a, b)| *a = if *b > *a { *b } else { *a }),
                }
            }
            fn div_by(x: Self, n: usize) -> Self {
                x / n as $t
            }
        }
    )*};
}
arith_float!(f32, f64);

impl Arith for f16 {
    fn combine(op: ReduceOp, d: &mut [Self], s: &[Self]) {
        halves::combine_f16(op, d, s);
    }
    fn div_by(x: Self, n: usize) -> Self {
        f16::from_f32(x.to_f32() / n as f32)
    }
}

impl Arith for bf16 {
    fn combine(op: ReduceOp, d: &mut [Self], s: &[Self]) {
        halves::combine_bf16(op, bytemuck::cast_slice_mut(d), bytemuck::cast_slice(s));
    }
    fn div_by(x: Self, n: usize) -> Self {
        bf16::from_f32(x.to_f32() / n as f32)
    }
}

fn reduce_typed<T: Arith>(dst: &mut [u8], src: &[u8], op: ReduceOp) {
    match (bytemuck::try_cast_slice_mut::<u8, T>(dst), bytemuck::try_cast_slice::<u8, T>(src)) {
        (Ok(d), Ok(s)) => T::combine(op, d, s),
        _ => {
            // Unaligned fallback: one element at a time through stack copies.
            let size = std::mem::size_of::<T>();
            for (dc, sc) in dst.chunks_exact_mut(size).zip(src.chunks_exact(size)) {
                let mut a = [bytemuck::pod_read_unaligned::<T>(dc)];
                let b = [bytemuck::pod_read_unaligned::<T>(sc)];
                T::combine(op, &mut a, &b);
                dc.copy_from_slice(bytemuck::bytes_of(&a[0]));
            }
        }
    }
}

fn check(dst: usize, src: usize, dtype: DType) -> Result<(), ReduceError> {
    if dst != src {
        return Err(ReduceError::LengthMismatch { dst_bytes: dst, src_bytes: src });
    }
    dtype.count_of(dst).map(|_| ())
}

/// `dst = dst (op) src` element-wise. `Avg` accumulates as `Sum`.
///
/// Errors if the lengths differ or are not whole elements.
pub fn reduce_into(dst: &mut [u8], src: &[u8], dtype: DType, op: ReduceOp) -> Result<(), ReduceError> {
    check(dst.len(), src.len(), dtype)?;
    match dtype {
        DType::F32 => reduce_typed::<f32>(dst, src, op),
        DType::F64 => reduce_typed::<f64>(dst, src, op),
        DType::F16 => reduce_typed::<f16>(dst, src, op),
        DType::BF16 => reduce_typed::<bf16>(dst, src, op),
        DType::I8 => reduce_typed::<i8>(dst, src, op),
        DType::U8 => reduce_typed::<u8>(dst, src, op),
        DType::I32 => reduce_typed::<i32>(dst, src, op),
        DType::I64 => reduce_typed::<i64>(dst, src, op),
    }
    Ok(())
}

fn div_typed<T: Arith>(buf: &mut [u8], n: usize) {
    let size = std::mem::size_of::<T>();
    match bytemuck::try_cast_slice_mut::<u8, T>(buf) {
        Ok(b) => b.iter_mut().for_each(|x| *x = T::div_by(*x, n)),
        Err(_) => {
            for c in buf.chunks_exact_mut(size) {
                let v = T::div_by(bytemuck::pod_read_unaligned::<T>(c), n);
                c.copy_from_slice(bytemuck::bytes_of(&v));
            }
        }
    }
}

/// Finish an `Avg` reduction in place: divide every element by `world_size`
/// (truncating division for integers). A no-op for other ops.
pub fn finish_avg(buf: &mut [u8], dtype: DType, op: ReduceOp, world_size: usize) -> Result<(), ReduceError> {
    dtype.count_of(buf.len())?;
    if op != ReduceOp::Avg || world_size <= 1 {
        return Ok(());
    }
    match dtype {
        DType::F32 => div_typed::<f32>(buf, world_size),
        DType::F64 => div_typed::<f64>(buf, world_size),
        DType::F16 => div_typed::<f16>(buf, world_size),
        DType::BF16 => div_typed::<bf16>(buf, world_size),
        DType::I8 => div_typed::<i8>(buf, world_size),
        DType::U8 => div_typed::<u8>(buf, world_size),
        DType::I32 => div_typed::<i32>(buf, world_size),
        DType::I64 => div_typed::<i64>(buf, world_size),
    }
    Ok(())
}

mod halves;
#[cfg(test)]
mod tests;
