//! `kheap top`: per-interval views of who allocates right now. Pure parts:
//! rows and rates, batch output, key handling (the deltas between map reads
//! and kheap's own cost, shared with `serve`, are `report::delta` and
//! `report::overhead`).
//! The loop that reads the kernel lives in `cmd::top`.

pub mod batch;
pub mod columns;
pub mod tui;
pub mod view;
