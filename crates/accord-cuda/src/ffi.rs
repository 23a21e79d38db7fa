//! Everything that calls C: the CUDA driver, NVRTC, the dynamic loader, and
//! host memory pages that the driver owns. The only modules with `unsafe`;
//! every block carries a `// Safety:` line.
#![allow(unsafe_code)]

pub(crate) mod batch_copy;
pub mod driver;
pub mod host_memory;
pub mod launch;
pub mod nvrtc;
