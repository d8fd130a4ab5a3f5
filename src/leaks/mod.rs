//! `kheap leaks`: what is still allocated, by whom, and for how long.
//! The kernel side is the kmem tracer's live-object mode
//! (`crate::kernel::kmem`); these are pure: `render` (tables) and `chart`
//! (outstanding memory over time, with the kernel's own meminfo lines
//! beside them). The live objects and their folding are model types
//! (`crate::model::live`); the report's retention fields and summary, and
//! the timeline's data, are report types (`crate::report::retention`,
//! `crate::report::timeline`).

pub mod chart;
pub mod render;
