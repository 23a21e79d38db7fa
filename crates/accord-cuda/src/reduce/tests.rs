use super::host_reference::*;
use super::source::*;
use super::*;

#[test]
fn one_template_yields_every_kernel_once() {
    let source = reduce_module_source(&ReduceOpKind::ALL, &DType::ALL);
    for dtype in DType::ALL {
        for op in ReduceOpKind::ALL {
            let name = reduce_kernel_name(op, dtype);
            let signature = format!("{name}({}* dst", dtype.c_type());
            assert_eq!(source.matches(&signature).count(), 1, "{signature}");
        }
    }
    assert_eq!(source.matches("extern \"C\" __global__").count(), 25);
    assert!(source.contains("#define ACCORD_WITH_HALF 1"));
    assert!(source.contains("#include <cuda_fp16.h>") && source.contains("#include <cuda_bf16.h>"));
    assert!(!source.contains("{T}") && !source.contains("{NAME}") && !source.contains("{{"));
    assert!(source.contains("__launch_bounds__(256)"));
}

#[test]
fn half_headers_only_when_half_types_are_asked_for() {
    let source = reduce_module_source(&[ReduceOpKind::Sum], &[DType::F32, DType::I64]);
    assert!(source.starts_with("#define ACCORD_WITH_HALF 0\n"));
    assert_eq!(source.matches("extern \"C\"").count(), 2);
    assert_eq!(reduce_kernel_name(ReduceOpKind::Avg, DType::BF16), "accord_reduce_avg_bf16");
}

#[test]
fn grid_is_one_vector_per_thread_capped_per_sm() {
    assert_eq!(reduce_grid_blocks(1, 4, 132), 1);
    assert_eq!(reduce_grid_blocks(0, 4, 132), 1);
    // 4 f32 per vector, 256 threads: 1024 elements per block.
    assert_eq!(reduce_grid_blocks(1024, 4, 132), 1);
    assert_eq!(reduce_grid_blocks(1025, 4, 132), 2);
    assert_eq!(reduce_grid_blocks(u64::MAX / 2, 2, 132), 132 * REDUCE_BLOCKS_PER_SM);
    assert_eq!(reduce_grid_blocks(1 << 30, 8, 0), REDUCE_BLOCKS_PER_SM);
}

#[test]
fn f16_conversion_matches_ieee() {
    assert_eq!(f32_to_f16_bits(1.0), 0x3c00);
    assert_eq!(f32_to_f16_bits(-2.0), 0xc000);
    assert_eq!(f32_to_f16_bits(65504.0), 0x7bff);
    assert_eq!(f32_to_f16_bits(65520.0), 0x7c00); // rounds up to infinity
    assert_eq!(f32_to_f16_bits(f32::powi(2.0, -24)), 0x0001);
    assert_eq!(f32_to_f16_bits(f32::powi(2.0, -25)), 0x0000); // tie to even
    assert_eq!(f32_to_f16_bits(0.1), 0x2e66);
    assert_eq!(f32_to_f16_bits(1.0 + f32::powi(2.0, -11)), 0x3c00); // tie to even, down
    assert_eq!(f32_to_f16_bits(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3c02); // tie to even, up
    assert_eq!(f32_to_f16_bits(f32::INFINITY), 0x7c00);
    assert!(f16_bits_to_f32(f32_to_f16_bits(f32::NAN)).is_nan());
    for bits in 0..=u16::MAX {
        let value = f16_bits_to_f32(bits);
        if !value.is_nan() {
            assert_eq!(f32_to_f16_bits(value), bits, "f16 bits {bits:#06x}");
        }
    }
}

#[test]
fn bf16_conversion_rounds_to_nearest_even() {
    assert_eq!(f32_to_bf16_bits(1.0), 0x3f80);
    assert_eq!(bf16_bits_to_f32(0x3f80), 1.0);
    assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80); // tie, even stays
    assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82); // tie, odd rounds up
    assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8001)), 0x3f81);
    assert!(bf16_bits_to_f32(f32_to_bf16_bits(f32::NAN)).is_nan());
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn reference_ops_on_f32_and_integers() {
    let a: Vec<u8> = [1.0f32, -3.0, f32::NAN, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let b: Vec<u8> = [2.0f32, 5.0, 1.0, f32::NAN].iter().flat_map(|v| v.to_le_bytes()).collect();
    let sum = f32s(&reduce_bytes(DType::F32, ReduceOp::Sum, &a, &b));
    assert_eq!(&sum[..2], &[3.0, 2.0]);
    let min = f32s(&reduce_bytes(DType::F32, ReduceOp::Min, &a, &b));
    assert_eq!(min[0..2], [1.0, -3.0]);
    assert!(min[2].is_nan() && min[3].is_nan(), "NaN propagates from either side");
    let avg = f32s(&reduce_bytes(DType::F32, ReduceOp::Avg { divisor: 2 }, &a, &b));
    assert_eq!(&avg[..2], &[1.5, 1.0]);

    let ia: Vec<u8> = [i32::MAX, -7].iter().flat_map(|v| v.to_le_bytes()).collect();
    let ib: Vec<u8> = [1i32, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    let wrapped = reduce_bytes(DType::I32, ReduceOp::Sum, &ia, &ib);
    assert_eq!(i32::from_le_bytes(wrapped[..4].try_into().unwrap()), i32::MIN);
    let avg = reduce_bytes(DType::I32, ReduceOp::Avg { divisor: 2 }, &ia, &ib);
    assert_eq!(i32::from_le_bytes(avg[4..].try_into().unwrap()), -2); // truncates toward zero
    let la: Vec<u8> = i64::MAX.to_le_bytes().to_vec();
    let prod = reduce_bytes(DType::I64, ReduceOp::Prod, &la, &2i64.to_le_bytes());
    assert_eq!(i64::from_le_bytes(prod[..].try_into().unwrap()), -2);
}

#[test]
fn reference_half_ops_round_once_from_f32() {
    let a = f32_to_f16_bits(1.0).to_le_bytes();
    let b = f32_to_f16_bits(f32::powi(2.0, -11)).to_le_bytes();
    let sum = reduce_bytes(DType::F16, ReduceOp::Sum, &a, &b);
    assert_eq!(u16::from_le_bytes([sum[0], sum[1]]), 0x3c00);
    let max = reduce_bytes(
        DType::BF16,
        ReduceOp::Max,
        &f32_to_bf16_bits(-1.0).to_le_bytes(),
        &f32_to_bf16_bits(2.5).to_le_bytes(),
    );
    assert_eq!(bf16_bits_to_f32(u16::from_le_bytes([max[0], max[1]])), 2.5);
}

#[test]
fn sample_inputs_are_deterministic_and_sized() {
    for dtype in DType::ALL {
        let a = sample_input(dtype, 1000, 7);
        assert_eq!(a.len(), 1000 * dtype.size_bytes());
        assert_eq!(a, sample_input(dtype, 1000, 7));
        assert_ne!(a, sample_input(dtype, 1000, 8));
    }
}

#[test]
fn op_parameters_and_overlap_rules() {
    assert_eq!(ReduceOp::Avg { divisor: 8 }.divisor(), 8);
    assert_eq!(ReduceOp::Max.divisor(), 1);
    assert_eq!(ReduceOp::Avg { divisor: 8 }.kind(), ReduceOpKind::Avg);
    let p = DevicePtr(0x1000);
    assert!(!overlaps_partially(p, p, 64), "identical is in place, allowed");
    assert!(overlaps_partially(p, p.offset(4), 64));
    assert!(!overlaps_partially(p, p.offset(64), 64));
    assert!(!overlaps_partially(p.offset(64), p, 64));
}
