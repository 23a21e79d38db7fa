//! Reference values for `--check`: every input element is a small integer, so every dtype
//! holds it exactly and every reduction of a few ranks stays exact (no rounding to forgive).

use accord_coll::{DType, ReduceOp};
use half::{bf16, f16};

/// Input element `index` of `rank`: 1..=6, exact in every dtype.
pub fn input(rank: usize, index: usize) -> f64 {
    ((index % 3 + 1) * (rank % 2 + 1)) as f64
}

/// What a reduction of element `index` over `ranks` ranks gives.
pub fn reduced(op: ReduceOp, ranks: usize, index: usize, dtype: DType) -> f64 {
    let values = (0..ranks).map(|r| input(r, index));
    match op {
        ReduceOp::Sum => values.sum(),
        ReduceOp::Prod => values.product(),
        ReduceOp::Min => values.fold(f64::INFINITY, f64::min),
        ReduceOp::Max => values.fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Avg => {
            let sum: f64 = values.sum();
            if dtype.is_float() {
                sum / ranks as f64
            } else {
                (sum / ranks as f64).trunc()
            }
        }
    }
}

/// `value` as one element of `dtype`, little-endian bytes (integers wrap like the reduction).
pub fn encode(dtype: DType, value: f64, out: &mut Vec<u8>) {
    match dtype {
        DType::F32 => out.extend_from_slice(&(value as f32).to_le_bytes()),
        DType::F64 => out.extend_from_slice(&value.to_le_bytes()),
        DType::F16 => out.extend_from_slice(&f16::from_f64(value).to_le_bytes()),
        DType::BF16 => out.extend_from_slice(&bf16::from_f64(value).to_le_bytes()),
        DType::I8 => out.push((value as i64) as i8 as u8),
        DType::U8 => out.push((value as i64) as u8),
        DType::I32 => out.extend_from_slice(&((value as i64) as i32).to_le_bytes()),
        DType::I64 => out.extend_from_slice(&(value as i64).to_le_bytes()),
    }
}

/// The element at `bytes` (exactly `dtype.size_bytes()` long) as f64.
pub fn decode(dtype: DType, bytes: &[u8]) -> f64 {
    let b = |n: usize| -> [u8; 8] {
        let mut a = [0u8; 8];
        a[..n].copy_from_slice(&bytes[..n]);
        a
    };
    match dtype {
        DType::F32 => f32::from_le_bytes(b(4)[..4].try_into().expect("4")) as f64,
        DType::F64 => f64::from_le_bytes(b(8)),
        DType::F16 => f16::from_le_bytes(b(2)[..2].try_into().expect("2")).to_f64(),
        DType::BF16 => bf16::from_le_bytes(b(2)[..2].try_into().expect("2")).to_f64(),
        DType::I8 => bytes[0] as i8 as f64,
        DType::U8 => bytes[0] as f64,
        DType::I32 => i32::from_le_bytes(b(4)[..4].try_into().expect("4")) as f64,
        DType::I64 => i64::from_le_bytes(b(8)) as f64,
    }
}

/// Expected `value` as the dtype would store it (so wrapping integers compare equal).
pub fn stored(dtype: DType, value: f64) -> f64 {
    let mut v = Vec::with_capacity(8);
    encode(dtype, value, &mut v);
    decode(dtype, &v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_exactly_in_every_dtype() {
        for dtype in DType::ALL {
            for v in [0.0, 1.0, 6.0, 36.0] {
                assert_eq!(stored(dtype, v), v, "{dtype:?}");
            }
        }
    }

    #[test]
    fn references_are_exact() {
        assert_eq!(reduced(ReduceOp::Sum, 4, 0, DType::F32), 1.0 + 2.0 + 1.0 + 2.0);
        assert_eq!(reduced(ReduceOp::Max, 4, 2, DType::I32), 6.0);
        assert_eq!(reduced(ReduceOp::Avg, 3, 0, DType::I32), 1.0); // (1+2+1)/3 truncated
    }
}
