//! Bootstrap store (WIP).
