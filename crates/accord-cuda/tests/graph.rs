//! CUDA graph capture and the public launch, through the public API. Each test prints
//! `skipped: <reason>` and passes where there is no driver, GPU or NVRTC.

use accord_cuda::kernels::Module;
use accord_cuda::{launch_u64_args, require_gpu, CudaError, DeviceBuffer, Gpu, Graph, LaunchConfig, Stream};

const BUMP: &str = "extern \"C\" __global__ void accord_test_bump(unsigned long long* word, unsigned long long by) \
                    { atomicAdd(word, by); }";

fn read_word(buffer: &DeviceBuffer, stream: &Stream) -> u64 {
    let mut bytes = [0u8; 8];
    buffer.copy_to_host(0, &mut bytes, stream).expect("read back");
    u64::from_le_bytes(bytes)
}

/// A captured launch runs once per replay and not during the capture.
#[test]
fn a_captured_kernel_runs_once_per_replay() {
    require_gpu!(1, nvrtc);
    let gpu = Gpu::open(0).unwrap();
    let stream = Stream::new(&gpu).unwrap();
    let kernel = Module::compile_and_load(&gpu, BUMP, "bump.cu").unwrap().kernel("accord_test_bump").unwrap();
    let mut word = DeviceBuffer::alloc(&gpu, 8).unwrap();
    word.memset_async(0, 8, 0, &stream).unwrap();
    stream.synchronize().unwrap();
    let graph = Graph::capture(&stream, |s| {
        // Safety: accord_test_bump takes (u64*, u64); the buffer holds the one word it touches
        // and outlives every replay (synchronised below).
        unsafe { launch_u64_args(&kernel, LaunchConfig::linear(1, 1), s, &[word.ptr().0, 3]) }
    })
    .unwrap();
    stream.synchronize().unwrap();
    assert_eq!(read_word(&word, &stream), 0, "nothing runs while capturing");
    for _ in 0..5 {
        graph.launch(&stream).unwrap();
    }
    stream.synchronize().unwrap();
    assert_eq!(read_word(&word, &stream), 15);
}

/// A failing record ends the capture: the error comes back and the stream works again.
#[test]
fn a_failed_record_ends_the_capture() {
    require_gpu!(1, nvrtc);
    let gpu = Gpu::open(0).unwrap();
    let stream = Stream::new(&gpu).unwrap();
    let kernel = Module::compile_and_load(&gpu, BUMP, "bump.cu").unwrap().kernel("accord_test_bump").unwrap();
    let word = DeviceBuffer::alloc(&gpu, 8).unwrap();
    let failed = Graph::capture(&stream, |s| {
        // Safety: refused before the driver sees it (a zero grid).
        unsafe { launch_u64_args(&kernel, LaunchConfig::linear(0, 1), s, &[word.ptr().0, 1]) }
    });
    assert!(matches!(failed, Err(CudaError::InvalidArgument { .. })), "{failed:?}");
    // Safety: as in the test above.
    unsafe { launch_u64_args(&kernel, LaunchConfig::linear(1, 1), &stream, &[word.ptr().0, 1]) }.unwrap();
    stream.synchronize().unwrap();
}
