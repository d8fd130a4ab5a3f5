//! The generated skeleton of bpf/kheap.bpf.c and conversions from its types
//! (generated from `bpf/kheap.h`) into the pure model types.

#[allow(clippy::all, dead_code, unused_imports, non_camel_case_types)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/kheap.skel.rs"));
}

pub use skel::types;
pub use skel::{KheapSkel, KheapSkelBuilder, OpenKheapSkel};

use crate::model::HIST_BUCKETS;

// The kheap.h types are plain old data: every bit pattern is valid.
unsafe impl plain::Plain for types::alloc_stats {}
unsafe impl plain::Plain for types::site_key {}
unsafe impl plain::Plain for types::stack_key {}
unsafe impl plain::Plain for types::cache_name {}

impl From<types::alloc_stats> for crate::model::AllocStats {
    fn from(s: types::alloc_stats) -> Self {
        crate::model::AllocStats {
            count: s.count,
            bytes_req: s.bytes_req,
            bytes_alloc: s.bytes_alloc,
            hist: crate::model::Hist(s.hist),
        }
    }
}

impl std::ops::AddAssign for types::alloc_stats {
    fn add_assign(&mut self, o: Self) {
        self.count += o.count;
        self.bytes_req += o.bytes_req;
        self.bytes_alloc += o.bytes_alloc;
        for (a, b) in self.hist.iter_mut().zip(o.hist) {
            *a += b;
        }
    }
}
unsafe impl plain::Plain for types::cache_frees {}
unsafe impl plain::Plain for types::proc_info {}
unsafe impl plain::Plain for types::counters {}
unsafe impl plain::Plain for types::live_obj {}
unsafe impl plain::Plain for types::site_unseen {}

// The histogram width is defined once, in bpf/kheap.h: three counters, then
// the buckets.
const _: () = assert!(std::mem::size_of::<types::alloc_stats>() == (3 + HIST_BUCKETS) * 8);

/// Reads a value of a generated type from map bytes (which may be padded).
pub fn from_bytes<T: plain::Plain + Default + Copy>(bytes: &[u8]) -> T {
    let mut v = T::default();
    plain::copy_from_bytes(&mut v, bytes).expect("map value shorter than its BTF type");
    v
}

impl std::ops::AddAssign for types::counters {
    fn add_assign(&mut self, o: Self) {
        self.frees += o.frees;
        self.frees_null += o.frees_null;
        self.frees_untracked += o.frees_untracked;
        self.stack_samples += o.stack_samples;
        self.lost_stack_other += o.lost_stack_other;
        self.map_full_sites += o.map_full_sites;
        self.map_full_stacks += o.map_full_stacks;
        self.map_full_procs += o.map_full_procs;
        self.map_full_caches += o.map_full_caches;
        self.alloc_failed += o.alloc_failed;
        self.reused_live += o.reused_live;
        self.map_full_live += o.map_full_live;
        self.map_busy += o.map_busy;
    }
}

impl std::ops::AddAssign for types::site_unseen {
    fn add_assign(&mut self, o: Self) {
        self.count += o.count;
        self.bytes_alloc += o.bytes_alloc;
    }
}

impl std::ops::AddAssign for types::cache_frees {
    fn add_assign(&mut self, o: Self) {
        self.frees += o.frees;
    }
}

/// A NUL-terminated C string from a fixed-size array.
pub fn c_str(chars: &[i8]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
