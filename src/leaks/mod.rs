//! `kheap leaks`: what is still allocated, by whom, and for how long.
//! `crate::kernel::leaks` loads the BPF side and reads it; these are pure:
//! `retention` (the report's retention fields and summary), `render`
//! (tables). The live objects and their folding are model types
//! (`crate::model::live`).

pub mod chart;
pub mod meminfo;
// At its old path until every branch imports it from the model.
pub mod render;
pub mod retention;
pub mod timeline;
pub mod trigger;
