//! The root suites whose results depend on the kernel: its hooks and
//! tracepoint layouts, cache resolution, the page, vmalloc and percpu
//! sources, cgroups, uprobes, the attach and detach paths. CI runs this
//! binary on the host and in the qemu guests of every kernel it supports
//! (`.ci/run`, `scripts/vm-test --cargo-test`). One test binary, one module
//! a suite: a test is named `suite::test` (`record::kfree_...`), and
//! `cargo test --test kernel_dependent record::` runs one suite.
//!
//! Needs root; run with `--test-threads=1` (the tests share the kernel's
//! tracing state). See docs/testing.md.

#[path = "../common/mod.rs"]
mod common;

mod cache_names;
mod cgroup;
mod footprint;
mod leaks;
mod malloc;
mod record;
mod reliability;
mod slab;
mod sources;
mod timeline;
mod top;
