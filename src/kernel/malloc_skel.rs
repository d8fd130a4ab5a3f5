//! The generated skeleton of `bpf/malloc.bpf.c` and conversions from its
//! types (generated from `bpf/malloc.h`) into the pure model types.

#[allow(clippy::all, dead_code, unused_imports, non_camel_case_types)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/malloc.skel.rs"));
}

pub use skel::types;
pub use skel::{MallocSkel, MallocSkelBuilder, OpenMallocSkel};

use crate::model::{AllocStats, Hist, HIST_BUCKETS};

// The generated types are plain old data: every bit pattern is valid.
unsafe impl plain::Plain for types::malloc_key {}
unsafe impl plain::Plain for types::malloc_stats {}
unsafe impl plain::Plain for types::live_key {}
unsafe impl plain::Plain for types::live_alloc {}
unsafe impl plain::Plain for types::vma_key {}
unsafe impl plain::Plain for types::vma_info {}
unsafe impl plain::Plain for types::malloc_counters {}
unsafe impl plain::Plain for types::file_id {}
unsafe impl plain::Plain for types::exec_path {}

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

impl std::ops::AddAssign for types::malloc_stats {
    fn add_assign(&mut self, o: Self) {
        self.count += o.count;
        self.bytes += o.bytes;
        for (a, b) in self.hist.iter_mut().zip(o.hist) {
            *a += b;
        }
    }
}

impl std::ops::AddAssign for types::malloc_counters {
    fn add_assign(&mut self, o: Self) {
        self.frees += o.frees;
        self.frees_null += o.frees_null;
        self.frees_untracked += o.frees_untracked;
        self.failed += o.failed;
        self.lost_stacks += o.lost_stacks;
        self.map_full_sites += o.map_full_sites;
        self.map_full_live += o.map_full_live;
        self.map_full_vmas += o.map_full_vmas;
        self.vma_lookup_failed += o.vma_lookup_failed;
        self.nested += o.nested;
        self.no_thread_state += o.no_thread_state;
    }
}
