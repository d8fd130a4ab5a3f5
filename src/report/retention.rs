//! The retention side of a report (kheap leaks): the fields added to site,
//! stack and cache rows, the run-wide summary, ordering, and the scaling of
//! sampled data. Pure; `report::build` calls it when a snapshot carries a
//! `LeakInput`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::live::{AgeBucket, LeakInput, Retained, RetainedIndex};
use crate::model::snapshot::Snapshot;
use crate::model::{round2, Counts};
use crate::report::identity::ProcessIdentity;
use crate::report::meminfo::AccountingRow;

/// What is still allocated of a row (kheap leaks and its snapshots only),
/// flattened into the row's JSON beside the allocation counts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Retention {
    /// Objects allocated while tracing and not freed (at least --min-age old).
    pub outstanding_count: u64,
    /// Their allocated bytes (what the slab holds for them).
    pub outstanding_bytes: u64,
    #[serde(default)]
    pub outstanding_bytes_req: u64,
    /// Age of the oldest outstanding object.
    #[serde(default)]
    pub oldest_s: f64,
    /// How fast the outstanding bytes grew over the run: the slope of
    /// what is still held by when it was allocated, objects younger than
    /// about a quarter of the run left out (`Retained::growth_bytes_per_s`):
    /// what was in flight at the end or held from the start is not growth.
    #[serde(default)]
    pub growth_bytes_per_s: f64,
    /// Tracked objects freed during the run (transient volume). For stacks,
    /// allocated minus outstanding.
    #[serde(default)]
    pub freed_count: u64,
    #[serde(default)]
    pub freed_bytes: u64,
    /// Tracked objects whose free no tracepoint showed (address reused).
    #[serde(default)]
    pub freed_unseen: u64,
    #[serde(default)]
    pub ages: Vec<AgeBucket>,
    /// Site and cache rows: the caches SLUB merged others into whose
    /// outstanding objects were read to be some other cache's, with the
    /// caches the code asked for. Absent where none is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged_caches: Vec<MergedCache>,
}

/// A cache SLUB merged others into, as one row holds it: how many of the
/// row's outstanding objects came from it, and which caches the code of
/// how many of them asked for (read from the objects: a socket names its
/// protocol, whose cache it was allocated from). The rest are not known.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergedCache {
    /// As the row names it: `signal_cache (merged: UNIX, UNIX-STREAM)`.
    pub cache: String,
    pub outstanding_count: u64,
    /// Most objects first, then by name.
    pub asked: Vec<AskedCache>,
}

/// A cache the code asked for, and how many objects are known to be its.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AskedCache {
    pub name: String,
    pub outstanding_count: u64,
}

/// What a row's merged caches hold: by the cache's name, its outstanding
/// objects in the row and the caches asked for (their counts), as
/// `merged_caches` lists them, largest first.
pub fn merged_caches(
    by_cache: &BTreeMap<String, (u64, BTreeMap<String, u64>)>,
) -> Vec<MergedCache> {
    let mut out: Vec<MergedCache> = by_cache
        .iter()
        .map(|(cache, (count, names))| {
            let mut asked: Vec<AskedCache> = names
                .iter()
                .filter(|(_, &n)| n > 0)
                .map(|(name, &n)| AskedCache {
                    name: name.clone(),
                    outstanding_count: n,
                })
                .collect();
            asked.sort_by(|a, b| {
                b.outstanding_count
                    .cmp(&a.outstanding_count)
                    .then_with(|| a.name.cmp(&b.name))
            });
            MergedCache {
                cache: cache.clone(),
                outstanding_count: *count,
                asked,
            }
        })
        .filter(|m| !m.asked.is_empty())
        .collect();
    out.sort_by(|a, b| {
        b.outstanding_count
            .cmp(&a.outstanding_count)
            .then_with(|| a.cache.cmp(&b.cache))
    });
    out
}

/// Runs shorter than this get no growth rate: a few KiB held after 2 ms
/// are not "1.3 GB/s".
pub const MIN_RATE_DURATION_S: f64 = 1.0;

impl Retention {
    /// `duration_s` is the traced time up to the read: no object allocated
    /// while tracing is older (ages are read a little later, after detach).
    pub fn new(r: &Retained, duration_s: f64) -> Retention {
        let oldest_ns = if duration_s > 0.0 {
            r.oldest_ns.min((duration_s * 1e9) as u64)
        } else {
            r.oldest_ns
        };
        Retention {
            outstanding_count: r.count,
            outstanding_bytes: r.bytes_alloc,
            outstanding_bytes_req: r.bytes_req,
            // Whole milliseconds, cut as the age buckets cut them: the
            // oldest age is in the last non-empty bucket, never past it.
            oldest_s: (oldest_ns / 1_000_000) as f64 / 1000.0,
            growth_bytes_per_s: if duration_s >= MIN_RATE_DURATION_S {
                round2(r.growth_bytes_per_s(duration_s))
            } else {
                0.0
            },
            freed_count: r.freed,
            freed_bytes: r.freed_bytes_alloc,
            freed_unseen: r.freed_unseen,
            ages: r.ages.buckets(),
            merged_caches: Vec::new(),
        }
    }
}

/// One program's recursion misses.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProgramMisses {
    pub program: String,
    pub misses: u64,
}

/// What the objects one process allocated still hold. The leak tracer keeps
/// no per-process allocation totals, hence only retention here.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessRetention {
    /// The cgroup is the one it allocated its newest outstanding object
    /// in.
    #[serde(flatten)]
    pub process: ProcessIdentity,
    #[serde(flatten)]
    pub retention: Retention,
}

/// Run-wide retention figures of a kheap leaks report or snapshot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LeakSummary {
    /// Whether this is a snapshot taken while running (--snapshot-every,
    /// SIGUSR1) rather than the end-of-run report.
    pub snapshot: bool,
    #[serde(flatten)]
    pub retention: Retention,
    pub min_age_s: f64,
    /// 1: every address traced (exact); N: about one address in N, chosen by
    /// a hash of the address, every number scaled by N (estimates).
    pub sample_every: u32,
    pub estimated: bool,
    /// Frees of objects not tracked (allocated before tracing began, or by
    /// a process the filters leave out): ignored, so never negative growth.
    pub frees_untracked: u64,
    /// kfree(NULL) and friends: nothing to forget.
    #[serde(default)]
    pub frees_null: u64,
    /// Allocations that returned a still-tracked address (a free not seen).
    pub reused_live: u64,
    /// Allocations not tracked because the object map was full.
    pub map_full_objects: u64,
    pub max_objects: u32,
    /// Map updates refused because an interrupt hit the tracer mid-update.
    pub map_busy: u64,
    /// Per program, the events the kernel skipped because a program was
    /// already running on that CPU (their sum is `lost.recursion_misses`).
    pub recursion_misses_by_program: Vec<ProgramMisses>,
    /// Free paths that fire no tracepoint: objects freed there look
    /// outstanding until their address is reused (then freed_unseen).
    pub unseen_free_paths: Vec<String>,
    /// Outstanding objects by the process that allocated them, largest
    /// first (kernel memory is often allocated in one process's context and
    /// held on behalf of another, or of none).
    #[serde(default)]
    pub processes: Vec<ProcessRetention>,
    /// With sources beyond kmalloc: outstanding bytes per source against
    /// /proc/meminfo (filled by the command, which reads meminfo).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accounting: Vec<AccountingRow>,
    /// Why a row of the accounting is left out: a filtered run cannot be
    /// compared with the page row's whole-machine free pages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accounting_skipped: Option<String>,
    /// The end-of-run report's readings over time (not in snapshots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<crate::report::timeline::Timeline>,
}

/// Free paths of the kernel that emit no kmem:kfree/kmem_cache_free event.
/// The first is from the slab code; the second was observed on 6.18, where
/// maple_node objects (mas_preallocate) come back from the allocator while
/// still tracked, i.e. were freed unseen.
pub const UNSEEN_FREE_PATHS: [&str; 2] = [
    "kmem_cache_free_bulk()/kfree_bulk(), which kvfree_rcu() batches also use",
    "RCU-deferred and bulk frees of slab sheaves (6.18: maple_node)",
];

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// The outstanding objects folded per site and stack, from the traced
/// (unscaled) totals, then scaled as a whole by the address sampling rate.
pub fn retained_index(l: &LeakInput, snap: &Snapshot) -> RetainedIndex {
    let idx = RetainedIndex::build(l, &snap.sites, &snap.cgroups);
    let n = l.sample_every.max(1) as f64;
    RetainedIndex {
        cgroups: idx
            .cgroups
            .iter()
            .map(|(k, r)| (*k, r.scaled(n, n)))
            .collect(),
        proc_cgroups: idx.proc_cgroups.clone(),
        sites: idx
            .sites
            .iter()
            .map(|(k, r)| (k.clone(), r.scaled(n, n)))
            .collect(),
        stacks: idx
            .stacks
            .iter()
            .map(|(k, r)| (k.clone(), r.scaled(n, n)))
            .collect(),
        stack_owners: idx
            .stack_owners
            .iter()
            .map(|(k, owners)| {
                let scaled = owners.iter().map(|(o, r)| (*o, r.scaled(n, n)));
                (k.clone(), scaled.collect())
            })
            .collect(),
        procs: idx
            .procs
            .iter()
            .map(|(k, r)| (*k, r.scaled(n, n)))
            .collect(),
        asked: idx
            .asked
            .iter()
            .map(|(k, names)| {
                let scaled = names
                    .iter()
                    .map(|(name, &c)| (name.clone(), (c as f64 * n).round() as u64));
                (k.clone(), scaled.collect())
            })
            .collect(),
    }
}

/// Largest outstanding first, then oldest, then largest allocation volume.
pub fn sort_by_retention<T>(rows: &mut [T], key: impl Fn(&T) -> (&Option<Retention>, &Counts)) {
    rows.sort_by(|a, b| {
        let (ra, ca) = key(a);
        let (rb, cb) = key(b);
        let r = |r: &Option<Retention>| {
            r.as_ref()
                .map_or((0, 0.0), |r| (r.outstanding_bytes, r.oldest_s))
        };
        let ((ba, oa), (bb, ob)) = (r(ra), r(rb));
        bb.cmp(&ba)
            .then(ob.total_cmp(&oa))
            .then(cb.bytes_alloc.cmp(&ca.bytes_alloc))
    });
}

pub fn scale_for_address_sampling(snap: &Snapshot, n: u32) -> Snapshot {
    let n = n as f64;
    let mut out = snap.clone();
    for s in out.sites.values_mut() {
        *s = s.scaled(n);
    }
    for s in out.stacks.values_mut() {
        *s = s.scaled(n);
    }
    for s in out.stack_owners.values_mut().flat_map(|o| o.values_mut()) {
        *s = s.scaled(n);
    }
    for s in out.cgroups.values_mut() {
        *s = s.scaled(n);
    }
    out
}

pub fn leak_summary(l: &LeakInput, idx: &RetainedIndex, duration_s: f64) -> LeakSummary {
    let n = l.sample_every.max(1);
    let scale = |v: u64| v * n as u64;
    LeakSummary {
        snapshot: l.kind == "snapshot",
        retention: Retention::new(&counted_once(idx), duration_s),
        min_age_s: round3(l.min_age_ns as f64 / 1e9),
        sample_every: n,
        estimated: n > 1,
        frees_untracked: scale(l.events.frees_untracked),
        frees_null: l.events.frees_null,
        reused_live: scale(l.events.reused_live),
        map_full_objects: l.events.map_full_live,
        max_objects: l.max_objects,
        map_busy: l.events.map_busy,
        recursion_misses_by_program: l
            .recursion_misses
            .iter()
            .map(|(p, m)| ProgramMisses {
                program: p.clone(),
                misses: *m,
            })
            .collect(),
        unseen_free_paths: UNSEEN_FREE_PATHS.iter().map(|s| s.to_string()).collect(),
        processes: if l.contexts_known {
            process_rows(l, idx, duration_s)
        } else {
            Vec::new()
        },
        accounting: Vec::new(),
        accounting_skipped: None,
        timeline: None,
    }
}

/// The run's retention with pages that back another source left out: that
/// source counts their bytes already.
fn counted_once(idx: &RetainedIndex) -> Retained {
    let mut total = Retained::default();
    for (cache, r) in idx.by_cache() {
        if !cache.counted_elsewhere() {
            total += r;
        }
    }
    total
}

fn process_rows(l: &LeakInput, idx: &RetainedIndex, duration_s: f64) -> Vec<ProcessRetention> {
    let mut rows: Vec<ProcessRetention> = idx
        .procs
        .iter()
        .map(|(&pid, r)| ProcessRetention {
            process: ProcessIdentity::new(
                pid,
                |p| l.comms.get(&p).cloned().unwrap_or_default(),
                pid.and_then(|p| idx.proc_cgroups.get(&p).copied()),
            ),
            retention: Retention::new(r, duration_s),
        })
        .collect();
    rows.sort_by(|a, b| {
        b.retention
            .outstanding_bytes
            .cmp(&a.retention.outstanding_bytes)
            .then(a.process.pid.cmp(&b.process.pid))
    });
    rows
}

/// Scales one stack's sampled retention so the stacks of a site sum to the
/// site's outstanding totals (which come from every tracked object).
pub fn scale_retained_to(stack: &Retained, sampled: &Retained, exact: &Retained) -> Retained {
    let ratio = |e: u64, s: u64| if s == 0 { 0.0 } else { e as f64 / s as f64 };
    let mut r = stack.scaled(
        ratio(exact.count, sampled.count),
        ratio(exact.bytes_alloc, sampled.bytes_alloc),
    );
    r.bytes_req =
        (stack.bytes_req as f64 * ratio(exact.bytes_req, sampled.bytes_req)).round() as u64;
    r
}
