//! Builds the report from a snapshot: symbolizes call sites and stacks,
//! labels each site by its caller, scales sampled stacks to their sites'
//! exact totals, folds caches, and says what dropped events left out.

use std::collections::{BTreeMap, HashMap};

use super::cgroups::cgroup_rows;
use super::identity::ProcessIdentity;
use super::processes::Owners;
use super::rows::{
    CacheRow, Lost, ProcRow, Report, RunInfo, Sampling, SiteRow, SourceTotals, StackRow, Totals,
};
use crate::model::live::{Retained, RetainedIndex};
use crate::model::snapshot::{EventCounters, Snapshot};
use crate::model::{AllocStats, CacheId, Counts, SiteKey, Source};
use crate::report::retention::{self, sort_by_retention, LeakSummary, Retention};
use crate::symbolize::{label_frame, strip_tracing_frames, Frame, Symbolize};

/// What a run's dropped events make incomplete, one sentence each, with
/// what to do about it. Empty when nothing was dropped.
pub fn incompleteness(ev: &EventCounters, leaks: Option<&LeakSummary>) -> Vec<String> {
    let mut dropped = vec![
        (
            ev.map_full_sites,
            "allocations not counted (site map full): totals, sites and caches are too low; raise --max-entries".to_string(),
        ),
        (
            ev.map_full_procs,
            "allocations missing from processes (process map full); raise --max-entries".into(),
        ),
        (
            ev.map_full_stacks,
            "stack samples not kept (stack map full); raise --max-entries".into(),
        ),
        (
            ev.map_full_caches,
            "frees missing from caches (cache map full); raise --max-entries".into(),
        ),
    ];
    if let Some(l) = leaks {
        dropped.push((
            l.map_full_objects,
            format!(
                "allocations not tracked (object map full at {}): outstanding and transient are too low; raise --max-objects",
                l.max_objects
            ),
        ));
    }
    dropped
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect()
}

/// Settings the report needs from the run.
pub struct BuildOptions {
    pub stack_sample_every: u32,
    pub duration_s: f64,
    pub run: RunInfo,
}

/// Builds the symbolized report. Sampled stacks are scaled so that the
/// stacks of a site add up to the site's exact totals.
pub fn build(snap: &Snapshot, syms: &dyn Symbolize, opts: BuildOptions) -> Report {
    let retained = snap
        .leaks
        .as_ref()
        .map(|l| retention::retained_index(l, snap));
    // With address sampling (kheap leaks --sample N) one object in about N
    // was traced: every allocation and retention figure is scaled by N.
    let address_sampled;
    let snap = match &snap.leaks {
        Some(l) if l.sample_every > 1 => {
            address_sampled = retention::scale_for_address_sampling(snap, l.sample_every);
            &address_sampled
        }
        _ => snap,
    };
    let estimated = opts.stack_sample_every > 1;
    let symbolized = symbolize_all(snap, syms);
    let frames_of = |id: i64| symbolized.stacks.get(&id).map(Vec::as_slice).unwrap_or(&[]);
    let ret = retained.as_ref().map(|idx| (idx, opts.duration_s));

    let labels = label_sites(snap, &symbolized.call_sites, &frames_of);
    let mut stacks = stack_rows(snap, &frames_of, &labels, estimated, ret);
    let mut sites = site_rows(snap, &labels, ret);
    let mut caches = cache_rows(snap, ret);
    if retained.is_some() {
        sort_by_retention(&mut sites, |r| (&r.retention, &r.counts));
        sort_by_retention(&mut stacks, |r| (&r.retention, &r.counts));
        sort_by_retention(&mut caches, |r| (&r.retention, &r.counts));
    }
    let leaks = snap
        .leaks
        .as_ref()
        .zip(retained.as_ref())
        .map(|(l, idx)| retention::leak_summary(l, idx, opts.duration_s));
    let processes = snap
        .procs
        .iter()
        .map(|(&pid, (comm, s))| {
            let cgroup_id = pid.and_then(|p| snap.proc_cgroups.get(&p).copied());
            ProcRow {
                process: ProcessIdentity::new(pid, |_| comm.clone(), cgroup_id),
                counts: s.into(),
            }
        })
        .collect();

    let mut by_source = source_totals(snap);
    // The leak tracer does not count frees in the kernel: each source's
    // are those derived for its caches (allocated - outstanding - unseen).
    if retained.is_some() {
        for t in &mut by_source {
            t.frees = caches
                .iter()
                .filter(|c| c.source == t.source)
                .filter_map(|c| c.retention.as_ref())
                .map(|r| r.freed_count)
                .sum();
        }
    }
    let mut all = AllocStats::default();
    for (k, s) in &snap.sites {
        if !k.cache.counted_elsewhere() {
            all += *s;
        }
    }
    let ev = &snap.events;
    // The leak tracer counts only untracked frees in the kernel; the frees
    // of tracked objects are derived per site.
    let frees = leaks
        .as_ref()
        .map_or(ev.frees, |l| l.frees_untracked + l.retention.freed_count);
    Report {
        // Milliseconds: a short run is not "0.0 s".
        duration_s: (opts.duration_s * 1000.0).round() / 1000.0,
        run: opts.run,
        totals: Totals {
            allocs: all.count,
            frees,
            bytes_req: all.bytes_req,
            bytes_alloc: all.bytes_alloc,
            waste_bytes: all.waste(),
            failed_allocs: ev.alloc_failed,
            sources: by_source,
        },
        lost: Lost {
            stacks: ev.lost_stacks(),
            stack_collisions: ev.lost_stack_collision,
            map_full: ev.map_full(),
            map_full_sites: ev.map_full_sites,
            map_full_stacks: ev.map_full_stacks,
            map_full_procs: ev.map_full_procs,
            map_full_caches: ev.map_full_caches,
            map_full_cgroups: ev.map_full_cgroups,
            latency_unmatched: 0,
            latency_nested: 0,
            kmalloc_cache_stale: ev.kmalloc_cache_stale,
            recursion_misses: ev.recursion_misses,
        },
        sampling: Sampling {
            stack_sample_every: opts.stack_sample_every,
            stacks_estimated: estimated,
            stack_samples: ev.stack_samples,
            sites_exact: ev.map_full_sites == 0,
            processes_exact: ev.map_full_procs == 0,
            incomplete: incompleteness(ev, leaks.as_ref()),
        },
        sites,
        stacks,
        caches,
        processes,
        cgroups: cgroup_rows(snap, ret),
        latency: Vec::new(),
        leaks,
    }
}

/// Per-source totals, for the sources that have events (or frees).
fn source_totals(snap: &Snapshot) -> Vec<SourceTotals> {
    let mut rows: Vec<SourceTotals> = Vec::new();
    let row = |rows: &mut Vec<SourceTotals>, source: Source| -> usize {
        if let Some(i) = rows.iter().position(|r| r.source == source) {
            return i;
        }
        rows.push(SourceTotals {
            source,
            ..Default::default()
        });
        rows.len() - 1
    };
    for (k, s) in &snap.sites {
        let i = row(&mut rows, k.cache.source());
        let r = &mut rows[i];
        r.count += s.count;
        r.bytes_req += s.bytes_req;
        r.bytes_alloc += s.bytes_alloc;
        if k.cache.counted_elsewhere() {
            r.counted_elsewhere_bytes += s.bytes_alloc;
        }
    }
    for (&source, &frees) in &snap.source_frees {
        let i = row(&mut rows, source);
        rows[i].frees = frees;
    }
    if let Some(r) = rows.iter_mut().find(|r| r.source == Source::Kmalloc) {
        r.frees = snap.slab_frees();
    }
    rows.sort_by_key(|r| r.source);
    rows
}

struct Symbolized {
    call_sites: HashMap<u64, Frame>,
    stacks: HashMap<i64, Vec<Frame>>,
}

/// One symbolizer call for every address in the snapshot.
fn symbolize_all(snap: &Snapshot, syms: &dyn Symbolize) -> Symbolized {
    let mut addrs: Vec<u64> = snap.sites.keys().map(|k| k.call_site).collect();
    for frames in snap.stack_frames.values() {
        addrs.extend(frames);
    }
    addrs.sort_unstable();
    addrs.dedup();
    let by_addr: HashMap<u64, Frame> = addrs.iter().copied().zip(syms.symbolize(&addrs)).collect();
    let frame = |a: &u64| {
        by_addr
            .get(a)
            .cloned()
            .unwrap_or_else(|| Frame::unknown(*a))
    };
    Symbolized {
        call_sites: snap
            .sites
            .keys()
            .map(|k| (k.call_site, frame(&k.call_site)))
            .collect(),
        stacks: snap
            .stack_frames
            .iter()
            .map(|(&id, addrs)| (id, strip_tracing_frames(addrs.iter().map(frame).collect())))
            .collect(),
    }
}

/// The retained index of a leaks run, with the run's duration.
type RetainedRef<'a> = Option<(&'a RetainedIndex, f64)>;

fn stack_rows<'a>(
    snap: &Snapshot,
    frames_of: &dyn Fn(i64) -> &'a [Frame],
    labels: &SiteLabels,
    estimated: bool,
    retained: RetainedRef,
) -> Vec<StackRow> {
    // Sampled totals per site, to scale each stack to the exact site numbers.
    let mut sampled: HashMap<&SiteKey, AllocStats> = HashMap::new();
    for ((site, _), s) in &snap.stacks {
        *sampled.entry(site).or_default() += *s;
    }
    let mut sampled_retained: HashMap<&SiteKey, Retained> = HashMap::new();
    if let Some((idx, _)) = retained {
        for ((site, _), r) in &idx.stacks {
            *sampled_retained.entry(site).or_default() += *r;
        }
    }
    // Names as the kernel saw them, else as leaks read them from /proc.
    let leak_comms = snap.leaks.as_ref().map(|l| &l.comms);
    let comm_of = |tgid: u32| {
        snap.comms
            .get(&tgid)
            .or_else(|| leak_comms.and_then(|c| c.get(&tgid)))
            .cloned()
            .unwrap_or_default()
    };
    let mut rows = Vec::new();
    for ((site, id), s) in &snap.stacks {
        let stats = match (estimated, snap.sites.get(site), sampled.get(site)) {
            (true, Some(exact), Some(sum)) => scale_to(s, sum, exact),
            _ => *s,
        };
        let frames = frames_of(*id);
        let retention = retained.map(|(idx, duration_s)| {
            let mine = idx
                .stacks
                .get(&(site.clone(), *id))
                .copied()
                .unwrap_or_default();
            let r = match (estimated, idx.sites.get(site), sampled_retained.get(site)) {
                (true, Some(exact), Some(sum)) => {
                    let mut r = retention::scale_retained_to(&mine, sum, exact);
                    // Ages from the site, whose every live object's age is
                    // known: the few sampled objects' ages, scaled up,
                    // once said "oldest 7.5s" under a site 30 s old. The
                    // stack's share of the site's histogram, and its oldest.
                    let share = |part: u64, whole: u64| {
                        if whole == 0 {
                            0.0
                        } else {
                            part as f64 / whole as f64
                        }
                    };
                    r.ages = exact.ages.scaled(
                        share(r.count, exact.count),
                        share(r.bytes_alloc, exact.bytes_alloc),
                    );
                    r.oldest_ns = if r.count > 0 { exact.oldest_ns } else { 0 };
                    r
                }
                _ => mine,
            };
            let mut ret = Retention::new(&r, duration_s);
            ret.freed_count = stats.count.saturating_sub(r.count);
            ret.freed_bytes = stats.bytes_alloc.saturating_sub(r.bytes_alloc);
            ret
        });
        let key = (site.clone(), *id);
        let owners = Owners {
            allocated: snap.stack_owners.get(&key),
            held: retained.and_then(|(idx, _)| idx.stack_owners.get(&key)),
        };
        let processes = owners.split(&stats, retention.as_ref(), &comm_of);
        rows.push(StackRow {
            function: label_frame(frames)
                .map(|f| f.name().to_string())
                .unwrap_or_else(|| "[no frames]".into()),
            frames: frames.iter().map(Frame::display).collect(),
            estimated,
            source: site.cache.source(),
            cache: site.cache.name(),
            counts: (&stats).into(),
            retention,
            processes,
            site_call_site: labels
                .get(&(site.call_site, site.cache.source()))
                .map(|(_, cs)| cs.display()),
        });
    }
    rows.sort_by_key(|r| std::cmp::Reverse(r.counts.bytes_alloc));
    rows
}

/// Scales one sampled stack so that all stacks of a site sum to the site's
/// exact counts: each quantity by its own exact/sampled ratio.
pub fn scale_to(stack: &AllocStats, sampled: &AllocStats, exact: &AllocStats) -> AllocStats {
    let ratio = |e: u64, s: u64| if s == 0 { 0.0 } else { e as f64 / s as f64 };
    let by_count = ratio(exact.count, sampled.count);
    let mut out = stack.scaled(by_count);
    out.bytes_req =
        (stack.bytes_req as f64 * ratio(exact.bytes_req, sampled.bytes_req)).round() as u64;
    out.bytes_alloc =
        (stack.bytes_alloc as f64 * ratio(exact.bytes_alloc, sampled.bytes_alloc)).round() as u64;
    out
}

/// Each site row's (label, call site), by (call site address, source).
pub type SiteLabels = HashMap<(u64, Source), (Frame, Frame)>;

/// The label of each call site: the call site itself, unless that is an
/// allocation wrapper (kvmalloc, kmemdup…), in which case the heaviest
/// sampled stack of the site names the caller. Returns (label, call site).
fn label_sites<'a>(
    snap: &Snapshot,
    call_sites: &HashMap<u64, Frame>,
    frames_of: &dyn Fn(i64) -> &'a [Frame],
) -> SiteLabels {
    let mut heaviest_stack: HashMap<(u64, Source), (u64, i64)> = HashMap::new();
    for ((site, id), s) in &snap.stacks {
        let e = heaviest_stack
            .entry((site.call_site, site.cache.source()))
            .or_insert((0, *id));
        if s.count > e.0 {
            *e = (s.count, *id);
        }
    }
    snap.sites
        .keys()
        .map(|k| {
            let addr = k.call_site;
            let source = k.cache.source();
            let cs = call_sites
                .get(&addr)
                .cloned()
                .unwrap_or_else(|| Frame::unknown(addr));
            if let Some(name) = k.whole_allocator() {
                let whole = Frame::named(&name);
                return ((addr, source), (whole.clone(), whole));
            }
            let mut label = cs.clone();
            if label_frame(std::slice::from_ref(&cs)).is_none_or(is_wrapper) {
                if let Some(f) = heaviest_stack
                    .get(&(addr, source))
                    .and_then(|&(_, id)| label_frame(frames_of(id)))
                {
                    label = f.clone();
                }
            }
            ((addr, source), (label, cs))
        })
        .collect()
}

/// Each site's (call site, source) with the frame its rows are labelled
/// by and its call site's own frame (a site row's `function`/`location`
/// and `call_site`).
pub fn site_labels(snap: &Snapshot, syms: &dyn Symbolize) -> SiteLabels {
    let symbolized = symbolize_all(snap, syms);
    let frames_of = |id: i64| symbolized.stacks.get(&id).map(Vec::as_slice).unwrap_or(&[]);
    label_sites(snap, &symbolized.call_sites, &frames_of)
}

/// Every (site, cache) pair with its label, for consumers that keep caches
/// apart (the slab report).
pub fn labelled_sites(snap: &Snapshot, syms: &dyn Symbolize) -> Vec<(Frame, SiteKey, AllocStats)> {
    let labels = site_labels(snap, syms);
    snap.sites
        .iter()
        .map(|(k, s)| {
            (
                labels[&(k.call_site, k.cache.source())].0.clone(),
                k.clone(),
                *s,
            )
        })
        .collect()
}

/// Per call site rows (summed over caches).
fn site_rows(snap: &Snapshot, labels: &SiteLabels, retained: RetainedRef) -> Vec<SiteRow> {
    type Folded = (AllocStats, Vec<String>, Retained, MergedHeld);
    let mut by_site: HashMap<(u64, Source), Folded> = HashMap::new();
    for (key, s) in &snap.sites {
        let e = by_site
            .entry((key.call_site, key.cache.source()))
            .or_default();
        e.0 += *s;
        if let Some(r) = retained.and_then(|(idx, _)| idx.sites.get(key)) {
            e.2 += *r;
        }
        if let Some((idx, _)) = retained {
            add_asked(&mut e.3, idx, key);
        }
        let name = key.cache.name();
        if !e.1.contains(&name) {
            e.1.push(name);
        }
    }
    let mut rows: Vec<SiteRow> = by_site
        .into_iter()
        .map(|((addr, source), (stats, mut caches, ret, asked))| {
            caches.sort();
            let (label, cs) = &labels[&(addr, source)];
            SiteRow {
                source,
                function: label.name().to_string(),
                location: label.display(),
                call_site: cs.display(),
                caches,
                counts: (&stats).into(),
                retention: retained.map(|(_, d)| Retention {
                    merged_caches: retention::merged_caches(&asked),
                    ..Retention::new(&ret, d)
                }),
            }
        })
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.counts.bytes_alloc));
    rows
}

/// By merged cache (its name): the outstanding objects from it, and how
/// many of them are known to be each asked-for cache's.
type MergedHeld = BTreeMap<String, (u64, BTreeMap<String, u64>)>;

/// Adds what `key`'s outstanding objects say of the caches their code
/// asked for to `merged` (by the merged cache's name: its outstanding
/// objects, and how many were read to be each asked-for cache's).
fn add_asked(merged: &mut MergedHeld, idx: &RetainedIndex, key: &SiteKey) {
    let Some(names) = idx.asked.get(key) else {
        return;
    };
    let e = merged.entry(key.cache.name()).or_default();
    e.0 += idx.sites.get(key).map_or(0, |r| r.count);
    for (name, n) in names {
        *e.1.entry(name.clone()).or_default() += n;
    }
}

fn is_wrapper(f: &Frame) -> bool {
    f.function.is_none() || crate::symbolize::is_allocator_frame(f.name())
}

fn cache_rows(snap: &Snapshot, retained: RetainedRef) -> Vec<CacheRow> {
    let by_cache_retained = retained.map(|(idx, d)| {
        let mut asked: HashMap<&CacheId, MergedHeld> = HashMap::new();
        for key in idx.asked.keys() {
            add_asked(asked.entry(&key.cache).or_default(), idx, key);
        }
        (idx.by_cache(), asked, d)
    });
    let retention = |cache: &CacheId| {
        by_cache_retained.as_ref().map(|(m, asked, d)| Retention {
            merged_caches: asked
                .get(cache)
                .map(retention::merged_caches)
                .unwrap_or_default(),
            ..Retention::new(&m.get(cache).copied().unwrap_or_default(), *d)
        })
    };
    let mut by_cache: HashMap<&CacheId, AllocStats> = HashMap::new();
    for (key, s) in &snap.sites {
        *by_cache.entry(&key.cache).or_default() += *s;
    }
    let mut rows: Vec<CacheRow> = by_cache
        .into_iter()
        .map(|(cache, s)| CacheRow {
            source: cache.source(),
            name: cache.name(),
            counted_elsewhere: cache.counted_elsewhere(),
            frees: snap.cache_frees.get(cache).copied().unwrap_or(0),
            frees_untraced: matches!(cache, CacheId::Kmalloc { .. }),
            counts: (&s).into(),
            retention: retention(cache),
        })
        .collect();
    // Caches that were only freed from during the run still get a row.
    for (cache, &frees) in &snap.cache_frees {
        if !snap.sites.keys().any(|k| &k.cache == cache) {
            rows.push(CacheRow {
                source: cache.source(),
                name: cache.name(),
                counted_elsewhere: cache.counted_elsewhere(),
                frees,
                frees_untraced: false,
                counts: Counts::default(),
                retention: retention(cache),
            });
        }
    }
    rows.sort_by_key(|r| std::cmp::Reverse(r.counts.bytes_alloc));
    rows
}

#[cfg(test)]
mod tests;
