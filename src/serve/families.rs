//! The metric families of one interval, built from the daemon's cumulative
//! state, the outstanding objects, `/proc/slabinfo` and kheap's own health.
//! Names are the contract the dashboard and docs/serve.md build on. Pure.

use std::collections::BTreeMap;

use crate::model::live::Outstanding;
use crate::model::slab_loss::{slab_bytes, slab_loss};
use crate::model::{Hist, Source, HIST_BUCKETS};
use crate::serve::cgroups;
use crate::serve::exposition::{Family, Kind, Value};
use crate::serve::processes;
use crate::serve::series::{
    LabelValues, Ranked, SeriesCounters, SeriesState, SourceCounters, OTHER,
};
use crate::sys::slabinfo::SlabinfoRow;

/// One outstanding (allocated, not yet freed) object group: a site in a
/// cache, with its objects and allocated bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutstandingSite {
    pub site: String,
    pub cache: String,
    pub source: Source,
    pub objects: u64,
    pub bytes: u64,
}

/// What the live-object store says (`--track-outstanding`): the objects
/// it holds, what its ageing forgot so far (cumulative), and since when it
/// holds every object it was given.
pub struct OutstandingInput<'a> {
    pub sites: &'a [OutstandingSite],
    pub aged_out: &'a [OutstandingSite],
    /// Seconds since the epoch.
    pub tracked_since_s: f64,
}

/// What `/proc/slabinfo` and sysfs say about the caches this interval.
pub struct SlabInput<'a> {
    pub rows: &'a [SlabinfoRow],
    pub page_size: u64,
    /// (cache, merged name) pairs: SLUB merges compatible caches, and the
    /// allocations of every merged name are counted under the name the
    /// kernel keeps (`skbuff_fclone_cache` under `pool_workqueue`, say).
    pub merged: &'a [(String, String)],
}

/// kheap's own health at the end of an interval.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Health {
    /// Cumulative BPF run time and runs (None when run-time stats are off).
    pub bpf_run_time_ns: Option<u64>,
    pub bpf_runs: Option<u64>,
    /// Events the kernel skipped because a BPF program was already running.
    pub bpf_recursion_misses: u64,
    /// Events not counted, by reason (cumulative).
    pub events_lost: Vec<(&'static str, u64)>,
    pub stack_collisions: u64,
    /// Entries over capacity, by map.
    pub map_fill: Vec<(&'static str, f64)>,
    /// Map entries deleted after being idle (cumulative).
    pub aged_out: u64,
    pub read_duration_s: f64,
    pub reads: u64,
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
    /// Label sets remembered for the top-N ranking.
    pub site_label_sets: u64,
    /// Stacks the profiles keep their own cumulative counts for.
    pub profile_stacks: u64,
    /// Stacks folded into their site's "aged out" share (cumulative).
    pub profile_stacks_folded: u64,
    /// The kernel's slab memory from /proc/meminfo (readable by every
    /// user, so served to every reader): reclaimable and unreclaimable
    /// bytes.
    pub meminfo_slab: Option<MeminfoSlab>,
}

/// /proc/meminfo's `SReclaimable` and `SUnreclaim`, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MeminfoSlab {
    pub reclaimable: u64,
    pub unreclaimable: u64,
}

fn hist_value(h: &Hist, sum: u64) -> Value {
    // Bucket b holds integer sizes in [2^(b-1), 2^b): all <= 2^b - 1. The
    // last bucket is open-ended: it is +Inf.
    let mut cumulative = 0;
    let mut buckets = Vec::with_capacity(HIST_BUCKETS - 1);
    for b in 0..HIST_BUCKETS - 1 {
        cumulative += h.0[b];
        let (_, hi) = Hist::bounds(b);
        buckets.push((hi - 1, cumulative));
    }
    Value::Histogram {
        buckets,
        sum,
        count: h.total(),
    }
}

/// A counter family of a series: name suffix, help, and its value.
type CounterDef = (&'static str, &'static str, fn(&SeriesCounters) -> u64);

fn counter_families(
    prefix: &str,
    label_names: &[&'static str],
    rows: &[(LabelValues, SeriesCounters)],
) -> Vec<Family> {
    let defs: [CounterDef; 4] = [
        ("allocations", "Allocations counted", |c| c.allocations),
        ("requested_bytes", "Bytes the callers asked for", |c| {
            c.bytes_req
        }),
        (
            "allocated_bytes",
            "Bytes the allocator handed out (object size)",
            |c| c.bytes_alloc,
        ),
        (
            "waste_bytes",
            "Bytes lost to slab rounding (allocated minus requested)",
            SeriesCounters::waste,
        ),
    ];
    defs.iter()
        .map(|(name, help, get)| {
            let mut f = Family::new(
                &format!("{prefix}_{name}"),
                Kind::Counter,
                help,
                label_names,
            );
            for (v, c) in rows {
                f.push(v.clone(), Value::Int(get(c)));
            }
            f
        })
        .collect()
}

/// The families made of `/proc/slabinfo`'s numbers. The file is mode 0400
/// (root-only: live per-cache counts help an attacker groom the heap), so
/// they are served only to a reader who may read them (docs/serve.md).
pub const FROM_SLABINFO: [&str; 4] = [
    "kheap_slab_active_objects",
    "kheap_slab_objects",
    "kheap_slab_memory_bytes",
    "kheap_slab_loss_bytes",
];

pub fn from_slabinfo(name: &str) -> bool {
    FROM_SLABINFO.contains(&name)
}

/// A gauge of outstanding objects: name, help, value.
type OutstandingDef = (&'static str, &'static str, fn(&Outstanding) -> u64);

/// Every family of one interval (`cgroups`: the per-cgroup series, with
/// `--by-cgroup`; `processes`: the per-process series, with
/// `--by-process`).
pub fn build(
    state: &SeriesState,
    cgroups: Option<&Ranked>,
    processes: Option<&Ranked>,
    process_outstanding: Option<&[(LabelValues, Outstanding)]>,
    outstanding: Option<OutstandingInput>,
    slab: Option<SlabInput>,
    health: &Health,
) -> Vec<Family> {
    let mut out = Vec::new();

    // Per cache: counters, frees, size histogram.
    let caches: Vec<(LabelValues, SeriesCounters)> = state
        .caches()
        .iter()
        .map(|(name, c)| (vec![name.clone()], c.counters))
        .collect();
    out.extend(counter_families("kheap_cache", &["cache"], &caches));
    let mut frees = Family::new(
        "kheap_cache_frees",
        Kind::Counter,
        "Frees counted (kfree and kmem_cache_free)",
        &["cache"],
    );
    let mut hist = Family::new(
        "kheap_cache_request_size_bytes",
        Kind::Histogram,
        "Requested sizes (log2 buckets; le is the bucket's largest size)",
        &["cache"],
    );
    for (name, c) in state.caches() {
        frees.push(vec![name.clone()], Value::Int(c.frees));
        hist.push(
            vec![name.clone()],
            hist_value(&c.hist, c.counters.bytes_req),
        );
    }
    out.push(frees);
    out.push(hist);
    source_families(state, &mut out);

    // Per site: the top N and other.
    let label_names: Vec<&'static str> = state.labels().iter().map(|l| l.name()).collect();
    let sites = state.site_series();
    out.extend(counter_families("kheap_site", &label_names, &sites));

    // Per cgroup: the top N and other.
    if let Some(c) = cgroups {
        let rows = c.series(cgroups::LABELS.len());
        out.extend(counter_families("kheap_cgroup", &cgroups::LABELS, &rows));
    }

    // Per process: the top N of the running processes, and other.
    if let Some(p) = processes {
        let rows = p.series(processes::LABELS.len());
        out.extend(counter_families("kheap_process", &processes::LABELS, &rows));
    }
    if let Some(rows) = process_outstanding {
        let defs: [OutstandingDef; 2] = [
            (
                "kheap_process_outstanding_objects",
                "Objects allocated by the process and not freed (top N holders, and other)",
                |o| o.objects,
            ),
            (
                "kheap_process_outstanding_bytes",
                "Bytes allocated by the process and not freed (top N holders, and other)",
                |o| o.bytes_alloc,
            ),
        ];
        for (name, help, get) in defs {
            let mut f = Family::new(name, Kind::Gauge, help, &processes::LABELS);
            for (v, o) in rows {
                f.push(v.clone(), Value::Int(get(o)));
            }
            out.push(f);
        }
    }

    if let Some(input) = outstanding {
        let other = vec![OTHER.to_string(); label_names.len()];
        let fold = |objs: &[OutstandingSite]| {
            let mut by_cache: BTreeMap<String, (u64, u64)> = BTreeMap::new();
            let mut by_source: BTreeMap<Source, (u64, u64)> = state
                .sources()
                .keys()
                .map(|&source| (source, (0, 0)))
                .collect();
            // Every exported site series has a value, zero included, so a
            // site whose objects were all freed reads 0 rather than
            // vanishing.
            let mut by_site: BTreeMap<LabelValues, (u64, u64)> =
                sites.iter().map(|(v, _)| (v.clone(), (0, 0))).collect();
            for o in objs {
                for c in [
                    by_cache.entry(o.cache.clone()).or_default(),
                    by_source.entry(o.source).or_default(),
                ] {
                    c.0 += o.objects;
                    c.1 += o.bytes;
                }
                let v = state.values_of(&o.site, &o.cache);
                let key = if state.is_member(&v) {
                    v
                } else {
                    other.clone()
                };
                let s = by_site.entry(key).or_default();
                s.0 += o.objects;
                s.1 += o.bytes;
            }
            [
                (
                    "kheap_cache",
                    vec!["cache"],
                    by_cache
                        .into_iter()
                        .map(|(k, v)| (vec![k], v))
                        .collect::<Vec<_>>(),
                ),
                (
                    "kheap_source",
                    vec!["source"],
                    by_source
                        .into_iter()
                        .map(|(k, v)| (vec![k.name().to_string()], v))
                        .collect(),
                ),
                (
                    "kheap_site",
                    label_names.clone(),
                    by_site.into_iter().collect(),
                ),
            ]
        };
        let kinds = [
            (
                input.sites,
                "outstanding",
                Kind::Gauge,
                "Objects allocated since kheap_outstanding_tracked_since_timestamp_seconds and not freed yet",
                "Allocated bytes of the outstanding objects",
            ),
            (
                input.aged_out,
                "outstanding_aged_out",
                Kind::Counter,
                "Objects forgotten by the live-object store while outstanding (the oldest, once it is 3/4 full); their frees are not seen",
                "Allocated bytes of the objects aged out",
            ),
        ];
        for (objs, what, kind, objects_help, bytes_help) in kinds {
            for (prefix, label_names, rows) in fold(objs) {
                let mut objects = Family::new(
                    &format!("{prefix}_{what}_objects"),
                    kind,
                    objects_help,
                    &label_names,
                );
                let mut bytes = Family::new(
                    &format!("{prefix}_{what}_bytes"),
                    kind,
                    bytes_help,
                    &label_names,
                );
                for (v, (o, b)) in rows {
                    objects.push(v.clone(), Value::Int(o));
                    bytes.push(v, Value::Int(b));
                }
                out.push(objects);
                out.push(bytes);
            }
        }
        let mut since = Family::new(
            "kheap_outstanding_tracked_since_timestamp_seconds",
            Kind::Gauge,
            "The live-object store holds every object allocated since this time and not freed (the start of tracking, or the youngest object aged out)",
            &[],
        );
        since.push(Vec::new(), Value::Float(input.tracked_since_s));
        out.push(since);
    }

    if let Some(SlabInput {
        rows,
        page_size,
        merged,
    }) = slab
    {
        let memory = |r: &SlabinfoRow| slab_bytes(r.num_slabs, r.pages_per_slab, page_size);
        let defs: [SlabGauge; 4] = [
            (
                FROM_SLABINFO[0],
                "Objects in use (/proc/slabinfo active_objs)",
                &|r| r.active_objs,
            ),
            (
                FROM_SLABINFO[1],
                "Objects the cache's slabs can hold (/proc/slabinfo num_objs)",
                &|r| r.num_objs,
            ),
            (
                FROM_SLABINFO[2],
                "Memory held by the cache's slabs",
                &memory,
            ),
            (
                FROM_SLABINFO[3],
                "Slab memory not holding objects in use (free slots, padding, slab tails)",
                &|r| slab_loss(memory(r), r.active_objs, r.objsize),
            ),
        ];
        for (name, help, get) in defs {
            let mut f = Family::new(name, Kind::Gauge, help, &["cache"]);
            for r in rows {
                f.push(vec![r.name.clone()], Value::Int(get(r)));
            }
            out.push(f);
        }
        let mut f = Family::new(
            "kheap_slab_merged_info",
            Kind::Gauge,
            "Cache names the kernel merged into this cache (SLUB merging): their allocations are counted under cache",
            &["cache", "merged"],
        );
        for (cache, name) in merged {
            f.push(vec![cache.clone(), name.clone()], Value::Int(1));
        }
        out.push(f);
    }

    health_families(health, &mut out);
    out
}

/// Per kernel allocator (`--source`): what it allocated, its frees, and
/// the bytes of its pages that back another source (pages of new slabs,
/// vmalloc areas, percpu chunks: counted by that source too, so a sum over
/// sources leaves them out).
fn source_families(state: &SeriesState, out: &mut Vec<Family>) {
    let sources = state.sources();
    let rows: Vec<(LabelValues, SeriesCounters)> = sources
        .iter()
        .map(|(s, c)| (vec![s.name().to_string()], c.counters))
        .collect();
    out.extend(counter_families("kheap_source", &["source"], &rows));
    let defs: [SourceCounter; 2] = [
        (
            "kheap_source_frees",
            "Frees counted per kernel allocator (the slab's: every free the other allocators did not count)",
            |c| c.frees,
        ),
        (
            "kheap_source_counted_elsewhere_bytes",
            "Allocated bytes of pages that back another allocator's memory (new slabs, vmalloc areas, percpu chunks), also counted by that allocator",
            |c| c.counted_elsewhere_bytes,
        ),
    ];
    for (name, help, get) in defs {
        let mut f = Family::new(name, Kind::Counter, help, &["source"]);
        for (s, c) in sources {
            f.push(vec![s.name().to_string()], Value::Int(get(c)));
        }
        out.push(f);
    }
}

/// A per-source counter: name, help, its value.
type SourceCounter = (&'static str, &'static str, fn(&SourceCounters) -> u64);

/// A per-cache gauge from /proc/slabinfo: name, help, value of a row.
type SlabGauge<'a> = (&'static str, &'static str, &'a dyn Fn(&SlabinfoRow) -> u64);

/// A family with one unlabelled sample: name, type, help, value.
type Single = (&'static str, Kind, &'static str, Value);

/// A family of one label: name, type, help, label name, (value, sample)s.
type Labelled<'a> = (
    &'static str,
    Kind,
    &'static str,
    &'static str,
    Vec<(&'a str, Value)>,
);

fn health_families(h: &Health, out: &mut Vec<Family>) {
    if let (Some(ns), Some(runs)) = (h.bpf_run_time_ns, h.bpf_runs) {
        out.extend(singles([
            (
                "kheap_bpf_run_time_seconds",
                Kind::Counter,
                "Time kheap's BPF programs ran (kernel run-time statistics)",
                Value::Float(ns as f64 / 1e9),
            ),
            (
                "kheap_bpf_runs",
                Kind::Counter,
                "Runs of kheap's BPF programs",
                Value::Int(runs),
            ),
        ]));
    }
    out.extend(singles([(
        "kheap_bpf_recursion_misses",
        Kind::Counter,
        "Events skipped because a BPF program was already running on the CPU",
        Value::Int(h.bpf_recursion_misses),
    )]));
    let labelled: [Labelled; 2] = [
        (
            "kheap_events_lost",
            Kind::Counter,
            "Events not counted (or stacks not captured), by reason",
            "reason",
            h.events_lost
                .iter()
                .map(|(r, n)| (*r, Value::Int(*n)))
                .collect(),
        ),
        (
            "kheap_map_fill_ratio",
            Kind::Gauge,
            "Entries of a BPF map over its capacity",
            "map",
            h.map_fill
                .iter()
                .map(|(m, r)| (*m, Value::Float(*r)))
                .collect(),
        ),
    ];
    for (name, kind, help, label, rows) in labelled {
        let mut f = Family::new(name, kind, help, &[label]);
        for (v, value) in rows {
            f.push(vec![v.to_string()], value);
        }
        out.push(f);
    }
    if let Some(m) = h.meminfo_slab {
        let mut f = Family::new(
            "kheap_meminfo_slab_bytes",
            Kind::Gauge,
            "Slab memory of the whole kernel (/proc/meminfo SReclaimable, SUnreclaim)",
            &["kind"],
        );
        f.push(vec!["reclaimable".into()], Value::Int(m.reclaimable));
        f.push(vec!["unreclaimable".into()], Value::Int(m.unreclaimable));
        out.push(f);
    }
    out.extend(singles([
        (
            "kheap_stack_collisions",
            Kind::Counter,
            "Stacks lost to stack-map collisions",
            Value::Int(h.stack_collisions),
        ),
        (
            "kheap_map_entries_aged_out",
            Kind::Counter,
            "Map entries deleted after being idle (their counts are kept)",
            Value::Int(h.aged_out),
        ),
        (
            "kheap_read_duration_seconds",
            Kind::Gauge,
            "Time the last read of the maps took",
            Value::Float(h.read_duration_s),
        ),
        (
            "kheap_reads",
            Kind::Counter,
            "Reads of the maps (one per --interval)",
            Value::Int(h.reads),
        ),
        (
            "kheap_site_label_sets",
            Kind::Gauge,
            "Site label sets remembered for the top-N ranking (exported or not)",
            Value::Int(h.site_label_sets),
        ),
        (
            "kheap_profile_stacks",
            Kind::Gauge,
            "Stacks the pprof profiles keep their own cumulative counts for",
            Value::Int(h.profile_stacks),
        ),
        (
            "kheap_profile_stacks_folded",
            Kind::Counter,
            "Stacks folded into their site's aged-out share of the profiles (idle or over the cap)",
            Value::Int(h.profile_stacks_folded),
        ),
        (
            "process_cpu_seconds",
            Kind::Counter,
            "CPU time of the kheap process (user and system)",
            Value::Float(h.cpu_seconds),
        ),
        (
            "process_resident_memory_bytes",
            Kind::Gauge,
            "Resident memory of the kheap process",
            Value::Int(h.rss_bytes),
        ),
    ]));
}

fn singles<const N: usize>(defs: [Single; N]) -> impl Iterator<Item = Family> {
    defs.into_iter()
        .map(|(name, kind, help, value)| Family::single(name, kind, help, value))
}

#[cfg(test)]
mod tests;
