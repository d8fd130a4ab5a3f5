//! The `kheap slab` report: one row per cache, static figures joined with
//! traced ones by cache name, sorted and cut, plus hints.

use std::collections::BTreeMap;

use serde::Serialize;

use super::hints::{all_hints, CacheSeries, Hint};
use super::snapshot::{StaticCache, StaticSnapshot};
use super::traced::{TracedCache, TracedRun, TracedSite};
use super::watch::{diff, CacheDelta};
use crate::model::live::Outstanding;
use crate::model::slab_loss::per_second;
use crate::report::top_n;

/// Sites listed per cache.
pub const TOP_SITES: usize = 5;

/// The order of the rows: `cmd::slab::SortArg` (`--sort`) says what each
/// key sorts by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortKey {
    #[default]
    Size,
    Objs,
    Waste,
    Growth,
    Rate,
}

/// One of the sites a cache row names: the largest wasters, or with
/// `--sort growth` the sites still holding the most of what they allocated
/// during the run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TopSite {
    pub function: String,
    /// Allocations: `count`, as in every kind.
    #[serde(rename = "count")]
    pub allocs: u64,
    pub waste_bytes: u64,
    /// Objects it allocated during the run and still held at the end
    /// (null unless every object was tracked: `--sort growth`).
    pub held_objs: Option<u64>,
    pub held_bytes: Option<u64>,
}

/// Traced figures of one cache.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TracedFigures {
    pub allocs: u64,
    pub frees: u64,
    pub bytes_req: u64,
    pub bytes_alloc: u64,
    pub waste_bytes: u64,
    pub alloc_rate: f64,
    pub free_rate: f64,
    /// Allocations minus frees; with every object tracked, what the run
    /// allocated and still holds (`held_*`, exact).
    pub net_objs: i64,
    pub net_bytes: i64,
    /// What the run allocated and still holds at its end, when every
    /// object was tracked (`--sort growth`).
    pub held_objs: Option<u64>,
    pub held_bytes: Option<u64>,
    pub top_sites: Vec<TopSite>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CacheRow {
    pub name: String,
    /// `None` for a traced cache missing from `/proc/slabinfo`: large
    /// kmalloc (page allocator), or a cache destroyed during the run.
    pub stat: Option<StaticCache>,
    pub traced: Option<TracedFigures>,
    /// Change since the first read, when there were two.
    pub growth: Option<CacheDelta>,
}

impl CacheRow {
    /// Growth in bytes, what `--sort growth` sorts by and the table's
    /// growth column shows: traced net growth when traced (with every
    /// object tracked, the bytes the run allocated and still holds), else
    /// the change in slab memory between reads.
    pub fn growth_bytes(&self) -> i64 {
        match (&self.traced, &self.growth) {
            (Some(t), _) => t.net_bytes,
            (None, Some(g)) => g.delta_memory(),
            (None, None) => 0,
        }
    }

    fn sort_value(&self, key: SortKey) -> i128 {
        let stat = |f: fn(&StaticCache) -> u64| self.stat.as_ref().map_or(0, f) as i128;
        match key {
            SortKey::Size => stat(|c| c.memory_bytes),
            SortKey::Objs => stat(|c| c.active_objs),
            SortKey::Waste => match &self.traced {
                Some(t) => t.waste_bytes as i128,
                None => stat(|c| c.loss_bytes),
            },
            SortKey::Growth => self.growth_bytes() as i128,
            SortKey::Rate => self.traced.as_ref().map_or(0, |t| t.allocs) as i128,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct SlabReport {
    pub duration_s: Option<f64>,
    pub sysfs: bool,
    /// Slab memory over all caches, before cutting to `rows`.
    pub total_memory: u64,
    pub caches: Vec<CacheRow>,
    /// Cache rows cut by `rows`.
    pub hidden: usize,
    pub hints: Vec<Hint>,
    pub notes: Vec<String>,
}

/// Everything a report is made from; only `after` is required.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReportInput<'a> {
    /// The static read at the start of the run, for growth.
    pub before: Option<&'a StaticSnapshot>,
    /// The static read at the end (or the only one).
    pub after: Option<&'a StaticSnapshot>,
    pub traced: Option<&'a TracedRun>,
    /// Samples taken during the run, for steady-growth hints.
    pub series: &'a [CacheSeries],
}

impl<'a> ReportInput<'a> {
    /// The input of a report on one static read.
    pub fn of(after: &'a StaticSnapshot) -> ReportInput<'a> {
        ReportInput {
            after: Some(after),
            ..Default::default()
        }
    }
}

pub fn build_report(input: ReportInput, sort: SortKey, rows: usize) -> SlabReport {
    let empty = StaticSnapshot::default();
    let after = input.after.unwrap_or(&empty);
    let mut notes = after.notes.clone();
    let deltas: BTreeMap<String, CacheDelta> = input
        .before
        .map(|b| {
            diff(b, after)
                .into_iter()
                .map(|d| (d.name.clone(), d))
                .collect()
        })
        .unwrap_or_default();

    let mut caches: Vec<CacheRow> = after
        .caches
        .iter()
        .map(|c| CacheRow {
            name: c.name.clone(),
            stat: Some(c.clone()),
            traced: None,
            growth: deltas.get(&c.name).cloned(),
        })
        .collect();
    // Caches that vanished during the run still get a row, with no static data.
    for d in deltas.values().filter(|d| after.get(&d.name).is_none()) {
        caches.push(CacheRow {
            name: d.name.clone(),
            stat: None,
            traced: None,
            growth: Some(d.clone()),
        });
    }

    if let Some(run) = input.traced {
        join_traced(&mut caches, after, run, &mut notes);
        notes.extend(run.skipped.iter().cloned());
        if run.objects_tracked {
            notes.push(
                "every object was tracked: growth is what the run allocated and still held at \
                 its end, exact per site; free/s counts the frees of those objects only"
                    .into(),
            );
        }
    }

    if input.traced.is_none() && sort == SortKey::Rate {
        notes.push("--sort rate needs traced data; sorted by size instead".into());
    }
    let effective = match (sort, input.traced) {
        (SortKey::Rate, None) => SortKey::Size,
        (s, _) => s,
    };
    caches.sort_by(|a, b| {
        b.sort_value(effective)
            .cmp(&a.sort_value(effective))
            .then_with(|| a.name.cmp(&b.name))
    });
    let hidden = top_n::keep(&mut caches, Some(rows));

    let hints = match input.traced {
        Some(run) => {
            let sizes = |name: &str| after.find(name).map(|c| c.object_size);
            all_hints(
                run.duration_s,
                &run.sites,
                &run.caches,
                input.series,
                &sizes,
            )
        }
        None => all_hints(0.0, &[], &[], input.series, &|_: &str| None),
    };

    SlabReport {
        duration_s: input.traced.map(|r| r.duration_s),
        sysfs: after.sysfs,
        total_memory: after.total_memory(),
        caches,
        hidden,
        hints,
        notes,
    }
}

/// Joins traced caches to rows by `/proc/slabinfo` name (or merged alias).
/// Every row gets traced figures, zero when nothing was seen, so that sort
/// keys compare like with like; traced caches without a row get their own.
fn join_traced(
    caches: &mut Vec<CacheRow>,
    after: &StaticSnapshot,
    run: &TracedRun,
    notes: &mut Vec<String>,
) {
    let mut by_row: BTreeMap<String, Vec<&TracedCache>> = BTreeMap::new();
    for t in &run.caches {
        let name = t.name();
        let row = after.find(&name).map_or(name, |c| c.name.clone());
        by_row.entry(row).or_default().push(t);
    }
    let missing: Vec<String> = by_row
        .keys()
        .filter(|name| !caches.iter().any(|c| &c.name == *name))
        .cloned()
        .collect();
    let unmatched = missing.len();
    caches.extend(missing.into_iter().map(|name| CacheRow {
        name,
        stat: None,
        traced: None,
        growth: None,
    }));
    if unmatched > 0 {
        notes.push(format!(
            "{unmatched} traced cache(s) are not in /proc/slabinfo (large kmalloc served by the \
             page allocator, or caches destroyed during the run)"
        ));
    }
    for row in caches.iter_mut() {
        let traced = by_row.get(&row.name).map(Vec::as_slice).unwrap_or(&[]);
        row.traced = Some(figures(&row.name, traced, run, after));
    }
}

/// The traced figures of row `row`. Its sites are the largest wasters, or,
/// with every object tracked (`--sort growth`), those still holding the
/// most of what they allocated (sites that hold nothing are not growing
/// and are not named).
fn figures(
    row: &str,
    traced: &[&TracedCache],
    run: &TracedRun,
    after: &StaticSnapshot,
) -> TracedFigures {
    let sum = |f: fn(&TracedCache) -> u64| traced.iter().map(|t| f(t)).sum::<u64>();
    let (allocs, frees) = (sum(|t| t.allocs), sum(|t| t.frees));
    let (bytes_req, bytes_alloc) = (sum(|t| t.bytes_req), sum(|t| t.bytes_alloc));
    let own: Vec<&TracedSite> = run
        .sites
        .iter()
        .filter(|s| {
            let name = s.cache.name();
            name == row || after.find(&name).is_some_and(|c| c.name == row)
        })
        .collect();
    let held = run.objects_tracked.then(|| {
        let mut h = Outstanding::default();
        for s in &own {
            h += s.held.unwrap_or_default();
        }
        h
    });
    let mut sites: Vec<TopSite> = own
        .iter()
        .map(|s| TopSite {
            function: s.function.clone(),
            allocs: s.stats.count,
            waste_bytes: s.stats.waste(),
            held_objs: held.map(|_| s.held.unwrap_or_default().objects),
            held_bytes: held.map(|_| s.held.unwrap_or_default().bytes_alloc),
        })
        .collect();
    if held.is_some() {
        sites.retain(|s| s.held_bytes.unwrap_or(0) > 0);
        sites.sort_by(|a, b| {
            b.held_bytes
                .cmp(&a.held_bytes)
                .then_with(|| a.function.cmp(&b.function))
        });
    } else {
        sites.sort_by(|a, b| {
            b.waste_bytes
                .cmp(&a.waste_bytes)
                .then_with(|| a.function.cmp(&b.function))
        });
    }
    sites.truncate(TOP_SITES);
    let (net_objs, net_bytes) = match held {
        Some(h) => (h.objects as i64, h.bytes_alloc as i64),
        None => (
            traced.iter().map(|t| t.net_objs()).sum(),
            traced.iter().map(|t| t.net_bytes()).sum(),
        ),
    };
    TracedFigures {
        allocs,
        frees,
        bytes_req,
        bytes_alloc,
        waste_bytes: bytes_alloc.saturating_sub(bytes_req),
        alloc_rate: per_second(allocs, run.duration_s),
        free_rate: per_second(frees, run.duration_s),
        net_objs,
        net_bytes,
        held_objs: held.map(|h| h.objects),
        held_bytes: held.map(|h| h.bytes_alloc),
        top_sites: sites,
    }
}

#[cfg(test)]
pub mod tests {
    use super::super::snapshot::build_static;
    use super::super::traced::TracedSite;
    use super::*;
    use crate::model::{AllocStats, CacheId, Hist};
    use crate::sys::slabinfo::parse_slabinfo;
    use crate::testing::kmalloc;

    const FIXTURE: &str = include_str!("../../tests/fixtures/slabinfo-6.18.txt");

    /// The report with every row.
    fn every_row(input: ReportInput, sort: SortKey) -> SlabReport {
        build_report(input, sort, usize::MAX)
    }

    /// The static read of a 6.18 machine's /proc/slabinfo.
    pub fn fixture() -> StaticSnapshot {
        build_static(parse_slabinfo(FIXTURE).unwrap(), None, 4096)
    }

    fn sample_run() -> TracedRun {
        let (k4, big) = (kmalloc(4096), kmalloc(32768));
        let mut c4 = TracedCache::new(k4.clone());
        c4.allocs = 10_000;
        c4.frees = 9_000;
        c4.bytes_req = 10_000 * 2100;
        c4.bytes_alloc = 10_000 * 4096;
        let mut cbig = TracedCache::new(big.clone());
        cbig.allocs = 10;
        cbig.bytes_req = 10 * 30000;
        cbig.bytes_alloc = 10 * 32768;
        let mut hist = Hist::default();
        hist.0[Hist::bucket_of(2100)] = 9_000;
        TracedRun {
            duration_s: 10.0,
            caches: vec![c4, cbig],
            sites: vec![
                TracedSite {
                    function: "nvme_setup_cmd".into(),
                    call_site: "nvme_setup_cmd+0x1a".into(),
                    cache: k4.clone(),
                    stats: AllocStats {
                        count: 9_000,
                        bytes_req: 9_000 * 2100,
                        bytes_alloc: 9_000 * 4096,
                        hist,
                    },
                    held: None,
                },
                TracedSite {
                    function: "other".into(),
                    call_site: "other+0x2b".into(),
                    cache: k4,
                    stats: AllocStats {
                        count: 1_000,
                        bytes_req: 1_000 * 4000,
                        bytes_alloc: 1_000 * 4096,
                        ..Default::default()
                    },
                    held: None,
                },
            ],
            skipped: vec![],
            objects_tracked: false,
        }
    }

    fn site(function: &str, cache: CacheId, count: u64, req: u64, held: u64) -> TracedSite {
        let obj = cache.kmalloc_size_class().unwrap();
        TracedSite {
            function: function.into(),
            call_site: format!("{function}+0x10"),
            cache,
            stats: AllocStats {
                count,
                bytes_req: count * req,
                bytes_alloc: count * obj,
                ..Default::default()
            },
            held: Some(Outstanding {
                objects: held,
                bytes_alloc: held * obj,
            }),
        }
    }

    /// A run with every object tracked (`--sort growth`): in kmalloc-4k a
    /// churning site that wastes the most and holds nothing at the end,
    /// and a growing one that holds 300 objects; in kmalloc-64 a site
    /// holding 20. Each cache's frees are those of its run's objects.
    pub fn tracked_run() -> TracedRun {
        let (k4, k64) = (kmalloc(4096), kmalloc(64));
        let sites = vec![
            site("churn", k4.clone(), 10_000, 2100, 0),
            site("grow", k4.clone(), 300, 4000, 300),
            site("small_grow", k64.clone(), 50, 40, 20),
        ];
        let caches = [k4, k64]
            .into_iter()
            .map(|k| {
                let mut c = TracedCache::new(k.clone());
                for s in sites.iter().filter(|s| s.cache == k) {
                    c.allocs += s.stats.count;
                    c.bytes_req += s.stats.bytes_req;
                    c.bytes_alloc += s.stats.bytes_alloc;
                    c.frees += s.stats.count - s.held.unwrap().objects;
                }
                c
            })
            .collect();
        TracedRun {
            duration_s: 10.0,
            caches,
            sites,
            skipped: vec![],
            objects_tracked: true,
        }
    }

    /// Issue 46: `--sort growth` names the site that grows, not the one
    /// that wastes the most, and sorts caches by the growth it shows.
    #[test]
    fn growth_names_the_growing_site_and_sorts_by_what_it_shows() {
        let snap = fixture();
        let run = tracked_run();
        let r = every_row(
            ReportInput {
                traced: Some(&run),
                ..ReportInput::of(&snap)
            },
            SortKey::Growth,
        );
        let k4 = &r.caches[0];
        assert_eq!(k4.name, "kmalloc-4k");
        let t = k4.traced.as_ref().unwrap();
        assert_eq!((t.held_objs, t.held_bytes), (Some(300), Some(300 * 4096)));
        assert_eq!((t.net_objs, t.net_bytes), (300, 300 * 4096));
        assert_eq!(k4.growth_bytes(), 300 * 4096);
        assert_eq!((t.allocs, t.frees), (10_300, 10_000));
        // Only the growing site: the churner holds nothing.
        let named: Vec<(&str, Option<u64>, Option<u64>)> = t
            .top_sites
            .iter()
            .map(|s| (s.function.as_str(), s.held_objs, s.held_bytes))
            .collect();
        assert_eq!(named, [("grow", Some(300), Some(300 * 4096))]);
        assert_eq!(t.top_sites[0].waste_bytes, 300 * 96);
        let k64 = &r.caches[1];
        assert_eq!(
            (k64.name.as_str(), k64.growth_bytes()),
            ("kmalloc-64", 20 * 64)
        );
        assert_eq!(
            k64.traced.as_ref().unwrap().top_sites[0].function,
            "small_grow"
        );
        // The rest grew by nothing and follow by name; every row holds
        // held_* (zero where nothing was traced), and the sort key is the
        // growth each row shows.
        assert!(r.caches[2..].iter().all(|c| c.growth_bytes() == 0));
        assert!(r.caches.windows(2).all(|w| {
            let (a, b) = (w[0].growth_bytes(), w[1].growth_bytes());
            a > b || (a == b && w[0].name < w[1].name)
        }));
        let dentry = r.caches.iter().find(|c| c.name == "dentry").unwrap();
        let dt = dentry.traced.as_ref().unwrap();
        assert_eq!((dt.held_objs, dt.top_sites.len()), (Some(0), 0));
        assert!(r
            .notes
            .iter()
            .any(|n| n.contains("every object was tracked")));
        // Without tracking, the same sites are the wasters, churner first.
        let counted = TracedRun {
            objects_tracked: false,
            ..tracked_run()
        };
        let r = every_row(
            ReportInput {
                traced: Some(&counted),
                ..ReportInput::of(&snap)
            },
            SortKey::Waste,
        );
        let t = r.caches[0].traced.as_ref().unwrap();
        assert_eq!(t.top_sites[0].function, "churn");
        assert_eq!((t.held_objs, t.top_sites[0].held_objs), (None, None));
    }

    /// Untraced growth sorts by the change between reads: growth first,
    /// largest first, unchanged caches by name, shrinking ones last.
    #[test]
    fn growth_between_reads_sorts_largest_first_and_shrinks_last() {
        let before = fixture();
        let mut after = before.clone();
        let mut grow = |name: &str, by: i64| {
            let c = after.caches.iter_mut().find(|c| c.name == name).unwrap();
            c.memory_bytes = (c.memory_bytes as i64 + by) as u64;
        };
        grow("dentry", 4096);
        grow("kmalloc-64", 1 << 20);
        grow("kmalloc-4k", -8192);
        let r = every_row(
            ReportInput {
                before: Some(&before),
                ..ReportInput::of(&after)
            },
            SortKey::Growth,
        );
        let names: Vec<&str> = r.caches.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names[..2], ["kmalloc-64", "dentry"]);
        assert_eq!(names.last(), Some(&"kmalloc-4k"));
        assert_eq!(r.caches.last().unwrap().growth_bytes(), -8192);
        let zeros: Vec<&str> = names[2..names.len() - 1].to_vec();
        let mut sorted = zeros.clone();
        sorted.sort();
        assert_eq!(zeros, sorted);
        assert!(r.caches[2..names.len() - 1]
            .iter()
            .all(|c| c.growth_bytes() == 0));
    }

    #[test]
    fn what_the_tracer_skipped_is_in_the_notes() {
        let snap = fixture();
        let why = "kfree: frees counted in the totals only, not per cache (no kfunc)";
        let run = TracedRun {
            skipped: vec![why.into()],
            ..sample_run()
        };
        let r = every_row(
            ReportInput {
                traced: Some(&run),
                ..ReportInput::of(&snap)
            },
            SortKey::Waste,
        );
        assert!(r.notes.iter().any(|n| n == why), "{:?}", r.notes);
    }

    #[test]
    fn static_report_sorts_and_cuts() {
        let snap = fixture();
        let r = build_report(ReportInput::of(&snap), SortKey::Size, 5);
        assert_eq!(r.caches.len(), 5);
        assert_eq!(r.hidden, snap.caches.len() - 5);
        let mem: Vec<u64> = r
            .caches
            .iter()
            .map(|c| c.stat.as_ref().unwrap().memory_bytes)
            .collect();
        assert!(mem.windows(2).all(|w| w[0] >= w[1]));
        assert!(r.hints.is_empty());
        assert_eq!(r.total_memory, snap.total_memory());
        let r = build_report(ReportInput::of(&snap), SortKey::Rate, 5);
        assert!(r.notes.iter().any(|n| n.contains("sorted by size")));
    }

    #[test]
    fn traced_caches_join_rows_by_slabinfo_name() {
        let snap = fixture();
        let run = sample_run();
        let r = every_row(
            ReportInput {
                traced: Some(&run),
                ..ReportInput::of(&snap)
            },
            SortKey::Waste,
        );
        let k4 = &r.caches[0];
        assert_eq!(k4.name, "kmalloc-4k");
        assert!(k4.stat.is_some());
        let t = k4.traced.as_ref().unwrap();
        assert_eq!((t.allocs, t.frees), (10_000, 9_000));
        assert_eq!(t.waste_bytes, 10_000 * 1996);
        assert_eq!(t.alloc_rate, 1000.0);
        assert_eq!(t.net_objs, 1000);
        assert_eq!(t.top_sites[0].function, "nvme_setup_cmd");
        assert_eq!(t.top_sites[0].waste_bytes, 9_000 * 1996);
        // The large kmalloc has no slabinfo row but keeps its traced data.
        let big = r
            .caches
            .iter()
            .find(|c| c.name == "kmalloc-large-32.0K")
            .unwrap();
        assert!(big.stat.is_none());
        assert_eq!(big.traced.as_ref().unwrap().allocs, 10);
        assert!(r.notes.iter().any(|n| n.contains("not in /proc/slabinfo")));
        // Untraced caches read as zero, not unknown.
        let dentry = r.caches.iter().find(|c| c.name == "dentry").unwrap();
        assert_eq!(dentry.traced.as_ref().unwrap().allocs, 0);
        assert_eq!(r.hints[0].cache, "kmalloc-4k");
        assert_eq!(r.duration_s, Some(10.0));
    }

    #[test]
    fn growth_between_reads_includes_vanished_caches() {
        let before = fixture();
        let mut after = before.clone();
        after.caches.retain(|c| c.name != "kmalloc-4k");
        let dentry = after
            .caches
            .iter_mut()
            .find(|c| c.name == "dentry")
            .unwrap();
        dentry.memory_bytes += 1 << 20;
        let r = every_row(
            ReportInput {
                before: Some(&before),
                ..ReportInput::of(&after)
            },
            SortKey::Growth,
        );
        assert_eq!(r.caches[0].name, "dentry");
        assert_eq!(r.caches[0].growth_bytes(), 1 << 20);
        let gone = r.caches.iter().find(|c| c.name == "kmalloc-4k").unwrap();
        assert!(gone.stat.is_none());
        assert!(gone.growth_bytes() < 0);
        assert_eq!(r.caches.last().unwrap().name, "kmalloc-4k");
    }
}
