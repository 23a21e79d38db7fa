//! The IPC child: opens the parent's handle, verifies the parent's pattern,
//! overwrites the first half with 0x5A, and exits 0 (1 on any failure,
//! printing the failed step).

use std::process::ExitCode;

use accord_cuda::{copy_peer_async, DeviceBuffer, Gpu, IpcHandle, IpcMapping, Stream};

use crate::check_kit::{first_mismatch, pattern, step};
use crate::IPC_CHILD_GPU_ENV;

/// Entry point of the child mode.
pub fn run(handle_hex: &str) -> ExitCode {
    match child(handle_hex) {
        Ok(detail) => {
            println!("{detail}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("ipc child failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn child(handle_hex: &str) -> Result<String, String> {
    let handle = IpcHandle::from_hex(handle_hex).map_err(|e| format!("parse handle: {e}"))?;
    let ordinal: usize = std::env::var(IPC_CHILD_GPU_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let gpu = step("open gpu", Gpu::open(ordinal))?;
    let mapping = step("cuIpcOpenMemHandle", IpcMapping::open(&gpu, &handle))?;
    let len = mapping.len_bytes();
    let stream = step("stream", Stream::new(&gpu))?;
    let mut local = step("alloc local", DeviceBuffer::alloc(&gpu, len))?;
    step("copy mapping -> local", copy_peer_async(local.ptr(), &gpu, mapping.ptr(), &gpu, len, &stream))?;
    let mut back = vec![0u8; len];
    step("D2H", local.copy_to_host(0, &mut back, &stream))?;
    if let Some(i) = first_mismatch(&back, &pattern(len, 17)) {
        return Err(format!("mapped memory differs from the parent's pattern at byte {i}"));
    }
    step("memset local", local.memset_async(0, len / 2, 0x5A, &stream))?;
    step("copy local -> mapping", copy_peer_async(mapping.ptr(), &gpu, local.ptr(), &gpu, len / 2, &stream))?;
    step("sync", stream.synchronize())?;
    Ok(format!("child pid {} ok", std::process::id()))
}
