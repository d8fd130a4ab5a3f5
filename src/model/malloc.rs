//! What the malloc tracer reads from the kernel, before symbolization: the
//! aggregation key, event counters, and the allocator's own code ranges.
//! Pure types, filled by `crate::kernel::malloc`.

use std::collections::HashMap;

use crate::model::AllocStats;
use crate::symbolize::user::UserFrame;

/// The kernel's aggregation key (see `struct malloc_key`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    /// The address space (its mm_struct's address): what addresses are
    /// relative to.
    pub mm: u64,
    pub tgid: u32,
    pub func: u32,
    pub caller: u64,
    pub stack_id: i64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Events {
    pub frees: u64,
    pub frees_null: u64,
    pub frees_untracked: u64,
    pub failed: u64,
    pub lost_stacks: u64,
    pub map_full_sites: u64,
    pub map_full_live: u64,
    pub map_full_vmas: u64,
    pub vma_lookup_failed: u64,
    /// Calls made by the allocator itself while serving another (seen as
    /// such in the kernel), not counted twice.
    pub nested: u64,
    pub no_thread_state: u64,
    /// Calls counted whose return address could not be read at the stack
    /// pointer: their rows are named `[caller unreadable]`.
    pub caller_unreadable: u64,
}

/// One sampled allocator call, as the BPF side sent it.
pub struct Sample<'a> {
    pub key: Key,
    pub size: u64,
    /// Stack pointer at the allocator's entry: the return address is there.
    pub sp: u64,
    pub bp: u64,
    /// Where `stack` was copied from (at or below `sp`).
    pub start: u64,
    pub stack: &'a [u8],
}

/// One distinct unwound stack of a row, with the sampled calls that had it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnwoundStack {
    /// Return addresses, innermost (the direct caller) first.
    pub frames: Vec<u64>,
    pub samples: u64,
    /// Bytes asked for by those calls.
    pub bytes: u64,
}

/// What became of the sampled copies of user stacks (bpf/user_stack.bpf.h
/// and `crate::malloc::unwind`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindEvents {
    /// Copies sent by the kernel.
    pub sampled: u64,
    /// Not sent: the ring buffer was full.
    pub dropped: u64,
    /// Not sent: the stack could not be read.
    pub copy_failed: u64,
    /// Received, not unwound: the process was gone and its mappings
    /// unknown.
    pub no_mappings: u64,
}

/// A probed function's code: (kernel device, inode) of its file and its
/// file offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocatorCode {
    pub file: (u32, u64),
    pub start: u64,
    pub end: u64,
}

impl AllocatorCode {
    pub fn contains(&self, f: &UserFrame) -> bool {
        f.file == Some(self.file) && self.start <= f.file_offset && f.file_offset < self.end
    }
}

/// Everything read from the kernel at the end of a run, before
/// symbolization.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub sites: HashMap<Key, AllocStats>,
    /// Blocks not freed by the end, per key: (count, bytes). Present only
    /// with --outstanding.
    pub live: Option<HashMap<Key, (u64, u64)>>,
    /// User stacks by id, innermost first, as walked from the probe: frame 0
    /// is the allocator function itself.
    pub stacks: HashMap<i64, Vec<u64>>,
    pub events: Events,
    /// Stacks unwound from sampled copies, per key.
    pub unwound: HashMap<Key, Vec<UnwoundStack>>,
    pub unwind: UnwindEvents,
}
