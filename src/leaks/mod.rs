//! `kheap leaks`: what is still allocated, by whom, and for how long.
//! `session` loads bpf/leaks.bpf.c and reads it; the rest is pure: `live`
//! (folding live objects, ages), `retention` (the report's retention fields
//! and summary), `render` (tables).

pub mod live;
pub mod render;
pub mod retention;
pub mod session;
