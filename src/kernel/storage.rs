//! Where a skeleton's BPF object lives. A libbpf-rs skeleton borrows its
//! object storage for its whole life, so the storage must outlive it: the
//! caller (a subcommand's run function) owns one `ObjectStorage` per
//! skeleton, on its stack, and the tracer borrows it. Nothing is leaked, and
//! the borrow checker proves that no skeleton outlives its object.

use std::mem::MaybeUninit;
use std::slice::IterMut;

use libbpf_rs::OpenObject;

/// Attach strategies try up to three mechanisms, each opening the object
/// afresh, and leaks may try each twice (with its object table, then
/// without); every attempt gets its own slot.
const SLOTS: usize = 6;

pub struct ObjectStorage {
    slots: [MaybeUninit<OpenObject>; SLOTS],
}

impl Default for ObjectStorage {
    fn default() -> Self {
        ObjectStorage {
            slots: std::array::from_fn(|_| MaybeUninit::uninit()),
        }
    }
}

impl ObjectStorage {
    /// One slot per attempt to open the object.
    pub(crate) fn slots(&mut self) -> IterMut<'_, MaybeUninit<OpenObject>> {
        self.slots.iter_mut()
    }
}
