//! Builds the report from a snapshot: symbolizes call sites and stacks,
//! labels each site by its caller, scales sampled stacks to their sites'
//! exact totals, folds caches, and says what dropped events left out.

use std::collections::HashMap;

use super::cgroups::cgroup_rows;
use super::processes::Owners;
use super::rows::{
    CacheRow, Lost, ProcRow, Report, RunInfo, Sampling, SiteRow, SourceTotals, StackRow, Totals,
};
use crate::cgroup::CgroupRef;
use crate::leaks::retention::{self, sort_by_retention, LeakSummary, Retention};
use crate::model::live::{Retained, RetainedIndex};
use crate::model::snapshot::{EventCounters, Snapshot};
use crate::model::{AllocStats, CacheId, Counts, SiteKey, Source};
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

    let mut stacks = stack_rows(snap, &frames_of, estimated, ret);
    let mut sites = site_rows(snap, &symbolized.call_sites, &frames_of, ret);
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
            let cgroup_id = snap.proc_cgroups.get(&pid).copied();
            ProcRow {
                pid,
                comm: comm.clone(),
                cgroup: cgroup_id.map(CgroupRef::unnamed),
                cgroup_id,
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
                (true, Some(exact), Some(sum)) => retention::scale_retained_to(&mine, sum, exact),
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

/// The label of each call site: the call site itself, unless that is an
/// allocation wrapper (kvmalloc, kmemdup…), in which case the heaviest
/// sampled stack of the site names the caller. Returns (label, call site).
fn label_sites<'a>(
    snap: &Snapshot,
    call_sites: &HashMap<u64, Frame>,
    frames_of: &dyn Fn(i64) -> &'a [Frame],
) -> HashMap<(u64, Source), (Frame, Frame)> {
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

/// Every (site, cache) pair with its label, for consumers that keep caches
/// apart (the slab report).
pub fn labelled_sites(snap: &Snapshot, syms: &dyn Symbolize) -> Vec<(Frame, SiteKey, AllocStats)> {
    let symbolized = symbolize_all(snap, syms);
    let frames_of = |id: i64| symbolized.stacks.get(&id).map(Vec::as_slice).unwrap_or(&[]);
    let labels = label_sites(snap, &symbolized.call_sites, &frames_of);
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
fn site_rows<'a>(
    snap: &Snapshot,
    call_sites: &HashMap<u64, Frame>,
    frames_of: &dyn Fn(i64) -> &'a [Frame],
    retained: RetainedRef,
) -> Vec<SiteRow> {
    let labels = label_sites(snap, call_sites, frames_of);
    let mut by_site: HashMap<(u64, Source), (AllocStats, Vec<String>, Retained)> = HashMap::new();
    for (key, s) in &snap.sites {
        let e = by_site
            .entry((key.call_site, key.cache.source()))
            .or_default();
        e.0 += *s;
        if let Some(r) = retained.and_then(|(idx, _)| idx.sites.get(key)) {
            e.2 += *r;
        }
        let name = key.cache.name();
        if !e.1.contains(&name) {
            e.1.push(name);
        }
    }
    let mut rows: Vec<SiteRow> = by_site
        .into_iter()
        .map(|((addr, source), (stats, mut caches, ret))| {
            caches.sort();
            let (label, cs) = &labels[&(addr, source)];
            SiteRow {
                source,
                function: label.name().to_string(),
                location: label.display(),
                call_site: cs.display(),
                caches,
                counts: (&stats).into(),
                retention: retained.map(|(_, d)| Retention::new(&ret, d)),
            }
        })
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.counts.bytes_alloc));
    rows
}

fn is_wrapper(f: &Frame) -> bool {
    f.function.is_none() || crate::symbolize::is_allocator_frame(f.name())
}

fn cache_rows(snap: &Snapshot, retained: RetainedRef) -> Vec<CacheRow> {
    let by_cache_retained = retained.map(|(idx, d)| (idx.by_cache(), d));
    let retention = |cache: &CacheId| {
        by_cache_retained
            .as_ref()
            .map(|(m, d)| Retention::new(&m.get(cache).copied().unwrap_or_default(), *d))
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
mod tests {
    use super::*;
    use crate::cgroup::CgroupNames;
    use crate::model::Owner;
    use crate::report::fixtures::*;
    use crate::report::meminfo::{Geometry, SourceOutstanding};
    use crate::testing::assert_keys;

    #[test]
    fn accounting_leaves_out_what_meminfo_lines_do_not_count() {
        let row = |source, cache: &str, count, bytes, req, elsewhere| CacheRow {
            source,
            name: cache.to_string(),
            counted_elsewhere: elsewhere,
            retention: Some(Retention {
                outstanding_count: count,
                outstanding_bytes: bytes,
                outstanding_bytes_req: req,
                ..Default::default()
            }),
            ..Default::default()
        };
        let report = Report {
            caches: vec![
                // two vmalloc areas of 3 pages and a guard page each
                row(Source::Vmalloc, "vmalloc", 2, 8 * 4096, 8 * 4096, false),
                row(Source::Vmalloc, "vmap", 1, 5 * 4096, 5 * 4096, false),
                // 100 bytes on 2 CPUs, and 200 bytes of obj_cgroup pointers
                row(Source::Percpu, "percpu", 1, 400, 100, false),
                row(Source::Kmalloc, "kmalloc-64", 3, 192, 150, false),
                // the vmalloc areas' pages: vmalloc's, not the page source's
                row(Source::Page, "pages-order0-vmalloc", 6, 6 * 4096, 0, true),
                row(Source::Page, "pages-order0", 1, 4096, 4096, false),
            ],
            ..Default::default()
        };
        let by = report.outstanding_by_source(Geometry {
            page_size: 4096,
            possible_cpus: 2,
        });
        let held = |bytes, excluded| SourceOutstanding {
            bytes,
            excluded,
            ..Default::default()
        };
        assert_eq!(by[&Source::Vmalloc], held(13 * 4096, 7 * 4096));
        assert_eq!(by[&Source::Percpu], held(400, 200));
        assert_eq!(by[&Source::Kmalloc], held(192, 0));
        // The pages behind the vmalloc areas are apart: the page row adds
        // them back to compare every page with the free pages' drop.
        let page = SourceOutstanding {
            counted_elsewhere: 6 * 4096,
            ..held(4096, 0)
        };
        assert_eq!(by[&Source::Page], page);
    }

    #[test]
    fn stack_rows_split_by_process_and_add_up_when_scaled() {
        let mut r = build(&owned_snapshot(), &fixture_symbols(), opts(10));
        let mut names = CgroupNames::new(None);
        names.insert(42, "/system.slice/msgd.service".into());
        r.name_cgroups(&mut names);
        let msg = r.stacks.iter().find(|s| s.function == "load_msg").unwrap();
        // Sampled 1 in 10: the stack is scaled to the site's 1000, and its
        // processes' shares with it, adding up exactly.
        assert_eq!(msg.counts.count, 1000);
        let p = &msg.processes;
        let got: Vec<_> = p.iter().map(|p| (p.pid, p.count, p.bytes_alloc)).collect();
        assert_eq!(
            got,
            [
                (Some(7), 600, 600 * 4096),
                (Some(8), 300, 300 * 4096),
                (None, 100, 100 * 4096)
            ]
        );
        assert_eq!(
            p.iter().map(|p| p.bytes_req).sum::<u64>(),
            msg.counts.bytes_req
        );
        assert_eq!(p[0].comm.as_deref(), Some("msgd"));
        assert_eq!(
            p[0].cgroup.as_ref().unwrap().path.as_deref(),
            Some("/system.slice/msgd.service")
        );
        // Not walked for: the id, no path.
        assert_eq!(
            p[1].cgroup.as_ref().map(|c| (c.id, c.path.clone())),
            Some((43, None))
        );
        assert!(p[2].interrupt && p[2].comm.is_none() && p[2].cgroup.is_none());
        // Stacks without owners (as top's) have none in JSON either.
        let v = serde_json::to_value(&r).unwrap();
        let rows = v["stacks"].as_array().unwrap();
        let json_msg = rows.iter().find(|s| s["function"] == "load_msg").unwrap();
        #[rustfmt::skip]
        assert_keys(&json_msg["processes"][0], "stack processes", &[
            "pid", "comm", "cgroup", "interrupt", "count", "bytes_req", "bytes_alloc",
        ]);
        assert!(json_msg["processes"][0].get("outstanding_count").is_none());
        assert!(rows.iter().any(|s| s.get("processes").is_none()));
        let back: Report = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(&back).unwrap(), v);
    }

    #[test]
    fn leaks_stack_processes_hold_their_outstanding_share() {
        let mut snap = leak_snapshot(1);
        let (msg, _) = msg_and_kv();
        let owner = Owner::Process {
            tgid: 7,
            cgroup: 42,
        };
        snap.stack_owners
            .insert((msg, 1), HashMap::from([(owner, stats(100, 2148, 4096))]));
        let r = build(&snap, &fixture_symbols(), opts(10));
        let st = r.stacks.iter().find(|s| s.function == "load_msg").unwrap();
        let p = &st.processes;
        assert_eq!(p.len(), 1, "{p:?}");
        // 40 live objects with this stack, scaled to the site's 400, all
        // process 7's (its name read by leaks from /proc).
        assert_eq!(
            (p[0].pid, p[0].comm.as_deref(), p[0].count),
            (Some(7), Some("msgd"), 1000)
        );
        assert_eq!(
            (p[0].outstanding_count, p[0].outstanding_bytes),
            (Some(400), Some(400 * 4096))
        );
        let ret = st.retention.as_ref().unwrap();
        assert_eq!(ret.outstanding_count, 400);
    }

    #[test]
    fn leaks_rows_carry_outstanding_ages_and_transient_volume() {
        let r = build(&leak_snapshot(1), &fixture_symbols(), opts(10));
        assert_eq!(r.sites[0].function, "load_msg", "largest outstanding first");
        let msg = r.sites[0].retention.as_ref().unwrap();
        assert_eq!(
            (msg.outstanding_count, msg.outstanding_bytes),
            (400, 400 * 4096)
        );
        assert_eq!(msg.outstanding_bytes_req, 400 * 2148);
        assert_eq!((msg.freed_count, msg.freed_bytes), (600, 600 * 4096));
        assert_eq!(msg.oldest_s, 1.5);
        assert_eq!(msg.growth_bytes_per_s, 400.0 * 4096.0 / 2.0);
        assert_eq!(msg.ages.len(), 1);
        assert_eq!((msg.ages[0].lo_s, msg.ages[0].count), (1.024, 400));
        let kv = r.sites[1].retention.as_ref().unwrap();
        assert_eq!(
            (kv.outstanding_count, kv.freed_unseen, kv.freed_count),
            (20, 5, 275)
        );

        // 40 of the 400 live load_msg objects had a stack: scaled to 400.
        let st = r.stacks.iter().find(|s| s.function == "load_msg").unwrap();
        let ret = st.retention.as_ref().unwrap();
        assert_eq!(ret.outstanding_count, 400);
        assert_eq!(ret.freed_count, 1000 - 400);

        let c = r.caches[0].retention.as_ref().unwrap();
        assert_eq!(c.outstanding_count, 420);
        let l = r.leaks.as_ref().unwrap();
        assert_eq!(l.retention.outstanding_count, 420);
        assert_eq!(l.frees_untracked, 123);
        assert_eq!(r.totals.frees, 123 + 600 + 275, "untracked + tracked frees");
        assert_eq!(l.recursion_misses, 3);
        assert!(!l.estimated);
        let v = serde_json::to_value(&r).unwrap();
        #[rustfmt::skip]
        let keys = ["outstanding_count", "outstanding_bytes", "ages", "count", "bytes_alloc"];
        for rows in ["sites", "stacks", "caches"] {
            assert_keys(&v[rows][0], rows, &keys);
        }
        let back: Report = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(&back).unwrap(), v);
    }

    #[test]
    fn leaks_cgroup_rows_hold_what_each_cgroup_allocated_and_name_processes() {
        let mut r = build(&leak_snapshot(1), &fixture_symbols(), opts(10));
        let mut names = CgroupNames::new(None);
        names.insert(42, "/system.slice/msgd.service".into());
        r.name_cgroups(&mut names);
        let svc = r.cgroups.iter().find(|c| !c.interrupt).unwrap();
        assert_eq!(
            svc.cgroup.as_ref().unwrap().path.as_deref(),
            Some("/system.slice/msgd.service")
        );
        let ret = svc.retention.as_ref().unwrap();
        assert_eq!((ret.outstanding_count, ret.freed_count), (400, 600));
        assert_eq!(ret.outstanding_bytes, 400 * 4096);
        let split = svc.outstanding_accounting.unwrap();
        assert_eq!(split.outstanding_accounted_count, 400);
        assert_eq!(split.outstanding_accounted_bytes, 400 * 4096);
        assert_eq!(split.outstanding_unaccounted_count, 0);
        assert_eq!(svc.accounting.accounted_count, 1000);

        let irq = r.cgroups.iter().find(|c| c.interrupt).unwrap();
        assert!(irq.cgroup.is_none());
        let ret = irq.retention.as_ref().unwrap();
        assert_eq!((ret.outstanding_count, ret.freed_count), (20, 280));
        let split = irq.outstanding_accounting.unwrap();
        assert_eq!(split.outstanding_unaccounted_bytes, 20 * 4096);
        assert_eq!(split.outstanding_accounted_count, 0);

        // Process 7's newest object is an interrupt one (no cgroup): its
        // cgroup is that of its newest object that has one.
        let p = &r.leaks.as_ref().unwrap().processes[0];
        assert_eq!(
            p.cgroup
                .as_ref()
                .and_then(|c| c.container.as_ref())
                .map(|c| c.name.as_str()),
            Some("msgd.service")
        );
        let v = serde_json::to_value(&r).unwrap();
        let keys = [
            "outstanding_count",
            "outstanding_accounted_bytes",
            "accounted_bytes",
        ];
        assert_keys(&v["cgroups"][0], "cgroups", &keys);
        // Ids are carried by the named cgroups in JSON.
        let back: Report = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(&back).unwrap(), v);
    }

    #[test]
    fn address_sampling_scales_everything_and_says_so() {
        let r = build(&leak_snapshot(4), &fixture_symbols(), opts(10));
        let l = r.leaks.as_ref().unwrap();
        assert!(l.estimated);
        assert_eq!(l.retention.outstanding_count, 4 * 420);
        assert_eq!(l.frees_untracked, 4 * 123);
        let msg = r.sites[0].retention.as_ref().unwrap();
        assert_eq!(msg.outstanding_count, 1600);
        assert_eq!(msg.freed_count, 2400);
        assert_eq!(r.sites[0].counts.count, 4000);
    }

    #[test]
    fn min_age_leaves_young_objects_out() {
        let mut snap = leak_snapshot(1);
        snap.leaks.as_mut().unwrap().min_age_ns = 1_000_000_000;
        let r = build(&snap, &fixture_symbols(), opts(10));
        assert_eq!(r.leaks.as_ref().unwrap().retention.outstanding_count, 400);
        assert_eq!(r.leaks.as_ref().unwrap().min_age_s, 1.0);
    }

    #[test]
    fn record_reports_have_no_retention() {
        let r = build(&sample_snapshot(), &fixture_symbols(), opts(10));
        assert!(r.leaks.is_none() && r.sites.iter().all(|s| s.retention.is_none()));
        let v = serde_json::to_value(&r).unwrap();
        assert!(v.get("leaks").is_none());
        assert!(v["sites"][0].get("outstanding_count").is_none());
    }

    fn opts(every: u32) -> BuildOptions {
        BuildOptions {
            stack_sample_every: every,
            duration_s: 2.0,
            run: RunInfo::default(),
        }
    }

    #[test]
    fn dropped_events_make_the_report_say_what_is_incomplete() {
        let r = build(&sample_snapshot(), &fixture_symbols(), opts(10));
        assert!(r.sampling.sites_exact && r.sampling.processes_exact);
        assert!(r.sampling.incomplete.is_empty());
        assert!(!crate::render::header(&r).contains("INCOMPLETE"));

        let mut snap = sample_snapshot();
        snap.events.map_full_sites = 1249;
        snap.events.map_full_procs = 3;
        let r = build(&snap, &fixture_symbols(), opts(10));
        assert!(!r.sampling.sites_exact);
        assert!(!r.sampling.processes_exact);
        assert_eq!(
            r.sampling.incomplete.len(),
            2,
            "{:?}",
            r.sampling.incomplete
        );
        assert!(r.sampling.incomplete[0].starts_with("1249 allocations not counted"));
        let h = crate::render::header(&r);
        assert!(h.starts_with("INCOMPLETE: 1249 allocations"), "{h}");
        assert!(h.contains("are NOT exact"), "{h}");
        assert!(!h.contains("are exact"), "{h}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["sampling"]["sites_exact"], false);
        assert_eq!(json["sampling"]["incomplete"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn sites_are_exact_and_labelled_by_caller() {
        let r = build(&sample_snapshot(), &fixture_symbols(), opts(10));
        assert_eq!(r.totals.allocs, 1300);
        assert_eq!(r.totals.bytes_alloc, 1300 * 4096);
        assert_eq!(r.sites[0].function, "load_msg");
        assert_eq!(r.sites[0].location, "load_msg+0x10");
        assert_eq!(r.sites[0].counts.count, 1000);
        assert_eq!(r.sites[0].counts.waste_bytes, 1000 * (4096 - 2148));
        assert_eq!(r.sites[0].caches, vec!["kmalloc-cg-4k"]);
        // The kvmalloc call site is named after its heaviest caller.
        assert_eq!(r.sites[1].function, "simple_xattr_alloc");
        assert_eq!(r.sites[1].call_site, "__kvmalloc_node_noprof+0x10");
        assert_eq!(r.lost.stacks, 2);
    }

    #[test]
    fn sampled_stacks_scale_to_site_totals() {
        let r = build(&sample_snapshot(), &fixture_symbols(), opts(10));
        assert!(r.sampling.stacks_estimated);
        let kv: Vec<&StackRow> = r
            .stacks
            .iter()
            .filter(|s| s.cache == "kmalloc-cg-4k")
            .collect();
        assert_eq!(kv.len(), 3);
        let msg = r.stacks.iter().find(|s| s.function == "load_msg").unwrap();
        assert_eq!(msg.counts.count, 1000);
        assert!(msg.estimated);
        assert_eq!(
            msg.frames[0], "__kmalloc_noprof+0x10",
            "tracing frames dropped"
        );
        let xattr = r
            .stacks
            .iter()
            .find(|s| s.function == "simple_xattr_alloc")
            .unwrap();
        let copy = r
            .stacks
            .iter()
            .find(|s| s.function == "setxattr_copy")
            .unwrap();
        assert_eq!(xattr.counts.count + copy.counts.count, 300);
        assert_eq!(xattr.counts.count, 200);
    }

    #[test]
    fn exact_mode_does_not_scale() {
        let r = build(&sample_snapshot(), &fixture_symbols(), opts(1));
        let msg = r.stacks.iter().find(|s| s.function == "load_msg").unwrap();
        assert_eq!(msg.counts.count, 100);
        assert!(!msg.estimated);
    }

    #[test]
    fn caches_fold_sites_and_frees() {
        let r = build(&sample_snapshot(), &fixture_symbols(), opts(10));
        assert_eq!(r.caches.len(), 1);
        assert_eq!(r.caches[0].name, "kmalloc-cg-4k");
        assert_eq!(r.caches[0].counts.count, 1300);
        assert_eq!(r.caches[0].frees, 700);
    }

    #[test]
    fn json_has_the_documented_fields() {
        let r = build(&sample_snapshot(), &fixture_symbols(), opts(10));
        let v = serde_json::to_value(&r).unwrap();
        #[rustfmt::skip]
        assert_keys(&v, "the report", &[
            "duration_s", "totals", "lost", "sampling", "sites", "stacks", "caches",
        ]);
        let totals = ["count", "frees", "bytes_req", "bytes_alloc", "waste_bytes"];
        assert_keys(&v["totals"], "totals", &totals);
        assert!(v["lost"]["stacks"].is_u64() && v["lost"]["map_full"].is_u64());
        let site = &v["sites"][0];
        let counts = ["count", "bytes_req", "bytes_alloc"];
        assert_keys(site, "sites[]", &["function", "hist"]);
        assert_keys(site, "sites[]", &counts);
        assert_eq!(site["hist"][0]["lo"], 2048);
        assert_eq!(site["hist"][0]["hi"], 4096);
        assert_eq!(site["hist"][0]["count"], 1000);
        let stack = &v["stacks"][0];
        assert_keys(stack, "stacks[]", &["frames", "estimated", "hist"]);
        assert_keys(stack, "stacks[]", &counts);
        assert_keys(&v["caches"][0], "caches[]", &["name"]);
        assert_keys(&v["caches"][0], "caches[]", &counts);
        let back: Report = serde_json::from_value(v).unwrap();
        assert_eq!(back.sites[0].counts.count, 1000);
    }
}
