//! The generated skeleton of bpf/kheap.bpf.c and conversions from its types
//! (generated from `bpf/kheap.h`) into the pure model types.

skeleton!("kheap");

pub use skel::types;
pub use skel::{KheapSkel, KheapSkelBuilder, OpenKheapSkel};

use crate::model::HIST_BUCKETS;

/// The kmem object built without its kfunc (build.rs): for kernels that
/// expose no BTF of their own, where libbpf cannot resolve the kfunc's
/// extern and would refuse the whole object.
static KHEAP_WITHOUT_KFUNCS: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/no-kfuncs/kheap.bpf.o"));

/// The object bytes the skeleton opens (build.rs points it here): the one
/// with the kfunc where the kernel has its own BTF, else the one without.
pub fn kheap_object(with_kfuncs: &'static [u8]) -> &'static [u8] {
    if crate::sys::kernel_has_own_btf() {
        with_kfuncs
    } else {
        KHEAP_WITHOUT_KFUNCS
    }
}

plain_types!(
    types::alloc_stats,
    types::site_key,
    types::stack_key,
    types::cache_name,
    types::cache_frees,
    types::proc_info,
    types::cgroup_key,
    types::counters,
    types::live_obj,
    types::site_unseen,
    types::backing_range,
);

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

impl_sum!(types::alloc_stats { count, bytes_req, bytes_alloc; hist });
impl_sum!(types::cache_frees { frees });
impl_sum!(types::site_unseen { count, bytes_alloc });
impl_sum!(types::counters {
    frees,
    frees_null,
    frees_untracked,
    stack_samples,
    lost_stack_other,
    map_full_sites,
    map_full_stacks,
    map_full_procs,
    map_full_cgroups,
    map_full_caches,
    alloc_failed,
    reused_live,
    map_full_live,
    map_busy,
    allocs,
    sites_created,
    stacks_created,
    procs_created,
    cgroups_created,
    live_added,
    live_removed,
    pages_reclassified,
    page_bytes_freed_untracked,
    cache_memo_stale;
    source_frees
});

// The histogram width is defined once, in bpf/kheap.h: three counters, then
// the buckets.
const _: () = assert!(std::mem::size_of::<types::alloc_stats>() == (3 + HIST_BUCKETS) * 8);

/// Reads a value of a generated type from map bytes (which may be padded).
pub fn from_bytes<T: plain::Plain + Default + Copy>(bytes: &[u8]) -> T {
    let mut v = T::default();
    plain::copy_from_bytes(&mut v, bytes).expect("map value shorter than its BTF type");
    v
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
