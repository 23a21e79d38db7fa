//! Sender state of a connection: packets in flight (by packet number, and per path in send
//! order for loss detection) and the operations they carry.

mod deadlines;
mod ops;
#[cfg(test)]
mod tests;
mod window;

pub use deadlines::PathDeadlines;
pub use ops::{OpCompletion, OpError, OutboundOp, OutboundOps, PacketPlan, SubmitError};
pub use window::{SendWindow, SentPacket};
