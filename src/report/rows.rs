//! The report every format is drawn from, and its rows: totals, lost
//! events, sampling, sites, stacks, caches, processes, cgroups.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::identity::ProcessIdentity;
use super::meminfo::{Geometry, SourceOutstanding};
use super::processes::StackProcess;
use crate::cgroup::CgroupRef;
use crate::model::{Counts, LatencyRow, Source, VmapKind};
use crate::report::retention::{LeakSummary, Retention};

/// How stacks were captured in this run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// 1: every allocation's stack was captured (exact); N: about one in N.
    pub stack_sample_every: u32,
    /// Whether per-stack numbers are estimates scaled to exact site totals.
    pub stacks_estimated: bool,
    /// Stacks actually captured.
    pub stack_samples: u64,
    /// Per-site and per-cache numbers (and the totals) hold every traced
    /// allocation: false when the site map was full and events were dropped.
    pub sites_exact: bool,
    /// Per-process numbers hold every traced allocation.
    #[serde(default = "yes")]
    pub processes_exact: bool,
    /// What this report is missing, one sentence each (empty: nothing).
    #[serde(default)]
    pub incomplete: Vec<String>,
}

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// Allocations: `count`, as in every row.
    #[serde(rename = "count")]
    pub allocs: u64,
    pub frees: u64,
    pub bytes_req: u64,
    pub bytes_alloc: u64,
    pub waste_bytes: u64,
    pub failed_allocs: u64,
    /// The same, per source traced (`--source`); pages that back slabs or
    /// vmalloc areas are in their own source's row, not in the sums above.
    #[serde(default)]
    pub sources: Vec<SourceTotals>,
}

/// One source's share of the totals.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SourceTotals {
    pub source: Source,
    pub count: u64,
    pub frees: u64,
    pub bytes_req: u64,
    pub bytes_alloc: u64,
    /// Bytes also counted by another source (pages backing slabs or
    /// vmalloc areas): left out of the run's totals.
    pub counted_elsewhere_bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Lost {
    /// Events whose stack could not be captured (collisions + other errors).
    pub stacks: u64,
    pub stack_collisions: u64,
    /// Events not aggregated because a BPF map was full.
    pub map_full: u64,
    pub map_full_sites: u64,
    pub map_full_stacks: u64,
    pub map_full_procs: u64,
    pub map_full_caches: u64,
    #[serde(default)]
    pub map_full_cgroups: u64,
    /// --latency: allocator exits without a recorded entry (e.g. attached
    /// mid-call, or an entry record lost to a full map).
    #[serde(default)]
    pub latency_unmatched: u64,
    /// --latency: allocator calls made inside a timed call on the same
    /// task (an interrupt allocating during it), not timed.
    #[serde(default)]
    pub latency_nested: u64,
    /// kmalloc events: times a call site's remembered cache was found
    /// changed when its slab was asked again (bpf/slab_cache.bpf.h), each
    /// time up to 4096 events before may have named the old cache.
    #[serde(default)]
    pub kmalloc_cache_stale: u64,
    /// Events the kernel did not hand to kheap's programs because the same
    /// program was already running on that CPU (an interrupt allocating
    /// meanwhile), as the kernel counted them.
    #[serde(default)]
    pub recursion_misses: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SiteRow {
    /// The kernel allocator (`--source`).
    #[serde(default)]
    pub source: Source,
    /// The function that asked for the memory (first non-allocator frame).
    pub function: String,
    /// `function+0xoff` of the row's label frame.
    pub location: String,
    /// The tracepoint's call_site, symbolized (may be inside a wrapper such
    /// as kvmalloc when the label comes from the stacks).
    pub call_site: String,
    pub caches: Vec<String>,
    #[serde(flatten)]
    pub counts: Counts,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StackRow {
    #[serde(default)]
    pub source: Source,
    pub function: String,
    /// Innermost first, `name+0xoff`.
    pub frames: Vec<String>,
    pub estimated: bool,
    pub cache: String,
    #[serde(flatten)]
    pub counts: Counts,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,
    /// Who made this stack's allocations, largest first; their numbers add
    /// up to the row's. Absent where the run did not keep stacks per
    /// process (top).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<StackProcess>,
    /// The `call_site` of the site row whose allocations this stack is
    /// part of (with the row's `source`, its identity). Known where the
    /// report was built, not read back from JSON: the pprof writer adds
    /// what a site's sampled stacks leave out as a site-only sample.
    #[serde(skip)]
    pub site_call_site: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheRow {
    #[serde(default)]
    pub source: Source,
    pub name: String,
    /// Pages that back another source (new slabs, vmalloc areas, percpu
    /// chunks), which counts their bytes: left out of totals.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub counted_elsewhere: bool,
    #[serde(default)]
    pub frees: u64,
    /// Allocated by kmalloc(), whose frees (kfree) name no cache: `frees`
    /// does not count them.
    #[serde(skip)]
    pub frees_untraced: bool,
    #[serde(flatten)]
    pub counts: Counts,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcRow {
    /// The cgroup is the process's when it first allocated.
    #[serde(flatten)]
    pub process: ProcessIdentity,
    #[serde(flatten)]
    pub counts: Counts,
}

/// Allocations of one cgroup (or of interrupt context), and how much of it
/// the kernel charged to the cgroup's memory controller: unaccounted kernel
/// memory escapes the cgroup's memory limit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CgroupRow {
    /// null for the interrupt row.
    pub cgroup: Option<CgroupRef>,
    /// Allocated in hard/soft interrupt or NMI context: no task's.
    pub interrupt: bool,
    #[serde(flatten)]
    pub counts: Counts,
    #[serde(flatten)]
    pub accounting: Accounting,
    /// kheap leaks: what the cgroup's allocations still hold.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,
    /// kheap leaks: the outstanding bytes split by memory-cgroup charging.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub outstanding_accounting: Option<OutstandingAccounting>,
    /// Its id, until `name_cgroups` resolves it.
    #[serde(skip)]
    pub cgroup_id: Option<u64>,
}

/// Outstanding objects (kheap leaks) split by memory-cgroup charging.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutstandingAccounting {
    pub outstanding_accounted_count: u64,
    pub outstanding_accounted_bytes: u64,
    pub outstanding_unaccounted_count: u64,
    pub outstanding_unaccounted_bytes: u64,
}

/// Allocated bytes and counts split by memory-cgroup charging.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accounting {
    pub accounted_count: u64,
    pub accounted_bytes: u64,
    pub unaccounted_count: u64,
    pub unaccounted_bytes: u64,
}

/// What a run was: shown in the header, kept in JSON.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub kernel: String,
    pub attach: Vec<String>,
    pub skipped: Vec<String>,
    pub filters: Vec<String>,
    pub command: Option<String>,
    /// The kernel memory of kheap's own BPF maps in this run, as the
    /// kernel counts it (docs/design/kernel.md, "Kernel memory").
    #[serde(default)]
    pub kernel_memory_bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub duration_s: f64,
    pub run: RunInfo,
    pub totals: Totals,
    pub lost: Lost,
    pub sampling: Sampling,
    pub sites: Vec<SiteRow>,
    pub stacks: Vec<StackRow>,
    pub caches: Vec<CacheRow>,
    #[serde(default)]
    pub processes: Vec<ProcRow>,
    /// --by cgroup: per cgroup v2, and the interrupt row.
    #[serde(default)]
    pub cgroups: Vec<CgroupRow>,
    /// With --latency: per-site time inside the allocator.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub latency: Vec<LatencyRow>,
    /// kheap leaks only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaks: Option<LeakSummary>,
}

impl Report {
    /// Whether the run traced an allocator beyond the slab (`--source`):
    /// then site, stack and cache rows show their `source` (a column, a
    /// root frame, a profile label); a default, slab-only report keeps the
    /// shape it always had. Every traced source beyond the slab has a row
    /// in `totals.sources` (its frees are read even when it saw no event),
    /// so the answer holds for every interval of `top`.
    pub fn shows_sources(&self) -> bool {
        self.totals
            .sources
            .iter()
            .any(|t| t.source != Source::Kmalloc)
    }

    /// Outstanding bytes per source (kheap leaks), pages that back another
    /// source apart: the input of the /proc/meminfo accounting, with
    /// the part each source's meminfo line does not count by design.
    pub fn outstanding_by_source(&self, geometry: Geometry) -> HashMap<Source, SourceOutstanding> {
        let mut by_source: HashMap<Source, SourceOutstanding> = HashMap::new();
        for c in &self.caches {
            let Some(r) = &c.retention else { continue };
            if c.counted_elsewhere {
                by_source.entry(c.source).or_default().counted_elsewhere += r.outstanding_bytes;
                continue;
            }
            let excluded = match c.source {
                // VmallocUsed counts the pages behind vmalloc proper only:
                // not its areas' guard pages, nor vmap, ioremap and
                // vm_map_ram areas (their memory is pages or devices').
                Source::Vmalloc if c.name == VmapKind::Vmalloc.name() => {
                    r.outstanding_count * geometry.page_size
                }
                Source::Vmalloc => r.outstanding_bytes,
                // Percpu counts the copies on every CPU, not the obj_cgroup
                // pointers the footprint adds.
                Source::Percpu => r
                    .outstanding_bytes
                    .saturating_sub(r.outstanding_bytes_req * geometry.possible_cpus),
                // Slab and page lines count every byte of their objects.
                Source::Kmalloc | Source::Page => 0,
            };
            let e = by_source.entry(c.source).or_default();
            e.bytes += r.outstanding_bytes;
            e.excluded += excluded.min(r.outstanding_bytes);
        }
        by_source
    }
}
