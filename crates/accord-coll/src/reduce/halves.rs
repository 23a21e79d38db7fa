//! Reductions of bfloat16 and float16, computed in f32 and rounded once per element.
//!
//! Why not only `half`'s slice conversions: without F16C enabled when the crate is compiled
//! they fall back to a per-element routine with branches, and Accord's binaries are built for
//! baseline x86-64. A 64 MiB bfloat16 sum ran at 6.9 GB/s against f32's 36 GB/s on the same
//! core (`docs/results/2026-11-27-half-reductions.md`). So:
//! - bfloat16 widens and narrows by integer arithmetic and selects, one fused loop per op with
//!   no branch per element, which the compiler vectorises for any target; where the CPU has
//!   AVX2 (checked at run time) the same loop is compiled for it and runs about 3x faster;
//! - float16 uses the F16C conversion instructions where the CPU has them (with AVX2), and
//!   `half`'s conversions in stack blocks elsewhere.
//!
//! Every path gives `half`'s results bit for bit: round to nearest even, overflow to infinity,
//! subnormals kept, a NaN quiet (which operand's NaN payload a sum carries is the vector
//! unit's choice, as for f32). The tests compare each path against `half` on every value.

use half::f16;

use super::ReduceOp;

/// f32 elements widened per stack block on the portable float16 path.
const F16_BLOCK_ELEMS: usize = 256;

/// bfloat16 as the top half of an f32.
#[inline(always)]
fn bf16_widen(bits: u16) -> f32 {
    // A signalling NaN stays signalling here: every op below either quiets it (arithmetic)
    // or hands it to `bf16_narrow`, which quiets it, as `half` does on widening.
    f32::from_bits(u32::from(bits) << 16)
}

#[inline(always)]
fn bf16_narrow(value: f32) -> u16 {
    let x = value.to_bits();
    // Adding 0x7fff plus the kept part's lowest bit carries into it exactly when the dropped
    // half is above one half, or equal to it with an odd kept part (ties to even); a carry
    // out of the mantissa raises the exponent, up to infinity.
    let rounded = x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16;
    let quiet_nan = (x >> 16) | 0x0040;
    let is_nan = (x & 0x7fff_ffff) > 0x7f80_0000;
    (if is_nan { quiet_nan } else { rounded }) as u16
}

#[inline(always)]
fn zip_map(d: &mut [u16], s: &[u16], f: impl Fn(u16, u16) -> u16) {
    d.iter_mut().zip(s).for_each(|(a, b)| *a = f(*a, *b));
}

/// The scalar combine every path agrees with: `if b < a { b } else { a }` for min (so a
/// NaN in `b` keeps `a`), likewise for max.
#[inline(always)]
fn combine_f32(op: ReduceOp, a: f32, b: f32) -> f32 {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => a + b,
        ReduceOp::Prod => a * b,
        ReduceOp::Min => {
            if b < a {
                b
            } else {
                a
            }
        }
        ReduceOp::Max => {
            if b > a {
                b
            } else {
                a
            }
        }
    }
}

/// The bfloat16 loops, one per op so each vectorises without a branch inside.
#[inline(always)]
fn bf16_loops(op: ReduceOp, d: &mut [u16], s: &[u16]) {
    let via_f32 = |op: ReduceOp| move |a: u16, b: u16| bf16_narrow(combine_f32(op, bf16_widen(a), bf16_widen(b)));
    match op {
        ReduceOp::Sum | ReduceOp::Avg => zip_map(d, s, via_f32(ReduceOp::Sum)),
        ReduceOp::Prod => zip_map(d, s, via_f32(ReduceOp::Prod)),
        ReduceOp::Min => zip_map(d, s, via_f32(ReduceOp::Min)),
        ReduceOp::Max => zip_map(d, s, via_f32(ReduceOp::Max)),
    }
}

/// `d = d (op) s` over bfloat16 bits.
pub(super) fn combine_bf16(op: ReduceOp, d: &mut [u16], s: &[u16]) {
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx2() {
        x86::bf16_avx2(op, d, s);
        return;
    }
    bf16_loops(op, d, s);
}

/// `d = d (op) s` over float16.
pub(super) fn combine_f16(op: ReduceOp, d: &mut [f16], s: &[f16]) {
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx2_f16c() {
        x86::f16_f16c(op, d, s);
        return;
    }
    f16_blocks(op, d, s);
}

/// Float16 through `half`'s slice conversions, a stack block at a time.
fn f16_blocks(op: ReduceOp, d: &mut [f16], s: &[f16]) {
    use half::slice::HalfFloatSliceExt;
    let mut wd = [0f32; F16_BLOCK_ELEMS];
    let mut ws = [0f32; F16_BLOCK_ELEMS];
    for (dc, sc) in d.chunks_mut(F16_BLOCK_ELEMS).zip(s.chunks(F16_BLOCK_ELEMS)) {
        let k = dc.len();
        dc.convert_to_f32_slice(&mut wd[..k]);
        sc.convert_to_f32_slice(&mut ws[..k]);
        wd[..k].iter_mut().zip(&ws[..k]).for_each(|(a, b)| *a = combine_f32(op, *a, *b));
        dc.convert_from_f32_slice(&wd[..k]);
    }
}

/// The AVX2 and F16C paths, chosen at run time.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86 {
    use std::arch::x86_64::{
        __m128i, __m256, __m256i, _mm256_add_epi32, _mm256_add_ps, _mm256_and_si256, _mm256_blendv_epi8,
        _mm256_castps_si256, _mm256_castsi256_ps, _mm256_cmp_ps, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_loadu_si256,
        _mm256_max_ps, _mm256_min_ps, _mm256_mul_ps, _mm256_or_si256, _mm256_packus_epi32, _mm256_set1_epi32,
        _mm256_setzero_si256, _mm256_srli_epi32, _mm256_storeu_si256, _mm256_unpackhi_epi16, _mm256_unpacklo_epi16,
        _mm_loadu_si128, _mm_storeu_si128, _CMP_UNORD_Q,
    };

    use half::f16;

    use super::ReduceOp;

    pub(super) fn has_avx2() -> bool {
        std::arch::is_x86_feature_detected!("avx2")
    }

    pub(super) fn has_avx2_f16c() -> bool {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c")
    }

    pub(super) fn bf16_avx2(op: ReduceOp, d: &mut [u16], s: &[u16]) {
        assert!(has_avx2());
        // SAFETY: the CPU has AVX2 (checked above), the only requirement of the function.
        unsafe { bf16_avx2_unchecked(op, d, s) }
    }

    /// Sixteen elements at a time, the tail through the portable loops. Widening puts each
    /// element's bits in the top half of an f32 lane (interleaved below zeros); narrowing is
    /// `bf16_narrow` on eight lanes at once, and the two halves pack back in order (unpack and
    /// pack both work within 128-bit lanes). Why not the portable loops compiled for AVX2, as
    /// before: the compiler widened and narrowed element by element there, 24-27 GB/s on the
    /// 2-core machine against 36-42 now and float16's 62 (`accord-reduce-bench --ops
    /// sum,max,prod,min`, stop 46). NaNs are found with an unordered compare (one instruction).
    #[target_feature(enable = "avx2")]
    unsafe fn bf16_avx2_unchecked(op: ReduceOp, d: &mut [u16], s: &[u16]) {
        let n = d.len().min(s.len());
        let whole = n - n % 16;
        let zero = _mm256_setzero_si256();
        let combine = |a: __m256, b: __m256| match op {
            ReduceOp::Sum | ReduceOp::Avg => _mm256_add_ps(a, b),
            ReduceOp::Prod => _mm256_mul_ps(a, b),
            // min_ps(b, a) is `if b < a { b } else { a }`, NaNs included; max likewise.
            ReduceOp::Min => _mm256_min_ps(b, a),
            ReduceOp::Max => _mm256_max_ps(b, a),
        };
        for i in (0..whole).step_by(16) {
            // SAFETY: i + 16 <= n, both slices hold at least n elements of two bytes, and the
            // loads and stores are unaligned ones; `d` is exclusive, `s` is only read.
            unsafe {
                let dp = d.as_mut_ptr().add(i).cast::<__m256i>();
                let sp = s.as_ptr().add(i).cast::<__m256i>();
                let (dv, sv) = (_mm256_loadu_si256(dp), _mm256_loadu_si256(sp));
                let low = combine(
                    _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, dv)),
                    _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, sv)),
                );
                let high = combine(
                    _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, dv)),
                    _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, sv)),
                );
                _mm256_storeu_si256(dp, _mm256_packus_epi32(narrow8(low), narrow8(high)));
            }
        }
        super::bf16_loops(op, &mut d[whole..n], &s[whole..n]);
    }

    /// `bf16_narrow` of eight f32 lanes, each result in its lane's low 16 bits.
    #[target_feature(enable = "avx2")]
    fn narrow8(v: __m256) -> __m256i {
        let x = _mm256_castps_si256(v);
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
        let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)));
        let quiet_nan = _mm256_or_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(0x0040));
        let is_nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        _mm256_blendv_epi8(rounded, quiet_nan, is_nan)
    }

    pub(super) fn f16_f16c(op: ReduceOp, d: &mut [f16], s: &[f16]) {
        assert!(has_avx2_f16c());
        // SAFETY: the CPU has AVX2 and F16C (checked above), the function's only requirement.
        unsafe { f16_f16c_unchecked(op, d, s) }
    }

    /// Eight elements at a time through the F16C conversions; the tail through `half`.
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn f16_f16c_unchecked(op: ReduceOp, d: &mut [f16], s: &[f16]) {
        let n = d.len().min(s.len());
        let whole = n - n % 8;
        for i in (0..whole).step_by(8) {
            // SAFETY: i + 8 <= n, both slices hold at least n elements of two bytes, and the
            // loads and stores are unaligned ones; `d` is exclusive, `s` is only read.
            unsafe {
                let dp = d.as_mut_ptr().add(i).cast::<__m128i>();
                let sp = s.as_ptr().add(i).cast::<__m128i>();
                let a = _mm256_cvtph_ps(_mm_loadu_si128(dp));
                let b = _mm256_cvtph_ps(_mm_loadu_si128(sp));
                // min_ps(b, a) is `if b < a { b } else { a }`, NaNs included; max likewise.
                let r = match op {
                    ReduceOp::Sum | ReduceOp::Avg => _mm256_add_ps(a, b),
                    ReduceOp::Prod => _mm256_mul_ps(a, b),
                    ReduceOp::Min => _mm256_min_ps(b, a),
                    ReduceOp::Max => _mm256_max_ps(b, a),
                };
                // Rounding mode 0: to nearest even, whatever MXCSR says.
                _mm_storeu_si128(dp, _mm256_cvtps_ph::<0>(r));
            }
        }
        super::f16_blocks(op, &mut d[whole..n], &s[whole..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    fn same_or_both_nan(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    #[test]
    fn every_bfloat16_widens_as_half_does() {
        for bits in 0..=u16::MAX {
            let ours = bf16_widen(bits);
            let theirs = bf16::from_bits(bits).to_f32();
            assert!(ours.to_bits() == theirs.to_bits() || ours.is_nan() && theirs.is_nan(), "{bits:#06x}");
            // A NaN comes out of the round trip quiet, as `half` makes it on widening.
            assert_eq!(bf16_narrow(ours), bf16::from_f32(theirs).to_bits(), "{bits:#06x}");
        }
    }

    /// Every high half of an f32 with the low halves that decide rounding (ties, just below
    /// and above them, the extremes) and pseudo-random ones.
    #[test]
    fn bfloat16_narrowing_rounds_as_half_does() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let lows = [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff];
        for high in 0..=u32::from(u16::MAX) {
            for i in 0..lows.len() + 4 {
                let low = lows.get(i).copied().unwrap_or_else(|| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u32 & 0xffff
                });
                let v = f32::from_bits((high << 16) | low);
                assert_eq!(bf16_narrow(v), bf16::from_f32(v).to_bits(), "{:#010x}", v.to_bits());
            }
        }
    }

    /// Every 16-bit pattern against a partner (another pattern, and the specials), with a
    /// length that leaves a tail after any vector width.
    fn operands() -> (Vec<u16>, Vec<u16>) {
        let mut a: Vec<u16> = (0..=u16::MAX).collect();
        let mut b: Vec<u16> = a.iter().map(|v| v.rotate_left(5) ^ 0x1234).collect();
        for special in [0x0000u16, 0x8000, 0x0001, 0x7c00, 0xfc00, 0x7f80, 0xff80, 0x7e00, 0x7fc0, 0x3c00, 0x7bff] {
            a.extend((0..16u16).map(|k| k.wrapping_mul(0x1111)));
            b.extend(std::iter::repeat_n(special, 16));
        }
        a.push(0x3c00);
        b.push(0x4000);
        (a, b)
    }

    fn check(
        name: &str,
        op: ReduceOp,
        a: &[u16],
        b: &[u16],
        got: &[u16],
        widen: fn(u16) -> f32,
        narrow: fn(f32) -> u16,
    ) {
        for i in 0..a.len() {
            let want = widen(narrow(combine_f32(op, widen(a[i]), widen(b[i]))));
            assert!(
                same_or_both_nan(widen(got[i]), want),
                "{name} {op}: {:#06x} with {:#06x} gave {:#06x}",
                a[i],
                b[i],
                got[i]
            );
        }
    }

    fn half_bf16_widen(b: u16) -> f32 {
        bf16::from_bits(b).to_f32()
    }
    fn half_bf16_narrow(v: f32) -> u16 {
        bf16::from_f32(v).to_bits()
    }
    fn half_f16_widen(b: u16) -> f32 {
        f16::from_bits(b).to_f32()
    }
    fn half_f16_narrow(v: f32) -> u16 {
        f16::from_f32(v).to_bits()
    }

    #[test]
    fn every_path_combines_as_half_would() {
        let (a, b) = operands();
        let f16s = |v: &[u16]| v.iter().map(|&x| f16::from_bits(x)).collect::<Vec<_>>();
        let bits = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for op in ReduceOp::ALL {
            let mut d = a.clone();
            bf16_loops(op, &mut d, &b);
            check("bf16 portable", op, &a, &b, &d, half_bf16_widen, half_bf16_narrow);
            let mut d = a.clone();
            combine_bf16(op, &mut d, &b);
            check("bf16 chosen", op, &a, &b, &d, half_bf16_widen, half_bf16_narrow);
            let mut d = f16s(&a);
            f16_blocks(op, &mut d, &f16s(&b));
            check("f16 blocks", op, &a, &b, &bits(&d), half_f16_widen, half_f16_narrow);
            let mut d = f16s(&a);
            combine_f16(op, &mut d, &f16s(&b));
            check("f16 chosen", op, &a, &b, &bits(&d), half_f16_widen, half_f16_narrow);
        }
    }

    /// Says which paths the test above exercised on this machine.
    #[test]
    fn the_fast_paths_are_reported() {
        #[cfg(target_arch = "x86_64")]
        eprintln!("avx2: {}, avx2+f16c: {}", x86::has_avx2(), x86::has_avx2_f16c());
    }
}
