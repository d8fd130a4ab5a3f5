//! kheap: who allocates kernel heap memory, in what sizes, how much slab
//! rounding wastes, and what is never freed.
//!
//! `kernel` is the only layer that touches libbpf (skeletons, attach
//! strategy, features, map readers); `target` starts and watches processes;
//! `cmd` holds one module per subcommand, `session` what the tracing ones
//! share. Everything else, `top`'s deltas, views and key handling included,
//! is pure and tested without root.

pub mod allocators;
pub mod arch;
pub mod cgroup;
pub mod cli;
pub mod clock;
pub mod cmd;
pub mod contract;
pub mod diff;
pub mod help;
pub mod input;
pub mod kernel;
pub mod latency;
mod layers;
pub mod leaks;
pub mod malloc;
pub mod model;
pub mod output;
pub mod record;
pub mod render;
pub mod report;
pub mod safe_path;
pub mod serve;
pub mod session;
pub mod signals;
pub mod slab;
pub mod symbolize;
pub mod sys;
pub mod target;
#[cfg(test)]
mod testing;
pub mod top;
pub mod tree;

/// The JSON contract's validator, shared with the root tests.
#[cfg(test)]
#[path = "../tests/common/schema.rs"]
pub(crate) mod schema_check;
