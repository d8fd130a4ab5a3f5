//! `kheap leaks`: what is still allocated, by whom, and for how long.
//! The kernel side is the kmem tracer's live-object mode
//! (`crate::kernel::kmem`); these are pure: `retention` (the report's
//! retention fields and summary), `render` (tables), `timeline` and
//! `chart` (outstanding memory over time, with the kernel's own meminfo
//! lines from `crate::report::meminfo` beside them). The live objects and
//! their folding are model types (`crate::model::live`).

pub mod chart;
pub mod render;
pub mod retention;
pub mod timeline;
