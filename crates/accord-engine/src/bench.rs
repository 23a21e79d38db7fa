//! `accord bench p2p` as a library function.
