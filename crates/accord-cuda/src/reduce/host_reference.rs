//! CPU versions of the reduction kernels, bit-for-bit the same arithmetic
//! (f16/bf16 computed in f32 and rounded to nearest even), to verify GPU
//! results, plus the half-precision conversions they need.

use super::{DType, ReduceOp, ReduceOpKind};

/// Rounds an `f32` to the nearest `f16` (ties to even); returns its bits.
pub fn f32_to_f16_bits(value: f32) -> u16 {
    let x = value.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let mant = x & 0x7f_ffff;
    if exp == 0xff {
        let nan_bits = if mant != 0 { 0x200 | (mant >> 13) as u16 } else { 0 };
        return sign | 0x7c00 | nan_bits;
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = mant | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = m >> shift;
        let rem = m & ((1 << shift) - 1);
        let halfway = 1 << (shift - 1);
        let rounded = if rem > halfway || (rem == halfway && half & 1 == 1) { half + 1 } else { half };
        return sign | rounded as u16;
    }
    let half = ((e as u32) << 10) | (mant >> 13);
    let rem = mant & 0x1fff;
    let rounded = if rem > 0x1000 || (rem == 0x1000 && half & 1 == 1) { half + 1 } else { half };
    sign | rounded as u16
}

/// The `f32` value of `f16` bits (exact).
pub fn f16_bits_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits & 0x8000) << 16;
    let exp = u32::from((bits >> 10) & 0x1f);
    let mant = u32::from(bits & 0x3ff);
    if exp == 0 {
        let magnitude = mant as f32 * f32::powi(2.0, -24);
        return if sign != 0 { -magnitude } else { magnitude };
    }
    if exp == 0x1f {
        return f32::from_bits(sign | 0x7f80_0000 | (mant << 13));
    }
    f32::from_bits(sign | ((exp + 112) << 23) | (mant << 13))
}

/// Rounds an `f32` to the nearest `bf16` (ties to even); returns its bits.
pub fn f32_to_bf16_bits(value: f32) -> u16 {
    let x = value.to_bits();
    if value.is_nan() {
        return ((x >> 16) | 0x40) as u16;
    }
    let rounding = 0x7fff + ((x >> 16) & 1);
    (x.wrapping_add(rounding) >> 16) as u16
}

/// The `f32` value of `bf16` bits (exact).
pub fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Decode and encode functions of one 16-bit float format.
type HalfConversions = (fn(u16) -> f32, fn(f32) -> u16);

fn apply_f32(op: ReduceOp, a: f32, b: f32) -> f32 {
    match op.kind() {
        ReduceOpKind::Sum => a + b,
        ReduceOpKind::Prod => a * b,
        ReduceOpKind::Min => {
            if a.is_nan() || a < b {
                a
            } else {
                b
            }
        }
        ReduceOpKind::Max => {
            if a.is_nan() || a > b {
                a
            } else {
                b
            }
        }
        ReduceOpKind::Avg => (a + b) / op.divisor() as f32,
    }
}

fn apply_i64(op: ReduceOp, a: i64, b: i64, wrap: fn(i64) -> i64) -> i64 {
    match op.kind() {
        ReduceOpKind::Sum => wrap(a.wrapping_add(b)),
        ReduceOpKind::Prod => wrap(a.wrapping_mul(b)),
        ReduceOpKind::Min => a.min(b),
        ReduceOpKind::Max => a.max(b),
        ReduceOpKind::Avg => wrap(a.wrapping_add(b)) / i64::from(op.divisor()),
    }
}

/// `a op b` element-wise over little-endian byte images of `dtype` elements.
/// Lengths must match and be a multiple of the element size.
pub fn reduce_bytes(dtype: DType, op: ReduceOp, a: &[u8], b: &[u8]) -> Vec<u8> {
    assert_eq!(a.len(), b.len(), "reference inputs must have equal lengths");
    let size = dtype.size_bytes();
    assert_eq!(a.len() % size, 0, "reference input is not a whole number of elements");
    let mut out = Vec::with_capacity(a.len());
    for (x, y) in a.chunks_exact(size).zip(b.chunks_exact(size)) {
        match dtype {
            DType::F32 => {
                let r =
                    apply_f32(op, f32::from_le_bytes(x.try_into().unwrap()), f32::from_le_bytes(y.try_into().unwrap()));
                out.extend_from_slice(&r.to_le_bytes());
            }
            DType::F16 | DType::BF16 => {
                let (to_f32, from_f32): HalfConversions = if dtype == DType::F16 {
                    (f16_bits_to_f32, f32_to_f16_bits)
                } else {
                    (bf16_bits_to_f32, f32_to_bf16_bits)
                };
                let xa = to_f32(u16::from_le_bytes(x.try_into().unwrap()));
                let yb = to_f32(u16::from_le_bytes(y.try_into().unwrap()));
                out.extend_from_slice(&from_f32(apply_f32(op, xa, yb)).to_le_bytes());
            }
            DType::I32 => {
                let wrap32: fn(i64) -> i64 = |v| v as i32 as i64;
                let xa = i32::from_le_bytes(x.try_into().unwrap()) as i64;
                let yb = i32::from_le_bytes(y.try_into().unwrap()) as i64;
                out.extend_from_slice(&(apply_i64(op, xa, yb, wrap32) as i32).to_le_bytes());
            }
            DType::I64 => {
                let xa = i64::from_le_bytes(x.try_into().unwrap());
                let yb = i64::from_le_bytes(y.try_into().unwrap());
                out.extend_from_slice(&apply_i64(op, xa, yb, |v| v).to_le_bytes());
            }
        }
    }
    out
}

/// Deterministic test input: `count` elements of `dtype` from `seed`, kept
/// small so sums and products stay exact-ish and never overflow halves.
pub fn sample_input(dtype: DType, count: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut out = Vec::with_capacity(count * dtype.size_bytes());
    for _ in 0..count {
        let r = next();
        // Values in [-8, 8) in steps of 1/16.
        let small = ((r % 256) as i64 - 128) as f32 / 16.0;
        match dtype {
            DType::F32 => out.extend_from_slice(&small.to_le_bytes()),
            DType::F16 => out.extend_from_slice(&f32_to_f16_bits(small).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&f32_to_bf16_bits(small).to_le_bytes()),
            DType::I32 => out.extend_from_slice(&((r % 2001) as i32 - 1000).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&((r % 2_000_001) as i64 - 1_000_000).to_le_bytes()),
        }
    }
    out
}
