//! `kheap malloc`: user-space allocations (malloc and its family) of traced
//! processes, by direct caller and by stack, with outstanding blocks.
//!
//! Kernel-facing parts live in `crate::kernel::malloc`. Pure here:
//! `probes` (what to probe where), `procmaps`, `usersyms` (addresses to
//! symbols via recorded mappings), `model` (what the kernel side reads),
//! `report`, `render`; `preload` (the library `-- CMD` runs with); `unwind`
//! (stacks through code without frame pointers, from sampled stack copies)
//! and `merge` (which stack a row is shown along). `libraries` finds the
//! allocator files to probe; `scanner` follows the traced processes while
//! the command runs (it holds the kernel session).

pub mod libraries;
pub mod merge;
pub mod model;
pub mod preload;
pub mod probes;
pub mod procmaps;
pub mod render;
pub mod report;
pub mod scanner;
pub mod unwind;
pub mod usersyms;
