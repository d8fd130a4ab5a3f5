//! `kheap record`'s own logic: its text view (`view`). The command itself
//! is `crate::cmd::record`.

pub mod view;
