//! `kheap serve`'s pure parts: cumulative series with bounded cardinality,
//! the metric families, their exposition formats, and the pprof profiles.

pub mod cgroups;
pub mod exposition;
pub mod families;
pub mod profile;
pub mod series;
