use super::*;

fn sample() -> IpcHandle {
    let mut raw = [0u8; IPC_RAW_HANDLE_BYTES];
    for (i, b) in raw.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(37) ^ 0xA5;
    }
    IpcHandle::from_parts(raw, 4 << 20, 4242)
}

#[test]
fn bytes_round_trip() {
    let handle = sample();
    let bytes = handle.to_bytes();
    assert_eq!(bytes.len(), IPC_HANDLE_BYTES);
    assert_eq!(bytes[0], IPC_HANDLE_VERSION);
    assert_eq!(IpcHandle::from_bytes(&bytes).unwrap(), handle);
}

#[test]
fn hex_and_serde_round_trip() {
    let handle = sample();
    let hex = handle.to_hex();
    assert_eq!(hex.len(), IPC_HANDLE_BYTES * 2);
    assert_eq!(IpcHandle::from_hex(&hex).unwrap(), handle);
    assert_eq!(IpcHandle::from_hex(&hex.to_uppercase()).unwrap(), handle);
    let json = serde_json::to_string(&handle).unwrap();
    assert_eq!(json, format!("\"{hex}\""));
    let back: IpcHandle = serde_json::from_str(&json).unwrap();
    assert_eq!(back, handle);
    assert_eq!(back.len_bytes(), 4 << 20);
    assert_eq!(back.exporter_pid(), 4242);
}

#[test]
fn malformed_text_is_an_error_not_a_panic() {
    let hex = sample().to_hex();
    assert_eq!(
        IpcHandle::from_hex(&hex[1..]),
        Err(IpcHandleParseError::Length { expected: IPC_HANDLE_BYTES * 2, got: IPC_HANDLE_BYTES * 2 - 1 })
    );
    let mut bad = hex.clone().into_bytes();
    bad[10] = b'g';
    assert_eq!(IpcHandle::from_hex(std::str::from_utf8(&bad).unwrap()), Err(IpcHandleParseError::NotHex { index: 10 }));
    let mut wrong_version = sample().to_bytes();
    wrong_version[0] = 9;
    assert_eq!(
        IpcHandle::from_bytes(&wrong_version),
        Err(IpcHandleParseError::Version { expected: IPC_HANDLE_VERSION, got: 9 })
    );
    assert!(serde_json::from_str::<IpcHandle>("\"zz\"").is_err());
}

#[test]
fn debug_does_not_dump_the_secret_bytes() {
    let text = format!("{:?}", sample());
    assert!(text.contains("4242") && !text.contains("raw"), "{text}");
}
