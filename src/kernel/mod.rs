//! The kernel layer: the only code that touches libbpf. Skeleton ownership,
//! hooks and the attach strategy, feature probing, typed map readers. Every
//! other module is pure and builds and tests without root or clang.

pub mod attach;
pub mod features;
pub mod kmem;
pub mod latency;
pub mod malloc;
pub mod malloc_skel;
pub mod maps;
pub mod skel;
pub mod storage;
