//! What is read from the kernel's maps, summed over CPUs, before
//! symbolization: the input of every report, and the keys and counters the
//! kernel layer is handed back (idle keys to delete, program run times).

use std::collections::HashMap;

use crate::model::live::LeakInput;
use crate::model::{AllocStats, CacheId, Owner, SiteKey, Source};
pub use crate::model::{CgroupKey, CgroupSlot};

/// Everything read from the kernel at the end of a run (or an interval),
/// summed over CPUs, before symbolization.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub sites: HashMap<SiteKey, AllocStats>,
    /// Sampled (or, in exact mode, all) stacks of each site.
    pub stacks: HashMap<(SiteKey, i64), AllocStats>,
    pub stack_frames: HashMap<i64, Vec<u64>>,
    /// The same stacks split by who made them (record and leaks; empty
    /// where the run did not key stacks by owner, as in top's intervals).
    /// Each stack's owners add up to its entry in `stacks`.
    pub stack_owners: HashMap<(SiteKey, i64), HashMap<Owner, AllocStats>>,
    /// Names of the processes (tgid) that made stacks or process rows, as
    /// the kernel saw them last.
    pub comms: HashMap<u32, String>,
    /// `--by process`: per process (tgid), and interrupt context under
    /// `None` (an allocation there is not the interrupted task's).
    pub procs: HashMap<Option<u32>, (String, AllocStats)>,
    /// `--by cgroup`: per cgroup, charged to its memory controller or not.
    pub cgroups: HashMap<CgroupKey, AllocStats>,
    /// The cgroup v2 id of each process in `procs`, where known.
    pub proc_cgroups: HashMap<u32, u64>,
    pub cache_frees: HashMap<CacheId, u64>,
    /// Frees per source beyond the slab (the slab's are `cache_frees`).
    pub source_frees: HashMap<Source, u64>,
    pub events: EventCounters,
    /// kheap's programs' run time and count so far (0 while the kernel's
    /// BPF run-time statistics are off).
    pub bpf_run: ProgRunTime,
    /// Outstanding objects, from `kheap leaks` only.
    pub leaks: Option<LeakInput>,
}

impl Snapshot {
    /// Frees of the slab: kfree() names no cache, so they are every free
    /// the other sources did not count.
    pub fn slab_frees(&self) -> u64 {
        let others: u64 = self.source_frees.values().sum();
        self.events.frees.saturating_sub(others)
    }

    /// Map entries this snapshot holds (for the entries idle aging
    /// deleted: how many were aged out).
    pub fn map_entries(&self) -> usize {
        self.sites.len()
            + self.stacks.len()
            + self.procs.len()
            + self.cgroups.len()
            + self.cache_frees.len()
    }
}

/// Counters of events that are not allocations: frees, and everything
/// dropped or sampled on the way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventCounters {
    pub frees: u64,
    pub frees_null: u64,
    pub alloc_failed: u64,
    pub stack_samples: u64,
    pub lost_stack_collision: u64,
    pub lost_stack_other: u64,
    pub map_full_sites: u64,
    pub map_full_stacks: u64,
    pub map_full_procs: u64,
    pub map_full_caches: u64,
    pub map_full_cgroups: u64,
    /// kmalloc events: checks that found a call site's remembered cache
    /// changed (bpf/slab_cache.bpf.h); the events just before may name the
    /// old cache.
    pub kmalloc_cache_stale: u64,
    /// Runs of kheap's programs the kernel skipped because the same program
    /// was already running on that CPU (an interrupt allocating while it
    /// ran): events that reached no map, as counted in the programs' info.
    pub recursion_misses: u64,
}

impl EventCounters {
    /// `f` applied to each counter of `self` and `other`, field by field:
    /// the one list of the fields, which the sums and the interval deltas
    /// are made of.
    pub fn zip(&self, other: &EventCounters, f: impl Fn(u64, u64) -> u64) -> EventCounters {
        EventCounters {
            frees: f(self.frees, other.frees),
            frees_null: f(self.frees_null, other.frees_null),
            alloc_failed: f(self.alloc_failed, other.alloc_failed),
            stack_samples: f(self.stack_samples, other.stack_samples),
            lost_stack_collision: f(self.lost_stack_collision, other.lost_stack_collision),
            lost_stack_other: f(self.lost_stack_other, other.lost_stack_other),
            map_full_sites: f(self.map_full_sites, other.map_full_sites),
            map_full_stacks: f(self.map_full_stacks, other.map_full_stacks),
            map_full_procs: f(self.map_full_procs, other.map_full_procs),
            map_full_caches: f(self.map_full_caches, other.map_full_caches),
            map_full_cgroups: f(self.map_full_cgroups, other.map_full_cgroups),
            kmalloc_cache_stale: f(self.kmalloc_cache_stale, other.kmalloc_cache_stale),
            recursion_misses: f(self.recursion_misses, other.recursion_misses),
        }
    }

    pub fn lost_stacks(&self) -> u64 {
        self.lost_stack_collision + self.lost_stack_other
    }
    pub fn map_full(&self) -> u64 {
        self.map_full_sites
            + self.map_full_stacks
            + self.map_full_procs
            + self.map_full_caches
            + self.map_full_cgroups
    }
}

impl std::ops::AddAssign for EventCounters {
    fn add_assign(&mut self, o: EventCounters) {
        *self = self.zip(&o, |a, b| a + b);
    }
}

/// Keys of the BPF maps that saw no event for a while, to be deleted so the
/// maps do not fill up over a long run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdleKeys {
    pub sites: Vec<SiteKey>,
    pub stacks: Vec<(SiteKey, i64)>,
    pub procs: Vec<Option<u32>>,
    /// Cgroups that allocate no more (a container that stopped) would
    /// otherwise fill the map over days of `serve --by-cgroup`.
    pub cgroups: Vec<CgroupKey>,
    pub caches: Vec<CacheId>,
}

impl IdleKeys {
    pub fn len(&self) -> usize {
        self.sites.len()
            + self.stacks.len()
            + self.procs.len()
            + self.cgroups.len()
            + self.caches.len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Cumulative run time and run count of kheap's programs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgRunTime {
    pub run_time_ns: u64,
    pub run_cnt: u64,
}

impl std::ops::AddAssign for ProgRunTime {
    fn add_assign(&mut self, more: ProgRunTime) {
        self.run_time_ns += more.run_time_ns;
        self.run_cnt += more.run_cnt;
    }
}

impl ProgRunTime {
    /// What ran between `earlier` and this reading.
    pub fn since(&self, earlier: &ProgRunTime) -> ProgRunTime {
        ProgRunTime {
            run_time_ns: self.run_time_ns.saturating_sub(earlier.run_time_ns),
            run_cnt: self.run_cnt.saturating_sub(earlier.run_cnt),
        }
    }
}
