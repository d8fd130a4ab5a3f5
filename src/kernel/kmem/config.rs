//! What a run traces and how, fixed before load.

use crate::model::Sources;

use crate::kernel::attach::AttachMode;

/// All CPUs' site slots together at most (bpf/kheap/site_slots.c): 8 MiB, a
/// quarter of the default modes' kernel-memory budget at 128 CPUs
/// (docs/design/kernel.md, "Kernel memory").
pub const SITE_SLOTS_BYTES: u64 = 8 << 20;
/// One slot: struct site_slot, checked against the generated type.
pub const SITE_SLOT_BYTES: u64 = 304;
/// All CPUs' kmalloc memos together at most (bpf/slab_cache.bpf.h): 2 MiB.
pub const KMALLOC_MEMO_BYTES: u64 = 2 << 20;
/// One memo entry: struct kmalloc_memo, checked against the generated type.
pub const KMALLOC_MEMO_ENTRY_BYTES: u64 = 32;
/// KHEAP_KMALLOC_MEMO_SLOTS: the memo's slots per CPU at most.
pub const KMALLOC_MEMO_SLOTS: u32 = 1024;
const _: () =
    assert!(std::mem::size_of::<crate::kernel::skel::types::site_slot>() as u64 == SITE_SLOT_BYTES);
const _: () = assert!(
    std::mem::size_of::<crate::kernel::skel::types::kmalloc_memo>() as u64
        == KMALLOC_MEMO_ENTRY_BYTES
);

/// What a run traces and how.
#[derive(Clone, Debug)]
pub struct Config {
    pub min_size: u64,
    pub max_size: Option<u64>,
    /// 1: every stack; N (a power of two): about one event in N; 0: none.
    pub stack_sample_every: u32,
    pub pids: Vec<u32>,
    pub follow_children: bool,
    pub comm: Option<String>,
    pub by_process: bool,
    /// Count per cgroup v2 id, accounted or not, and interrupts apart.
    pub by_cgroup: bool,
    /// Only tasks in these cgroup v2 ids or below them.
    pub cgroups: Vec<u64>,
    /// Key sampled stacks by who made them too (process and cgroup, or
    /// interrupt context): `Snapshot::stack_owners`, the labels of exported
    /// profiles. Costs a few helper calls on the sampled stack path only.
    pub stack_owners: bool,
    /// Frees per cache for kfree() too (top, slab, serve): each kfree event
    /// asks the object's slab, where the kernel's kfunc can (6.13+ with
    /// tp_btf); elsewhere kfree frees are counted in the total only.
    pub kfree_caches: bool,
    pub attach: AttachMode,
    pub max_sites: u32,
    pub max_stacks: u32,
    /// The kernel memory the maps may take (`--kernel-memory`); the mode's
    /// budget if not given (`kmem::budget`).
    pub kernel_memory: Option<u64>,
    /// Attach the free tracepoints too (frees per cache, net counts).
    /// Tracking live objects always does.
    pub trace_frees: bool,
    /// Remember every object until its free (`kheap leaks`).
    pub live: Option<LiveConfig>,
    /// The allocators traced (`--source`); the slab only by default.
    pub sources: Sources,
    /// Count kheap's own allocations too. Off by default: reading the maps
    /// allocates in the kernel (batch lookups kvmalloc their buffers), and a
    /// tool should not report its own footprint as the workload's.
    pub include_self: bool,
}

/// Settings of live-object tracking.
#[derive(Clone, Copy, Debug)]
pub struct LiveConfig {
    /// 1: every address; N (a power of two): addresses whose hash picks
    /// about one in N.
    pub sample_every: u32,
    /// Capacity of the object map.
    pub max_objects: u32,
}

/// Slots per bucket of leaks' object table (KHEAP_LIVE_WAYS in
/// bpf/kheap.h, the generated bucket's width).
pub const LIVE_WAYS: u32 = 8;
const _: () = assert!(
    std::mem::size_of::<crate::kernel::skel::types::live_bucket>() == LIVE_WAYS as usize * 8
);

/// How `--max-objects` objects are held: buckets of the object table, and
/// entries of the hash map that takes what a full bucket spills. The two
/// add up to `max_objects`, so the capacity the user asked for is exact.
/// About 7/8 of it is table (objects land in buckets at random: at the
/// table's full load a few percent spill, an eighth is room enough); none
/// without BPF atomics or for fewer than 10 objects, where the hash map
/// holds them all.
///
/// An object the store has no room for is counted (`map_full_live`), as a
/// full hash map's always was; with a table this can happen before
/// `max_objects` are tracked, when the spill map is full and the object's
/// bucket too. Small tables show it most: with `--max-objects 600` and 500
/// messages held, about 200 allocations were refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveStore {
    pub buckets: u32,
    pub spill_entries: u32,
}

impl LiveStore {
    pub fn sized(max_objects: u32, table: bool) -> LiveStore {
        let buckets = match table {
            true => (u64::from(max_objects) * 7 / (8 * u64::from(LIVE_WAYS))) as u32,
            false => 0,
        };
        LiveStore {
            buckets,
            spill_entries: max_objects - buckets * LIVE_WAYS,
        }
    }
}

impl Config {
    /// How this run holds leaks' objects (`LiveStore::sized`, with a table
    /// where `table`); without live-object tracking, no table and the one
    /// entry an unused hash map keeps (zero is refused).
    pub fn live_store(&self, table: bool) -> LiveStore {
        self.live.map_or(
            LiveStore {
                buckets: 0,
                spill_entries: 1,
            },
            |live| LiveStore::sized(live.max_objects, table),
        )
    }
}

impl Default for LiveConfig {
    fn default() -> Self {
        LiveConfig {
            sample_every: 1,
            max_objects: 262_144,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            min_size: 0,
            max_size: None,
            stack_sample_every: 1024,
            pids: Vec::new(),
            follow_children: false,
            comm: None,
            by_process: false,
            by_cgroup: false,
            cgroups: Vec::new(),
            stack_owners: false,
            kfree_caches: false,
            attach: AttachMode::Auto,
            max_sites: 8192,
            max_stacks: 8192,
            kernel_memory: None,
            trace_frees: true,
            live: None,
            include_self: false,
            sources: Sources::default(),
        }
    }
}

impl Config {
    /// Stacks are captured and keyed by who made them.
    pub(super) fn stacks_by_owner(&self) -> bool {
        self.stack_owners && self.stack_sample_every != 0
    }

    /// Every allocation event asks whether it ran in interrupt context: for
    /// the interrupt rows of `--by cgroup` and `--by process`, or a filter
    /// of tasks, which leaves interrupts out.
    pub(super) fn tests_context(&self) -> bool {
        self.by_cgroup || self.by_process || self.filters_tasks()
    }

    /// The programs ask whether an event ran in interrupt context (every
    /// event, or the sampled stacks' owners): the interrupt brackets are
    /// attached.
    pub(super) fn tells_interrupts(&self) -> bool {
        self.tests_context() || self.stacks_by_owner()
    }

    /// kheap's own events are told by a per-CPU word that a sched_switch
    /// program keeps (bpf/kheap/own_process.c): they are left out, and
    /// nothing else asks an event for its tgid.
    pub(super) fn own_process_by_switch(&self) -> bool {
        !self.include_self && !self.filters_tasks() && !self.by_process && self.live.is_none()
    }

    /// Only some tasks' allocations are counted (PIDs, a command name,
    /// cgroups; kheap's own exclusion aside), and no interrupt's.
    pub(super) fn filters_tasks(&self) -> bool {
        !self.pids.is_empty() || self.comm.is_some() || !self.cgroups.is_empty()
    }

    /// Slots per CPU in front of the site map (bpf/kheap/site_slots.c): an
    /// eighth of `max_sites`, a power of two from 1 to 1024, so that
    /// `--max-entries` bounds the memory of both; and on a machine of many
    /// possible CPUs, no more than [`SITE_SLOTS_BYTES`] in all, so that the
    /// front's memory does not grow with the CPU count (1024 slots up to 26
    /// CPUs, 128 at 128, 64 at 256; never fewer than 16 a CPU).
    pub(super) fn site_slots(&self, cpus: u32) -> u32 {
        const MOST: u32 = 1024;
        const FEWEST: u64 = 16;
        let eighth = (self.max_sites / 8).clamp(1, MOST);
        let fit = (SITE_SLOTS_BYTES / (u64::from(cpus.max(1)) * SITE_SLOT_BYTES)).max(FEWEST);
        let slots = u64::from(eighth).min(fit) as u32;
        1 << slots.ilog2()
    }

    /// Entries of the site-slot array: every possible CPU's slots, one
    /// CPU's after another (bpf/kheap/site_slots.c).
    pub(super) fn site_slot_entries(&self, cpus: u32) -> u32 {
        self.site_slots(cpus).saturating_mul(cpus.max(1))
    }

    /// Slots per CPU of the kmalloc memo (bpf/slab_cache.bpf.h): all 1024
    /// up to 64 CPUs, then fewer, so that all CPUs' memos keep to
    /// [`KMALLOC_MEMO_BYTES`] (512 at 128 CPUs, 256 at 256).
    pub(super) fn kmalloc_memo_slots(cpus: u32) -> u32 {
        let fit = KMALLOC_MEMO_BYTES / (u64::from(cpus.max(1)) * KMALLOC_MEMO_ENTRY_BYTES);
        let slots = fit.clamp(16, u64::from(KMALLOC_MEMO_SLOTS)) as u32;
        1 << slots.ilog2()
    }

    /// Every stack is captured and counted under its stack only; sites are
    /// summed from stacks in user space (one map update per event).
    pub(super) fn sites_from_stacks(&self) -> bool {
        self.stack_sample_every == 1 && self.live.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn site_slots_are_an_eighth_of_the_sites_as_a_power_of_two() {
        let slots = |max_sites| {
            Config {
                max_sites,
                ..Config::default()
            }
            .site_slots(2)
        };
        assert_eq!(slots(8192), 1024);
        assert_eq!(slots(65536), 1024);
        assert_eq!(slots(1000), 64);
        assert_eq!(slots(16), 2);
        assert_eq!(slots(4), 1);
        assert_eq!(slots(1), 1);
    }

    #[test]
    fn site_slots_keep_to_their_bytes_on_many_cpus() {
        let slots = |cpus| Config::default().site_slots(cpus);
        assert_eq!(slots(1), 1024);
        assert_eq!(slots(26), 1024);
        assert_eq!(slots(32), 512);
        assert_eq!(slots(128), 128);
        assert_eq!(slots(192), 128);
        assert_eq!(slots(256), 64);
        assert_eq!(slots(4096), 16);
        for cpus in [2, 27, 64, 100, 128, 192, 256, 512] {
            let bytes = u64::from(slots(cpus)) * u64::from(cpus) * SITE_SLOT_BYTES;
            assert!(bytes <= SITE_SLOTS_BYTES, "{cpus} CPUs: {bytes}");
            // A power of two no less than half of what fits.
            assert!(bytes * 2 > SITE_SLOTS_BYTES.min(1024 * u64::from(cpus) * SITE_SLOT_BYTES));
        }
    }

    #[test]
    fn kmalloc_memos_keep_to_their_bytes_on_many_cpus() {
        assert_eq!(Config::kmalloc_memo_slots(2), 1024);
        assert_eq!(Config::kmalloc_memo_slots(64), 1024);
        assert_eq!(Config::kmalloc_memo_slots(128), 512);
        assert_eq!(Config::kmalloc_memo_slots(256), 256);
        assert_eq!(Config::kmalloc_memo_slots(100_000), 16);
    }

    #[test]
    fn only_exact_record_runs_sum_sites_from_stacks() {
        let exact = Config {
            stack_sample_every: 1,
            ..Config::default()
        };
        assert!(exact.sites_from_stacks());
        assert!(!Config::default().sites_from_stacks());
        let leaks = Config {
            live: Some(LiveConfig::default()),
            ..exact
        };
        assert!(!leaks.sites_from_stacks());
    }

    #[test]
    fn the_object_store_holds_exactly_max_objects() {
        for max in [1, 9, 10, 63, 64, 100, 1000, 262_144, u32::MAX] {
            let s = LiveStore::sized(max, true);
            assert_eq!(
                u64::from(s.buckets) * u64::from(LIVE_WAYS) + u64::from(s.spill_entries),
                u64::from(max),
                "{max}: {s:?}"
            );
            // An eighth or more is left for what full buckets spill.
            assert!(s.spill_entries >= max / 8, "{max}: {s:?}");
        }
        // 100: 10 buckets of 8, 20 spill entries.
        assert_eq!(
            LiveStore::sized(100, true),
            LiveStore {
                buckets: 10,
                spill_entries: 20
            }
        );
        assert_eq!(LiveStore::sized(9, true).buckets, 0);
        assert_eq!(LiveStore::sized(10, true).buckets, 1);
        // Without BPF atomics the hash map holds everything.
        assert_eq!(
            LiveStore::sized(262_144, false),
            LiveStore {
                buckets: 0,
                spill_entries: 262_144
            }
        );
    }
}
