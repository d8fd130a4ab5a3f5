//! `kheap leaks`: what is still allocated, by whom, and for how long.
//! `crate::kernel::leaks` loads the BPF side and reads it; these are pure: `live`
//! (folding live objects, ages), `retention` (the report's retention fields
//! and summary), `render` (tables).

pub mod live;
pub mod render;
pub mod retention;
