//! A host-built device table: every field, and every address followed to the memory it must
//! point into (host placement: device addresses are host addresses).
#![allow(unsafe_code)]

mod common;

use accord_device::layout::{DeviceTable, RingDevice, SignalOp, WindowEntry, LAYOUT_VERSION};
use accord_device::DeviceCommConfig;
use common::*;

/// Reads a `T` at a host address the table gave.
fn at<T: Copy>(addr: u64) -> T {
    assert_ne!(addr, 0);
    assert_eq!(addr % std::mem::align_of::<T>() as u64, 0, "misaligned address {addr:#x}");
    // Safety: host placement; the address comes from a live communicator's table, and the
    // test checks it against what the communicator says lives there.
    unsafe { std::ptr::read_volatile(addr as *const T) }
}

#[test]
fn a_host_built_table_points_every_field_at_the_right_memory() {
    let cfg =
        DeviceCommConfig { rings: 3, slot_count: 16, user_signals: 5, counters: 7, ..DeviceCommConfig::default() };
    on_ranks(2, Route::Memcpy, cfg, |rank, dc| {
        let empty: DeviceTable = dc.device_table().unwrap();
        assert_eq!(empty.window_count, 0);
        let w0 = dc.alloc_window(4096).unwrap();
        let w1 = dc.alloc_window(100).unwrap();
        let ptr = dc.device_table_ptr().unwrap();
        let t: DeviceTable = at(ptr);
        assert_eq!(t.layout_version, LAYOUT_VERSION);
        assert_eq!((t.rank, t.world), (rank as u32, 2));
        assert_eq!((t.ring_count, t.signal_count, t.counter_count, t.window_count), (3, 6, 7, 2));
        assert_eq!(t.readable_windows, 0, "host windows: no GPU thread reads them");
        assert_eq!(dc.device_table_ptr().unwrap(), ptr, "no new window: the same table");
        let host_copy = dc.device_table().unwrap();
        assert_eq!((host_copy.rings, host_copy.windows, host_copy.signals), (t.rings, t.windows, t.signals));

        // Rings: each entry is the ring's, its control words are the ones the API reads.
        for r in 0..3u64 {
            let ring: RingDevice = at(t.rings + r * std::mem::size_of::<RingDevice>() as u64);
            assert_eq!(ring.slot_count, 16);
            assert_eq!(ring.control, ring.slots + 16 * 64);
            assert_eq!(ring.cached_consumed, ring.reserved + 64);
            let p = dc.host_producer(r as usize).unwrap();
            p.push(&signal(1 - rank, SignalOp::Add, 1, 1)).unwrap();
            dc.wait_completed(r as usize, 1, WAIT).unwrap();
            assert_eq!(at::<u64>(ring.reserved), 1, "ring {r}: the producers' ticket counter");
            assert_eq!(at::<u64>(ring.control), 1, "ring {r}: consumed");
            assert_eq!(at::<u64>(ring.control + 64), 1, "ring {r}: completed");
            assert_eq!(at::<u64>(ring.control + 128), 0, "ring {r}: error");
            assert_eq!(at::<u64>(ring.slots), 1, "ring {r}: slot 0's seq");
        }

        // Windows: local bases are the windows, peer_bases all 0 (no direct stores yet).
        for (id, len) in [(w0, 4096u64), (w1, 100)] {
            let e: WindowEntry = at(t.windows + u64::from(id) * std::mem::size_of::<WindowEntry>() as u64);
            let (base, bytes, _) = dc.window_info(id).unwrap();
            assert_eq!((e.local_base, e.bytes), (base, len));
            assert_eq!(bytes, len);
            dc.write_window(id, 3, &[0x5a]).unwrap();
            assert_eq!(at::<u8>(e.local_base + 3), 0x5a, "window {id}'s base is its memory");
            for peer in 0..2 {
                assert_eq!(at::<u64>(e.peer_bases + peer * 8), 0);
            }
        }
        for peer in 0..2 {
            assert_eq!(at::<u64>(t.peer_signals + peer * 8), 0);
        }

        // Signals: slot [1][peer] holds the peer's three adds; bases and barrier epoch are 0.
        let other = 1 - rank as u64;
        dc.wait_signal(1, 3, WAIT).unwrap();
        assert_eq!(at::<u64>(t.signals + (2 + other) * 8), 3, "slot [1][{other}]");
        assert_eq!(at::<u64>(t.signals + (2 + rank as u64) * 8), 0);
        dc.reset_signal(1).unwrap();
        assert_eq!(at::<u64>(t.signal_bases + 8), 3, "reset records the sum as signal 1's base");
        assert_eq!(at::<u64>(t.barrier_epoch), 0);

        // Counters: the table's are the ones the proxy bumps.
        dc.communicator().barrier().unwrap();
        let p = dc.host_producer(0).unwrap();
        p.push(&with_counter(put(rank, w0, 0, w0, 8, 8), 6)).unwrap();
        dc.wait_completed(0, 2, WAIT).unwrap();
        assert_eq!(dc.counter(6).unwrap(), 1);
        assert_eq!(at::<u64>(t.counters + 6 * 8), 1);

        // A new window: a new table; the old one stays readable.
        dc.alloc_window(64).unwrap();
        let newer = dc.device_table_ptr().unwrap();
        assert_ne!(newer, ptr);
        assert_eq!(at::<DeviceTable>(newer).window_count, 3);
        assert_eq!(at::<DeviceTable>(ptr).window_count, 2);
    });
}
