use super::*;

#[test]
fn known_codes_map_to_names_and_actionable_hints() {
    let error = driver_error("cuMemAlloc_v2", 2);
    let text = error.to_string();
    assert!(text.contains("cuMemAlloc_v2"), "{text}");
    assert!(text.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{text}");
    assert!(text.contains("free buffers"), "{text}");
    assert_eq!(driver_error_name(100), "CUDA_ERROR_NO_DEVICE");
    assert!(driver_error_hint(705).contains("enable_peer_access"));
    assert!(driver_error_hint(205).contains("exporter"));
}

#[test]
fn unknown_codes_still_format() {
    assert_eq!(driver_error_name(12345), "CUresult 12345");
    assert!(driver_error_hint(12345).contains("documentation"));
}

#[test]
fn names_match_cudarc_enum_for_every_mapped_code() {
    use cudarc::driver::sys::CUresult;
    let pairs = [
        (CUresult::CUDA_ERROR_INVALID_VALUE, 1),
        (CUresult::CUDA_ERROR_OUT_OF_MEMORY, 2),
        (CUresult::CUDA_ERROR_NO_DEVICE, 100),
        (CUresult::CUDA_ERROR_STUB_LIBRARY, 34),
        (CUresult::CUDA_ERROR_DEVICE_UNAVAILABLE, 46),
        (CUresult::CUDA_ERROR_INVALID_DEVICE, 101),
        (CUresult::CUDA_ERROR_INVALID_IMAGE, 200),
        (CUresult::CUDA_ERROR_INVALID_CONTEXT, 201),
        (CUresult::CUDA_ERROR_MAP_FAILED, 205),
        (CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU, 209),
        (CUresult::CUDA_ERROR_INVALID_PTX, 218),
        (CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION, 222),
        (CUresult::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, 705),
        (CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, 713),
        (CUresult::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, 803),
        (CUresult::CUDA_ERROR_UNKNOWN, 999),
        (CUresult::CUDA_ERROR_NOT_INITIALIZED, 3),
        (CUresult::CUDA_ERROR_DEINITIALIZED, 4),
        (CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, 217),
        (CUresult::CUDA_ERROR_INVALID_HANDLE, 400),
        (CUresult::CUDA_ERROR_NOT_READY, 600),
        (CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, 700),
        (CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, 704),
        (CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, 712),
        (CUresult::CUDA_ERROR_LAUNCH_FAILED, 719),
    ];
    for (variant, code) in pairs {
        assert_eq!(variant as i32, code);
        assert_eq!(format!("{variant:?}"), driver_error_name(code));
    }
}

#[test]
fn not_available_says_what_to_install() {
    let error = CudaError::NotAvailable { reason: "no CUDA driver".into() };
    assert_eq!(error.to_string(), "CUDA is not available: no CUDA driver");
}
