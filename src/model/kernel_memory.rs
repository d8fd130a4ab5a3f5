//! How much kernel memory a BPF object's maps take, computed before they
//! are created, the way the kernel itself counts them (`map_mem_usage` of
//! hash and array maps, Linux 6.4+, the `memlock` of
//! /proc/PID/fdinfo/FD): a map's elements, its buckets and, for per-CPU
//! maps, one value per possible CPU for every element. kheap checks a run
//! against its budget with this before it loads anything, and `doctor`
//! prints it for each mode.

use std::fmt;

use crate::model::human_size;

/// What kind of map, as far as its memory goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapKind {
    /// A preallocated hash map shared by all CPUs.
    Hash,
    /// A preallocated hash map with one value per possible CPU per entry.
    PercpuHash,
    /// An array; `mmapable` ones are page-aligned.
    Array { mmapable: bool },
    /// An array with one value per possible CPU per entry.
    PercpuArray,
    /// A ring buffer of `max_entries` bytes.
    RingBuf,
}

/// One map as it will be created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapShape {
    pub name: String,
    pub kind: MapKind,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
}

/// The kernel's `struct htab_elem` before the key (x86_64 and arm64).
const HTAB_ELEM: u64 = 48;
/// The kernel's `struct bucket`: a list head and its lock.
const HTAB_BUCKET: u64 = 16;
/// `HASHTAB_MAP_LOCK_COUNT`: per-CPU recursion counters of a hash map.
const HTAB_LOCK_COUNT: u64 = 8;
/// The map structs themselves (`struct bpf_htab`, `struct bpf_array`),
/// rounded up; they vary a little with the kernel's configuration.
const MAP_STRUCT: u64 = 1024;
const PAGE: u64 = 4096;

fn round8(n: u32) -> u64 {
    u64::from(n).div_ceil(8) * 8
}

impl MapShape {
    /// Bytes of kernel memory the map takes on a machine of `cpus` possible
    /// CPUs.
    pub fn bytes(&self, cpus: u32) -> u64 {
        let cpus = u64::from(cpus.max(1));
        let entries = u64::from(self.max_entries);
        let value = round8(self.value_size);
        match self.kind {
            MapKind::Hash | MapKind::PercpuHash => {
                let percpu = self.kind == MapKind::PercpuHash;
                let buckets = entries.max(1).next_power_of_two();
                let mut usage = MAP_STRUCT + HTAB_BUCKET * buckets;
                usage += 4 * cpus * HTAB_LOCK_COUNT;
                let elem = HTAB_ELEM + round8(self.key_size) + if percpu { 8 } else { value };
                // A shared map keeps one spare element per CPU for updates
                // in place.
                let elems = if percpu { entries } else { entries + cpus };
                usage += elem * elems;
                usage += match percpu {
                    true => value * cpus * elems,
                    false => 8 * cpus,
                };
                usage
            }
            MapKind::Array { mmapable: true } => {
                MAP_STRUCT.next_multiple_of(PAGE) + (value * entries).next_multiple_of(PAGE)
            }
            MapKind::Array { mmapable: false } => MAP_STRUCT + value * entries,
            MapKind::PercpuArray => MAP_STRUCT + 8 * entries + value * entries * cpus,
            // Its data pages, two pages of positions and a page pointer
            // each.
            MapKind::RingBuf => {
                let pages = entries.div_ceil(PAGE) + 2;
                MAP_STRUCT + pages * (PAGE + 8)
            }
        }
    }

    /// The part of [`MapShape::bytes`] that grows with the CPU count.
    pub fn per_cpu_bytes(&self, cpus: u32) -> u64 {
        self.bytes(cpus).saturating_sub(self.bytes(0))
    }
}

/// The kernel memory of a set of maps on a machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Footprint {
    pub cpus: u32,
    /// Each map and its bytes, largest first.
    pub maps: Vec<(String, u64)>,
    /// All maps but those of `apart` (leaks' object store, which
    /// `--max-objects` sizes and kheap states on its own).
    pub total: u64,
    pub apart: u64,
}

impl Footprint {
    /// The footprint of `maps` on `cpus` CPUs, with the maps named in
    /// `apart` counted separately.
    pub fn of(maps: &[MapShape], cpus: u32, apart: &[&str]) -> Footprint {
        let mut sized: Vec<(String, u64)> = maps
            .iter()
            .map(|m| (m.name.clone(), m.bytes(cpus)))
            .collect();
        sized.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let (mut total, mut kept_apart) = (0, 0);
        for (name, bytes) in &sized {
            match apart.contains(&name.as_str()) {
                true => kept_apart += bytes,
                false => total += bytes,
            }
        }
        Footprint {
            cpus,
            maps: sized,
            total,
            apart: kept_apart,
        }
    }
}

/// What a mode may take in kernel memory besides an object store, on a
/// machine of `cpus` possible CPUs: 32 MiB up to 128 CPUs for record, top,
/// slab, serve and malloc (64 MiB for leaks), and 128 KiB more for each CPU
/// beyond (48 MiB at 256).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub bytes: u64,
    pub cpus: u32,
}

/// The counting modes' budget up to [`BUDGET_CPUS`] CPUs (record, top,
/// slab, serve, malloc).
pub const COUNTING_BASE: u64 = 32 << 20;
/// leaks' budget up to [`BUDGET_CPUS`] CPUs.
pub const LEAKS_BASE: u64 = 64 << 20;
/// The CPUs a base budget covers.
pub const BUDGET_CPUS: u32 = 128;
/// What each possible CPU beyond those adds.
pub const PER_CPU_BEYOND: u64 = 128 << 10;

impl Budget {
    pub fn new(base: u64, cpus: u32) -> Budget {
        Budget {
            bytes: base + PER_CPU_BEYOND * u64::from(cpus.saturating_sub(BUDGET_CPUS)),
            cpus,
        }
    }
}

/// Why a footprint does not fit, in words for the one-line refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TooBig {
    pub needed: u64,
    pub limit: u64,
    /// What the limit is: "kheap's budget on this 128-CPU machine",
    /// "RLIMIT_MEMLOCK".
    pub what: String,
}

impl fmt::Display for TooBig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "its maps would take {} of kernel memory, above {} ({})",
            human_size(self.needed),
            human_size(self.limit),
            self.what
        )
    }
}

/// A capacity to suggest where the limit moves with the machine's free
/// memory (a quarter of MemAvailable): `fits` rounded down to two
/// significant digits, so the number a refusal names still fits when the
/// user runs it a moment later (the exact largest would be refused again
/// after the page cache grew by a page). At most a tenth below `fits`.
pub fn round_suggestion(fits: u32) -> u32 {
    let mut unit = 1;
    while fits / unit >= 100 {
        unit *= 10;
    }
    fits / unit * unit
}

/// The largest value in `lo..=hi` for which `fits` holds, given that it
/// holds for `lo` (a capacity: more entries never take less memory).
pub fn largest_fitting(lo: u32, hi: u32, mut fits: impl FnMut(u32) -> bool) -> u32 {
    if fits(hi) {
        return hi;
    }
    let (mut good, mut bad) = (lo, hi);
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        match fits(mid) {
            true => good = mid,
            false => bad = mid,
        }
    }
    good
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(kind: MapKind, key: u32, value: u32, entries: u32) -> MapShape {
        MapShape {
            name: "m".into(),
            kind,
            key_size: key,
            value_size: value,
            max_entries: entries,
        }
    }

    #[test]
    fn a_per_cpu_hash_of_histograms_grows_with_the_cpus_and_a_shared_one_does_not() {
        // The numbers: 8192 entries of 280 bytes on 128 CPUs are
        // 281 MiB per-CPU.
        let percpu = shape(MapKind::PercpuHash, 24, 280, 8192);
        let mib = percpu.bytes(128) as f64 / (1 << 20) as f64;
        assert!((280.0..283.0).contains(&mib), "{mib}");
        let shared = shape(MapKind::Hash, 24, 280, 8192);
        // (48 + 24 + 280) bytes an element, a spare per CPU, buckets.
        let expected = 1024 + 16 * 8192 + 4 * 128 * 8 + 352 * (8192 + 128) + 8 * 128;
        assert_eq!(shared.bytes(128), expected);
        assert!(shared.per_cpu_bytes(128) < 64 << 10);
    }

    #[test]
    fn arrays_count_their_values_and_per_cpu_arrays_one_per_cpu() {
        assert_eq!(
            shape(MapKind::PercpuArray, 4, 304, 128).bytes(128),
            1024 + 8 * 128 + 304 * 128 * 128
        );
        assert_eq!(
            shape(MapKind::Array { mmapable: true }, 4, 12, 1000).bytes(2),
            4096 + 16384
        );
        // Values are 8-byte aligned: 16 bytes each.
        assert_eq!(
            shape(MapKind::Array { mmapable: false }, 4, 12, 1000).bytes(2),
            1024 + 16000
        );
    }

    #[test]
    fn a_footprint_keeps_the_object_store_apart() {
        let maps = [
            MapShape {
                name: "live_slots".into(),
                ..shape(MapKind::Array { mmapable: true }, 4, 64, 1 << 16)
            },
            MapShape {
                name: "sites".into(),
                ..shape(MapKind::Hash, 24, 280, 8192)
            },
        ];
        let f = Footprint::of(&maps, 2, &["live_slots"]);
        assert_eq!(f.apart, maps[0].bytes(2));
        assert_eq!(f.total, maps[1].bytes(2));
        assert_eq!(f.maps[0].0, "live_slots");
    }

    #[test]
    fn budgets_are_32_mib_at_128_cpus_and_48_at_256() {
        assert_eq!(Budget::new(COUNTING_BASE, 2).bytes, 32 << 20);
        assert_eq!(Budget::new(COUNTING_BASE, 128).bytes, 32 << 20);
        assert_eq!(Budget::new(COUNTING_BASE, 256).bytes, 48 << 20);
        assert_eq!(Budget::new(LEAKS_BASE, 128).bytes, 64 << 20);
        assert_eq!(Budget::new(LEAKS_BASE, 256).bytes, 80 << 20);
    }

    #[test]
    fn suggestions_keep_two_significant_digits() {
        assert_eq!(round_suggestion(1_809_277), 1_800_000);
        assert_eq!(round_suggestion(99), 99);
        assert_eq!(round_suggestion(100), 100);
        assert_eq!(round_suggestion(1_099), 1_000);
        assert_eq!(round_suggestion(1), 1);
        assert_eq!(round_suggestion(u32::MAX), 4_200_000_000);
    }

    #[test]
    fn the_largest_fitting_capacity_is_found() {
        assert_eq!(largest_fitting(1, 1 << 20, |n| n <= 12_345), 12_345);
        assert_eq!(largest_fitting(1, 100, |_| true), 100);
        assert_eq!(largest_fitting(1, 100, |n| n == 1), 1);
    }

    #[test]
    fn a_refusal_names_both_sizes_and_the_limit() {
        let t = TooBig {
            needed: 40 << 20,
            limit: 32 << 20,
            what: "kheap's budget on this 128-CPU machine".into(),
        };
        assert_eq!(
            t.to_string(),
            format!(
                "its maps would take {} of kernel memory, above {} (kheap's budget on this 128-CPU machine)",
                human_size(40 << 20),
                human_size(32 << 20)
            )
        );
    }
}
