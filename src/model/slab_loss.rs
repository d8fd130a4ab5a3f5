//! Memory and loss arithmetic, kept apart from I/O so it can be checked
//! against hand-computed numbers.

use crate::model::AllocStats;

/// Bytes held by `slabs` slabs of `pages_per_slab` pages each.
pub fn slab_bytes(slabs: u64, pages_per_slab: u64, page_size: u64) -> u64 {
    slabs * pages_per_slab * page_size
}

/// Loss as the kernel's `tools/mm/slabinfo.c` defines it (`slab_waste()`):
/// memory in slabs minus what the objects in use would occupy unpadded,
/// `slabs * (PAGE_SIZE << order) - objects * object_size`. It counts free
/// slots, per-object padding and metadata, and the unused tail of each slab.
///
/// `object_size` should be sysfs `object_size`; with only `/proc/slabinfo`
/// the padded size is all there is, and the loss comes out smaller (padding
/// is then not counted).
pub fn slab_loss(slab_bytes: u64, active_objs: u64, object_size: u64) -> u64 {
    slab_bytes.saturating_sub(active_objs * object_size)
}

/// Memory tied up in partially used slabs: freeable only if every object
/// in them is freed.
pub fn partial_bytes(partial_slabs: u64, pages_per_slab: u64, page_size: u64) -> u64 {
    slab_bytes(partial_slabs, pages_per_slab, page_size)
}

/// Rounds up to the 8-byte alignment every slab object gets at least.
pub fn align8(size: u64) -> u64 {
    size.div_ceil(8) * 8
}

/// The object size a dedicated cache for these allocations would use:
/// the mean requested size, rounded up to a whole byte and then to 8.
pub fn right_size(stats: &AllocStats) -> u64 {
    if stats.count == 0 {
        return 0;
    }
    align8(stats.bytes_req.div_ceil(stats.count))
}

/// Bytes a right-sized dedicated cache would have saved over the run:
///
/// `saving = bytes_alloc - count * align8(ceil(bytes_req / count))`
///
/// i.e. what the allocations were given, minus what they would have been
/// given by a cache whose objects are exactly the (8-aligned) mean request.
/// This is an estimate: it ignores the dedicated cache's own slab tail, and
/// using the mean understates the need when sizes vary (the hints only use
/// it where requests cluster).
pub fn right_size_saving(stats: &AllocStats) -> u64 {
    stats
        .bytes_alloc
        .saturating_sub(stats.count * right_size(stats))
}

/// Per-second rate over the run; 0 when the duration is unknown or zero.
pub fn per_second(n: u64, duration_s: f64) -> f64 {
    if duration_s > 0.0 {
        n as f64 / duration_s
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::stats;

    #[test]
    fn loss_matches_slabinfo_tool_on_known_numbers() {
        // :A-0000192 (cred, pid) on this machine: 184-byte objects padded to
        // 192, 21 per order-0 slab. 10 slabs, 200 objects in use.
        let bytes = slab_bytes(10, 1, 4096);
        assert_eq!(bytes, 40960);
        assert_eq!(slab_loss(bytes, 200, 184), 40960 - 36800);
        // kmalloc-4k: 45 order-3 slabs, 282 objects in use.
        let bytes = slab_bytes(45, 8, 4096);
        assert_eq!(bytes, 1_474_560);
        assert_eq!(slab_loss(bytes, 282, 4096), 1_474_560 - 1_155_072);
        // Inconsistent snapshots (objects read after slabs grew) never wrap.
        assert_eq!(slab_loss(4096, 100, 4096), 0);
        assert_eq!(partial_bytes(21, 8, 4096), 688_128);
    }

    #[test]
    fn right_sizing_saving_follows_the_documented_formula() {
        // 1000 requests of 2100 bytes served by kmalloc-4k.
        let s = stats(1000, 2_100_000, 4_096_000);
        assert_eq!(right_size(&s), 2104);
        assert_eq!(right_size_saving(&s), 4_096_000 - 2_104_000);
        // A mean of 100.5 bytes rounds up to 101 and then to 104.
        let s = stats(2, 201, 256);
        assert_eq!(right_size(&s), 104);
        assert_eq!(right_size_saving(&s), 256 - 208);
        assert_eq!(right_size_saving(&AllocStats::default()), 0);
        assert_eq!(align8(0), 0);
        assert_eq!(align8(1), 8);
        assert_eq!(align8(16), 16);
    }

    #[test]
    fn rates_need_a_duration() {
        assert_eq!(per_second(100, 0.0), 0.0);
        assert_eq!(per_second(100, 4.0), 25.0);
    }
}
