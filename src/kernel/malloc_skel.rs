//! The generated skeleton of `bpf/malloc.bpf.c` and conversions from its
//! types (generated from `bpf/malloc.h`) into the pure model types.

skeleton!("malloc");

pub use skel::types;
pub use skel::{MallocSkel, MallocSkelBuilder, OpenMallocSkel};

use crate::model::malloc::Key;
use crate::model::{AllocStats, Hist, HIST_BUCKETS};

impl From<&types::malloc_key> for Key {
    fn from(k: &types::malloc_key) -> Self {
        Key {
            mm: k.mm,
            tgid: k.tgid,
            func: k.func,
            caller: k.caller,
            stack_id: k.stack_id,
        }
    }
}

plain_types!(
    types::malloc_key,
    types::malloc_stats,
    types::live_key,
    types::live_alloc,
    types::vma_key,
    types::vma_info,
    types::malloc_counters,
    types::file_id,
    types::exec_path,
    types::user_stack_sample,
    types::user_stack_counters,
);

// The histogram width is defined once, in bpf/size_bucket.h.
const _: () = assert!(std::mem::size_of::<types::malloc_stats>() == (2 + HIST_BUCKETS) * 8);

/// User-space allocators hand out what was asked for, as far as the caller
/// can tell: requested and allocated bytes are the same.
impl From<types::malloc_stats> for AllocStats {
    fn from(s: types::malloc_stats) -> Self {
        AllocStats {
            count: s.count,
            bytes_req: s.bytes,
            bytes_alloc: s.bytes,
            hist: Hist(s.hist),
        }
    }
}

impl_sum!(types::malloc_stats { count, bytes; hist });
impl_sum!(types::malloc_counters {
    frees,
    frees_null,
    frees_untracked,
    failed,
    lost_stacks,
    map_full_sites,
    map_full_live,
    map_full_vmas,
    vma_lookup_failed,
    nested,
    no_thread_state,
    allocs,
    sites_created,
});
impl_sum!(types::user_stack_counters {
    sampled,
    dropped,
    copy_failed,
});
