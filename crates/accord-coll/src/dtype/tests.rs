use super::*;

#[test]
fn sizes_codes_and_names_round_trip() {
    for d in DType::ALL {
        assert_eq!(DType::from_code(d.code()), Some(d));
        assert_eq!(d.name().parse::<DType>().unwrap(), d);
        assert!(d.size_bytes() >= 1);
    }
    assert_eq!(DType::from_code(99), None);
    assert!("complex".parse::<DType>().is_err());
    assert_eq!(<half::bf16 as Element>::DTYPE, DType::BF16);
}

#[test]
fn count_of_rejects_partial_elements() {
    assert_eq!(DType::F32.count_of(12).unwrap(), 3);
    assert!(DType::F64.count_of(12).is_err());
    assert_eq!(DType::U8.count_of(0).unwrap(), 0);
}
