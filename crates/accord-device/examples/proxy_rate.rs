//! Descriptor rate of one proxy thread on the CPU: one rank (world 1), a host producer
//! writing small puts to this rank's own window through the memcpy route, as fast as the ring
//! takes them. Prints descriptors per second. Usage:
//! `cargo run --release -p accord-device --example proxy_rate -- [count] [bytes]`
//! (defaults 200000 descriptors of 8 bytes). A CPU-only indication: a GPU producer, the copy
//! engine and the network each change it.

use accord_coll::engine::EngineTransport;
use accord_coll::{CollConfig, Communicator};
use accord_device::layout::{Descriptor, Op};
use accord_device::{DeviceComm, DeviceCommConfig};
use accord_engine::Engine;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let count: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(200_000);
    let bytes: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(8);
    let engine = Arc::new(Engine::builder().ignore_env().build()?);
    let address = engine.address();
    let transport = EngineTransport::new(engine, 0, vec![address])?;
    let comm = Communicator::new(transport, CollConfig::default())?;
    let mut dc = DeviceComm::new(comm, DeviceCommConfig { slot_count: 4096, ..DeviceCommConfig::default() })?;
    let window = dc.alloc_window(1 << 20)?;
    let producer = dc.host_producer(0)?;
    let span = (1u64 << 20) - bytes;
    let start = Instant::now();
    for i in 0..count {
        let d = Descriptor {
            op: Op::Put as u8,
            window,
            src_window: window,
            dst_offset: (i * 64) % span,
            src_offset: (i * 64 + 32) % span,
            bytes,
            ..Descriptor::default()
        };
        producer.push(&d)?;
    }
    dc.wait_completed(0, count, Duration::from_secs(120))?;
    let secs = start.elapsed().as_secs_f64();
    let stats = dc.stats();
    println!(
        "{count} puts of {bytes} B through one proxy (memcpy route): {:.0} descriptors/s ({:.2} us each), ring full {} times, {} errors",
        count as f64 / secs,
        secs * 1e6 / count as f64,
        stats.ring_full_events,
        stats.descriptor_errors
    );
    // The same writes submitted straight to the engine on this thread, for the proxy's overhead.
    let engine = dc.communicator().transport().engine().clone();
    let src = engine.alloc(1 << 20)?;
    let dst = engine.alloc(1 << 20)?;
    let (handle, desc) = (src.handle(), dst.descriptor());
    let start = Instant::now();
    for i in 0..count {
        let op = accord_engine::WriteOp {
            src: &handle,
            src_offset: (i * 64 + 32) % span,
            dst: &desc,
            dst_offset: (i * 64) % span,
            len: bytes,
            imm: None,
        };
        engine.write(&op)?.wait()?;
    }
    let direct = start.elapsed().as_secs_f64();
    println!(
        "the same {count} writes submitted to the engine directly: {:.0} writes/s ({:.2} us each)",
        count as f64 / direct,
        direct * 1e6 / count as f64
    );
    dc.close()?;
    Ok(())
}
