use super::*;

fn bytes<T: Pod>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

#[test]
fn f32_ops() {
    let a = [1.0f32, -2.0, 3.5, 0.0];
    let b = [2.0f32, 5.0, -1.0, 0.0];
    for (op, want) in [
        (ReduceOp::Sum, [3.0f32, 3.0, 2.5, 0.0]),
        (ReduceOp::Prod, [2.0, -10.0, -3.5, 0.0]),
        (ReduceOp::Min, [1.0, -2.0, -1.0, 0.0]),
        (ReduceOp::Max, [2.0, 5.0, 3.5, 0.0]),
    ] {
        let mut d = bytes(&a);
        reduce_into(&mut d, &bytes(&b), DType::F32, op).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&d), &want, "{op}");
    }
}

#[test]
fn integers_wrap_and_avg_truncates() {
    let mut d = bytes(&[i8::MAX, -7, 7]);
    reduce_into(&mut d, &bytes(&[1i8, 0, 0]), DType::I8, ReduceOp::Sum).unwrap();
    assert_eq!(bytemuck::cast_slice::<u8, i8>(&d), &[i8::MIN, -7, 7]);
    finish_avg(&mut d, DType::I8, ReduceOp::Avg, 2).unwrap();
    assert_eq!(bytemuck::cast_slice::<u8, i8>(&d), &[-64, -3, 3]);
    let mut u = vec![200u8, 3];
    finish_avg(&mut u, DType::U8, ReduceOp::Avg, 300).unwrap();
    assert_eq!(u, vec![0, 0]);
}

#[test]
fn halves_widen_and_narrow() {
    let n = 515; // not a multiple of any vector width
    let a: Vec<half::f16> = (0..n).map(|i| half::f16::from_f32((i % 17) as f32)).collect();
    let b: Vec<half::f16> = (0..n).map(|i| half::f16::from_f32((i % 5) as f32 * 0.5)).collect();
    let mut d = bytes(&a);
    reduce_into(&mut d, &bytes(&b), DType::F16, ReduceOp::Sum).unwrap();
    let got: &[half::f16] = bytemuck::cast_slice(&d);
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.to_f32(), (i % 17) as f32 + (i % 5) as f32 * 0.5);
    }
    let a: Vec<half::bf16> = vec![half::bf16::from_f32(3.0); 4];
    let mut d = bytes(&a);
    reduce_into(&mut d, &bytes(&a), DType::BF16, ReduceOp::Max).unwrap();
    finish_avg(&mut d, DType::BF16, ReduceOp::Avg, 2).unwrap();
    assert!(bytemuck::cast_slice::<u8, half::bf16>(&d).iter().all(|x| x.to_f32() == 1.5));
}

#[test]
fn unaligned_slices_match_aligned() {
    let a: Vec<f64> = (0..33).map(|i| i as f64 * 0.25).collect();
    let b: Vec<f64> = (0..33).map(|i| 100.0 - i as f64).collect();
    let mut aligned = bytes(&a);
    reduce_into(&mut aligned, &bytes(&b), DType::F64, ReduceOp::Prod).unwrap();
    let mut backing = vec![0u8; aligned.len() + 1];
    backing[1..].copy_from_slice(&bytes(&a));
    let mut src_backing = vec![0u8; aligned.len() + 3];
    src_backing[3..].copy_from_slice(&bytes(&b));
    reduce_into(&mut backing[1..], &src_backing[3..], DType::F64, ReduceOp::Prod).unwrap();
    assert_eq!(&backing[1..], &aligned[..]);
}

#[test]
fn size_errors_are_values() {
    let mut d = vec![0u8; 8];
    assert_eq!(
        reduce_into(&mut d, &[0u8; 4], DType::F32, ReduceOp::Sum),
        Err(ReduceError::LengthMismatch { dst_bytes: 8, src_bytes: 4 })
    );
    let mut d = vec![0u8; 6];
    assert!(matches!(
        reduce_into(&mut d, &[0u8; 6], DType::F32, ReduceOp::Sum),
        Err(ReduceError::NotWholeElements { .. })
    ));
    assert!("median".parse::<ReduceOp>().is_err());
    assert_eq!("AVG".parse::<ReduceOp>().unwrap(), ReduceOp::Avg);
}
