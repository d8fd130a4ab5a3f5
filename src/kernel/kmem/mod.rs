//! The one tracer on the kmem tracepoints: bpf/kheap.bpf.c loaded and
//! attached for record, top, slab (allocations by site, stack, cache and
//! process) and leaks (the same, plus every live object by address). The
//! difference between them is configuration, fixed before load. Links are
//! RAII: dropping the tracer (on any exit path, errors included) detaches
//! everything.
//!
//! The tracer's pieces: its settings (`config`), the tracer itself
//! (`tracer`), loading and attaching (`start`), what the object is set up
//! with from /proc/kallsyms (`labels`), one read of the maps (`read`), the
//! live objects of `leaks` (`live`), map keys as the model names them
//! (`keys`) and the programs' run-time statistics (`stats`).

mod config;
mod keys;
mod labels;
mod live;
mod read;
mod start;
mod stats;
mod tracer;

pub use crate::kernel::attach::AttachMode;
pub use config::{Config, LiveConfig};
pub use keys::cache_id;
pub use stats::enable_run_time_stats;
pub use tracer::Tracer;
