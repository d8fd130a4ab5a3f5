//! `kheap serve`'s pure parts: cumulative series with bounded cardinality,
//! the metric families, and their exposition formats.

pub mod exposition;
pub mod families;
pub mod series;
