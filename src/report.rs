//! From merged map contents to a symbolized report: per site, per stack, per
//! cache and per process. Pure: no kernel access, tested with fixtures.
//!
//! The rows and the report they make are `rows`; `build` makes them from a
//! snapshot; `cgroups` folds the per-cgroup rows and names the cgroups;
//! `retention` is what `leaks` adds to them (ages, rates, the summary) and
//! `timeline` its outstanding memory over time;
//! `fixtures` are the snapshots and symbols other modules' tests build
//! reports from.

pub mod budget;
pub mod build;
pub mod cgroups;
pub mod delta;
#[cfg(test)]
pub mod fixtures;
pub mod identity;
pub mod meminfo;
pub mod overhead;
pub mod processes;
pub mod retention;
pub mod rows;
pub mod timeline;
pub mod top_n;
pub mod trigger;

pub use build::{
    build, incompleteness, labelled_sites, scale_to, site_labels, BuildOptions, SiteLabels,
};
pub use identity::ProcessIdentity;
pub use processes::StackProcess;
pub use retention::{LeakSummary, ProgramMisses, Retention};
pub use rows::{
    Accounting, CacheRow, CgroupRow, Lost, OutstandingAccounting, ProcRow, Report, RunInfo,
    Sampling, SiteRow, SourceTotals, StackRow, Totals,
};
