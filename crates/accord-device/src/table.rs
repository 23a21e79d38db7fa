//! The device table a kernel receives: one block (device memory on a GPU, host memory
//! otherwise) holding the [`DeviceTable`] and the arrays it points to, each section on a
//! 64-byte boundary:
//!
//! ```text
//! DeviceTable | RingDevice[ring_count] | WindowEntry[window_count] | u64[window_count][world] peer_bases | u64[world] peer_signals
//! ```
//!
//! `peer_bases` and `peer_signals` hold the addresses at which this rank's GPU reaches each
//! peer's windows and signal slots (the stream lanes' mappings: same-host peers through CUDA
//! IPC, peers in this process directly), 0 where it cannot; `put_direct` stores through them.

use crate::error::DeviceError;
use crate::layout::{DeviceTable, RingDevice, WindowEntry, LAYOUT_VERSION};
use crate::memory::{bytes_of, bytes_of_slice, Block, Placement, Want};

/// What goes into a table.
#[derive(Clone, Debug)]
pub(crate) struct TableInputs {
    pub(crate) rank: u32,
    pub(crate) world: u32,
    pub(crate) signal_count: u32,
    pub(crate) counter_count: u32,
    pub(crate) rings: Vec<RingDevice>,
    /// Each window's (device address, bytes) on this rank.
    pub(crate) windows: Vec<(u64, u64)>,
    /// `DeviceTable::readable_windows`: bit `w` for a window this GPU's threads may read.
    pub(crate) readable_windows: u32,
    /// Per window, each peer's window as this rank's GPU reaches it (0: not by address).
    pub(crate) peer_bases: Vec<Vec<u64>>,
    /// Each peer's incoming signal slots as this rank's GPU reaches them (0: not by address).
    pub(crate) peer_signals: Vec<u64>,
    pub(crate) signals: u64,
    pub(crate) signal_bases: u64,
    pub(crate) counters: u64,
    pub(crate) barrier_epoch: u64,
}

/// One built table and its memory.
pub(crate) struct TableMemory {
    block: Block,
    /// The table as written (host copy).
    pub(crate) table: DeviceTable,
    /// Windows it describes (to know when to rebuild).
    pub(crate) window_count: usize,
}

fn align64(n: usize) -> usize {
    n.div_ceil(64) * 64
}

impl TableMemory {
    pub(crate) fn build(placement: &Placement, inputs: &TableInputs) -> Result<TableMemory, DeviceError> {
        let world = inputs.world as usize;
        let nw = inputs.windows.len();
        let rings_at = align64(std::mem::size_of::<DeviceTable>());
        let windows_at = align64(rings_at + inputs.rings.len() * std::mem::size_of::<RingDevice>());
        let peer_bases_at = align64(windows_at + nw * std::mem::size_of::<WindowEntry>());
        let peer_signals_at = align64(peer_bases_at + nw * world * 8);
        let total = peer_signals_at + world * 8;
        let mut block = Block::new(placement, Want::DeviceOnly, total)?;
        let base = block.device_addr();
        let entries: Vec<WindowEntry> = inputs
            .windows
            .iter()
            .enumerate()
            .map(|(i, &(local_base, bytes))| WindowEntry {
                local_base,
                bytes,
                peer_bases: base + (peer_bases_at + i * world * 8) as u64,
            })
            .collect();
        let table = DeviceTable {
            layout_version: LAYOUT_VERSION,
            rank: inputs.rank,
            world: inputs.world,
            ring_count: inputs.rings.len() as u32,
            signal_count: inputs.signal_count,
            counter_count: inputs.counter_count,
            window_count: nw as u32,
            readable_windows: inputs.readable_windows,
            rings: base + rings_at as u64,
            signals: inputs.signals,
            signal_bases: inputs.signal_bases,
            counters: inputs.counters,
            windows: base + windows_at as u64,
            peer_signals: base + peer_signals_at as u64,
            barrier_epoch: inputs.barrier_epoch,
        };
        block.write(0, &bytes_of(&table))?;
        block.write(rings_at, &bytes_of_slice(&inputs.rings))?;
        block.write(windows_at, &bytes_of_slice(&entries))?;
        for (w, bases) in inputs.peer_bases.iter().enumerate().take(nw) {
            let row: Vec<u64> = (0..world).map(|p| bases.get(p).copied().unwrap_or(0)).collect();
            block.write(peer_bases_at + w * world * 8, &bytes_of_slice(&row))?;
        }
        let signals: Vec<u64> = (0..world).map(|p| inputs.peer_signals.get(p).copied().unwrap_or(0)).collect();
        block.write(peer_signals_at, &bytes_of_slice(&signals))?;
        Ok(TableMemory { block, table, window_count: nw })
    }

    /// The table's device address.
    pub(crate) fn device_addr(&self) -> u64 {
        self.block.device_addr()
    }
}
