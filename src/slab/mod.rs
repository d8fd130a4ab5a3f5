//! `kheap slab`: which slab caches hold the memory behind the `Slab:` line
//! of /proc/meminfo, how fast they grow, what they waste, and which code is
//! responsible.
//!
//! The static part reads `/proc/slabinfo` (and SLUB's `/sys/kernel/slab`);
//! the traced part arrives as plain [`TracedRun`] data and is joined to the
//! same rows by cache name. Nothing here depends on libbpf.

pub mod hints;
pub mod render;
pub mod report;
pub mod snapshot;
pub mod traced;
pub mod watch;

pub use hints::{CacheSeries, Hint, HintKind};
pub use report::{build_report, ReportInput, SlabReport, SortKey};
pub use snapshot::{read_static, StaticCache, StaticSnapshot};
pub use traced::{TracedCache, TracedRun, TracedSite};
