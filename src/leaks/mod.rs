//! `kheap leaks`: what is still allocated, by whom, and for how long.
//! `live` is pure (folding and ages); `session` loads bpf/leaks.bpf.c.

pub mod live;
pub mod render;
pub mod retention;
pub mod session;
