//! A device communicator placed on a GPU: rings in mapped host memory, producer words, signal
//! slots and the table in device memory. Skips (passes, saying so) where no GPU is visible;
//! the kernels that drive it are the device harness's (crates/accord-device/kernels).

mod common;

use accord_cuda::{DeviceBuffer, Gpu};
use accord_device::{DeviceCommConfig, DeviceError, Placement};
use accord_engine::MemoryKind;
use common::*;

#[test]
fn a_gpu_placed_communicator_builds_its_table_in_device_memory() {
    if accord_cuda::probe().device_count == 0 {
        eprintln!("skipped: no GPU visible");
        return;
    }
    let gpu = Gpu::open(0).expect("GPU 0");
    let cfg = DeviceCommConfig { placement: Placement::Gpu(gpu.clone()), ..DeviceCommConfig::default() };
    // Allocated outside the ranks, so they outlive every communicator's close.
    let buffers: Vec<DeviceBuffer> = (0..2).map(|_| DeviceBuffer::alloc(&gpu, 1 << 20).unwrap()).collect();
    on_ranks(2, Route::Memcpy, cfg, |rank, dc| {
        let buffer = &buffers[rank];
        // Safety: the buffer outlives the communicator (dropped after on_ranks closed it).
        #[allow(unsafe_code)]
        let id =
            unsafe { dc.register_window(buffer.ptr().0 as *mut u8, 1 << 20, MemoryKind::CudaDevice { ordinal: 0 }) }
                .unwrap();
        assert_eq!(id, 0);
        let ptr = dc.device_table_ptr().unwrap();
        assert_ne!(ptr, 0);
        let t = dc.device_table().unwrap();
        assert_eq!((t.rank, t.world, t.window_count), (rank as u32, 2, 1));
        assert!(t.rings != 0 && t.signals != 0 && t.counters != 0 && t.barrier_epoch != 0);
        assert!(matches!(dc.host_producer(0), Err(DeviceError::NotHostPlacement { ring: 0 })));
        assert_eq!(dc.read_signal(0).unwrap(), 0, "signal slots read back from device memory");
    });
}
