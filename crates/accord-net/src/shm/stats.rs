//! The shared-memory datapath's counters, apart from the datapath itself: the `Datapath` trait
//! reports them (`local_channel_stats`), and the datapath implements the trait, so keeping them
//! in `shm.rs` made `datapath.rs` and `shm.rs` import each other.

/// Counters of one [`super::ShmDatapath`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShmStats {
    /// Our rings that peers attached.
    pub rings_attached_tx: u64,
    /// Peers' rings we attached.
    pub rings_attached_rx: u64,
    /// Our offers refused or never answered (those peers use UDP).
    pub attach_refused: u64,
    /// Rings we could not create (directory missing, out of space).
    pub attach_failed_local: u64,
    /// Rings abandoned: corrupt, closed by the other side, or consumer gone.
    pub rings_abandoned: u64,
    /// Datagrams sent through rings.
    pub tx_datagrams: u64,
    /// Payload bytes sent through rings.
    pub tx_bytes: u64,
    /// Datagrams received from rings.
    pub rx_datagrams: u64,
    /// Payload bytes received from rings.
    pub rx_bytes: u64,
    /// Sends cut short by a full ring.
    pub tx_ring_full: u64,
    /// Datagrams dropped because their ring stayed full past [`super::RING_STALL_DROP`].
    pub tx_dropped_stalled: u64,
    /// Doorbells sent to sleeping consumers.
    pub doorbells_sent: u64,
    /// Control datagrams ignored as malformed or unexpected.
    pub control_ignored: u64,
    /// Datagrams received from rings and lent in place (placed from the ring, one copy fewer).
    pub rx_lent: u64,
}
