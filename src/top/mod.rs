//! `kheap top`: per-interval views of who allocates right now. Pure parts:
//! deltas between map reads, rows and rates, batch output, key handling.
//! The loop that reads the kernel lives in `cmd::top`.

pub mod batch;
pub mod columns;
pub mod delta;
pub mod overhead;
pub mod tui;
pub mod view;
