//! The root suites that check the same reports from the outside and do not
//! depend on the kernel, so CI runs them on the host only (the qemu guests
//! skip this binary, `.ci/run`): the exports read back by their real
//! consumers (pprof, flame, generate, serve, alerts), argument handling, the
//! status line and JSON shapes (cli, progress, schema), the ELF and DWARF
//! side of malloc (malloc_langs, malloc_unwind), and what the guests cannot
//! offer (shared_machine needs useradd, top_layout tmux at fixed sizes).
//! One test binary, one module a suite: a test is named `suite::test`, and
//! `cargo test --test host_only serve::` runs one suite.
//!
//! Most need root; run with `--test-threads=1`. See docs/testing.md.

#[path = "../common/mod.rs"]
mod common;

mod alerts;
mod cli;
mod flame;
mod generate;
mod malloc_langs;
mod malloc_unwind;
mod pprof;
mod progress;
mod schema;
mod serve;
mod shared_machine;
mod top_layout;
