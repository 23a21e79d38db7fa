//! READ's bounds on requests, in a file of their own: the reader's state, the owner's
//! assemblies of batched requests and their geometry check all use them, and none of those
//! may import the route's logic (the engine's shared state holds them).

/// Reads one engine may have outstanding at peers in other processes.
pub const READ_REQUESTS_IN_FLIGHT_MAX: usize = 4096;

/// Most pieces (pages x planes) one READ request carries; a larger batched read is split into
/// several requests. 65,536 pieces of 32 KiB are 2 GiB.
pub const READ_PIECES_PER_REQUEST_MAX: usize = 65_536;
