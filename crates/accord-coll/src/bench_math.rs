//! Bench math (WIP).
