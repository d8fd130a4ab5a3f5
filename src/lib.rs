//! kheap: who allocates kernel heap memory, in what sizes, how much slab
//! rounding wastes, and what is never freed.
//!
//! Modules that touch the kernel: `bpf` (skeleton), `session` (load/attach),
//! `maps` (typed readers), `features` (probing), `target` (processes), and
//! `malloc::{bpf, session}` for `kheap malloc`, `leaks::session` for `kheap
//! leaks`, the subcommands' loops in `cmd`. Everything else, `top`'s deltas,
//! views and key handling included, is pure and tested without root.

pub mod attach;
pub mod bpf;
pub mod cli;
pub mod cmd;
pub mod diff;
pub mod features;
pub mod latency;
pub mod leaks;
pub mod malloc;
pub mod maps;
pub mod model;
pub mod render;
pub mod report;
pub mod session;
pub mod slab;
pub mod symbolize;
pub mod target;
pub mod top;
