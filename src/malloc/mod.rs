//! `kheap malloc`: user-space allocations (malloc and its family) of traced
//! processes, by direct caller and by stack, with outstanding blocks.
//!
//! The command's own logic, pure: `report` and `render` (with `pprof`, the
//! profile of a report); `preload` (the library `-- CMD` runs with);
//! `unwind` (stacks through code without frame pointers, from sampled
//! stack copies) and `merge` (which stack a row is shown along). What the
//! kernel layer shares with it lives below the command: the allocator
//! functions and where to probe them (`crate::allocators`), what the
//! kernel side reads (`crate::model::malloc`), a process's mappings
//! (`crate::sys::procmaps`) and user symbols (`crate::symbolize::user`).
//! The kernel-facing part is `crate::kernel::malloc`; the command,
//! following the traced processes, `crate::cmd::malloc`.

pub mod merge;
pub mod pprof;
pub mod preload;
pub mod render;
pub mod report;
pub mod unwind;
