//! Receiver state of a connection: which packet numbers arrived (the source of SACKs), which
//! were refused (reported back as rejections until the sender has seen them), and the progress
//! of operations whose completion the receiver must notice (writes with an immediate, sends).

mod inbound;
#[cfg(test)]
mod tests;
mod window;

pub use inbound::{InboundOps, InboundProgress, InboundStart, REFUSED_OPS_REMEMBERED};
pub use window::{PsnClass, ReceiveWindow};
