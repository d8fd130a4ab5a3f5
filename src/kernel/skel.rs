//! The generated skeleton of bpf/kheap.bpf.c and conversions from its types
//! (generated from `bpf/kheap.h`) into the pure model types.

skeleton!("kheap");

use std::sync::OnceLock;

pub use skel::types;
pub use skel::{KheapSkel, KheapSkelBuilder, OpenKheapSkel};

use crate::model::HIST_BUCKETS;

/// The kmem object built without its kfunc and without BPF atomics
/// (build.rs): for kernels that expose no BTF of their own, where libbpf
/// cannot resolve the kfunc's extern and would refuse the whole object, and
/// for kernels before 5.12, whose verifier refuses atomic instructions.
static KHEAP_FOR_OLDER_KERNELS: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/older-kernels/kheap.bpf.o"));

/// Whether the running kernel loads the full kmem object: its own BTF (for
/// the kfunc) and BPF atomics (for leaks' object table).
pub fn full_object_fits() -> bool {
    crate::sys::kernel_has_own_btf() && bpf_atomics()
}

/// Whether the verifier accepts BPF atomics beyond add (cmpxchg: 5.12),
/// which leaks' object table claims its slots with. Probed once, by loading
/// a socket filter that does one cmpxchg on its stack.
pub fn bpf_atomics() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        // Raw instructions, little-endian fields: code, dst | src << 4,
        // off (16 bits), imm (32 bits).
        const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
            code as u64
                | ((dst | src << 4) as u64) << 8
                | (off as u16 as u64) << 16
                | (imm as u32 as u64) << 32
        }
        const R0: u8 = 0;
        const R1: u8 = 1;
        const FP: u8 = 10;
        let insns = [
            insn(0xb7, R0, 0, 0, 0),      // r0 = 0
            insn(0x7b, FP, R0, -8, 0),    // *(u64 *)(r10 - 8) = r0
            insn(0xb7, R1, 0, 0, 1),      // r1 = 1
            insn(0xdb, FP, R1, -8, 0xf1), // r0 = cmpxchg_64(r10 - 8, r0, r1)
            insn(0xb7, R0, 0, 0, 0),      // r0 = 0
            insn(0x95, 0, 0, 0, 0),       // exit
        ];
        let license = c"GPL";
        // SAFETY: insns outlives the call and holds insns.len() 8-byte
        // instructions, laid out as struct bpf_insn.
        let fd = unsafe {
            libbpf_sys::bpf_prog_load(
                libbpf_sys::BPF_PROG_TYPE_SOCKET_FILTER,
                c"kheap_atomics".as_ptr(),
                license.as_ptr(),
                insns.as_ptr().cast(),
                insns.len() as _,
                std::ptr::null_mut(),
            )
        };
        if fd < 0 {
            return false;
        }
        // SAFETY: a descriptor the call above opened and nothing else owns.
        unsafe { libc::close(fd) };
        true
    })
}

/// The object bytes the skeleton opens (build.rs points it here): the full
/// one where it fits (`full_object_fits`), else the one for older kernels.
pub fn kheap_object(full: &'static [u8]) -> &'static [u8] {
    if full_object_fits() {
        full
    } else {
        KHEAP_FOR_OLDER_KERNELS
    }
}

plain_types!(
    types::alloc_stats,
    types::site_key,
    types::site_slot,
    types::stack_key,
    types::cache_name,
    types::cache_frees,
    types::proc_info,
    types::cgroup_key,
    types::counters,
    types::live_obj,
    types::live_bucket,
    types::site_unseen,
    types::backing_range,
    types::asked_batch,
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
