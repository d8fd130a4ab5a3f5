//! Advice derived from the numbers, each hint carrying the figures that back
//! it. Rules look at per-site requested-size histograms and counts, per-cache
//! traced totals, and (for growth) samples of the static state over time.
//! Thresholds are deliberately conservative: a hint should be worth reading.

use std::collections::HashMap;

use serde::Serialize;

pub use self::evidence::{CacheKind, Evidence, SizedBy, Sizes, Spread};
use super::traced::{TracedCache, TracedSite};
use crate::model::slab_loss::{align8, per_second, right_size};
use crate::model::{
    human_count, human_size, kmalloc_size_name, pct, AllocStats, CacheId, Hist,
    KMALLOC_MAX_CACHE_SIZE,
};

pub mod evidence;

/// kmalloc size classes on x86_64 SLUB (KMALLOC_MIN_SIZE 8).
pub const KMALLOC_SIZES: [u64; 13] = [
    8, 16, 32, 64, 96, 128, 192, 256, 512, 1024, 2048, 4096, 8192,
];

/// Fewer allocations than this are not a pattern.
pub const MIN_COUNT: u64 = 100;
/// Right-sizing hints below this saving are noise.
pub const MIN_SAVING_BYTES: u64 = 64 << 10;
/// Share of a site's requests that must fall in one log2 bucket to call it
/// a cluster.
pub const CLUSTER_SHARE: f64 = 0.8;
/// "Just above" a boundary: within this fraction of the gap to the next class.
pub const JUST_ABOVE_FRACTION: f64 = 0.25;
/// Rounding waste below this percentage is not worth a dedicated cache.
pub const MIN_WASTE_PCT: f64 = 20.0;
/// Each of the two modes of a bimodal site holds at least this share...
pub const MODE_SHARE: f64 = 0.2;
/// ...and together at least this share.
pub const MODES_TOGETHER: f64 = 0.7;
/// Small allocations: mean request at most this...
pub const POOL_MAX_SIZE: u64 = 256;
/// ...at at least this many per second.
pub const POOL_MIN_RATE: f64 = 10_000.0;
/// Large allocations: mean request at least this...
pub const LARGE_MIN_SIZE: u64 = 4096;
/// ...at at least this many per second.
pub const LARGE_MIN_RATE: f64 = 1_000.0;
/// Rounding hints for sizes the caller sets (a bucket cache, sizes that
/// vary): at least this many allocations per second, or a held saving of
/// `MIN_SAVING_BYTES`.
pub const ROUNDING_MIN_RATE: f64 = 1_000.0;
/// Growth below this is not reported.
pub const MIN_GROWTH_BYTES: u64 = 1 << 20;
/// Steady growth needs at least this many samples.
pub const MIN_SERIES_POINTS: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HintKind {
    /// Requests cluster just above a kmalloc size class.
    Boundary,
    /// A large share of each object lost to rounding where the caller sets
    /// the size (a bucket cache, or sizes that vary): no dedicated cache
    /// fixes it, sizes that fit the class do.
    Rounding,
    /// One function requests two distinct sizes.
    Bimodal,
    /// Many small allocations at a high rate.
    Pooling,
    /// Large allocations at a high rate.
    LargeHot,
    /// A cache grew during the run.
    Growth,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Hint {
    pub kind: HintKind,
    /// The function, for site hints.
    pub site: Option<String>,
    /// The call site (`function+0xoff`), for site hints: what a site hint
    /// is about. Two calls in one function are two buffers.
    pub call_site: Option<String>,
    pub cache: String,
    /// Bytes the suggested change would save over the run; for growth
    /// hints, the bytes the cache grew by.
    pub saving_bytes: u64,
    /// What the hint stands on, for site hints.
    pub evidence: Option<Evidence>,
    pub text: String,
}

impl Hint {
    /// A hint about one call site, with what it stands on.
    /// (`text` first: it is written from the cache and evidence given
    /// after it.)
    fn at_site(
        kind: HintKind,
        site: &TracedSite,
        text: String,
        cache: String,
        saving_bytes: u64,
        evidence: Evidence,
    ) -> Hint {
        Hint {
            kind,
            site: Some(site.function.clone()),
            call_site: Some(site.call_site.clone()),
            cache,
            saving_bytes,
            evidence: Some(evidence),
            text,
        }
    }
}

/// What every site hint reads besides its site: the run's length, every
/// traced site (a call site's other caches, summed once in `spreads`),
/// the caches' object sizes.
pub struct Run<'a> {
    pub duration_s: f64,
    pub sites: &'a [TracedSite],
    pub sizes: &'a dyn ObjectSizes,
    spreads: HashMap<&'a str, Spread>,
}

impl<'a> Run<'a> {
    pub fn new(duration_s: f64, sites: &'a [TracedSite], sizes: &'a dyn ObjectSizes) -> Run<'a> {
        Run {
            duration_s,
            sites,
            sizes,
            spreads: Spread::by_call_site(sites),
        }
    }

    fn evidence_of(&self, stats: &AllocStats, cache: &CacheId, call_site: &str) -> Evidence {
        Evidence::with_spread(stats, cache, self.spreads.get(call_site), self.duration_s)
    }

    fn evidence(&self, site: &TracedSite) -> Evidence {
        self.evidence_of(&site.stats, &site.cache, &site.call_site)
    }
}

/// Active objects of one cache at successive times (seconds).
#[derive(Clone, Debug, PartialEq)]
pub struct CacheSeries {
    pub cache: String,
    pub object_size: u64,
    pub points: Vec<(f64, u64)>,
}

/// Object size of a cache by name, for named caches (kmalloc sizes are in
/// the `CacheId`).
pub trait ObjectSizes {
    fn object_size(&self, cache: &str) -> Option<u64>;
}

impl<F: Fn(&str) -> Option<u64>> ObjectSizes for F {
    fn object_size(&self, cache: &str) -> Option<u64> {
        self(cache)
    }
}

/// All hints, biggest saving first.
pub fn all_hints(
    duration_s: f64,
    sites: &[TracedSite],
    caches: &[TracedCache],
    series: &[CacheSeries],
    sizes: &dyn ObjectSizes,
) -> Vec<Hint> {
    let run = Run::new(duration_s, sites, sizes);
    let mut hints: Vec<Hint> = Vec::new();
    for s in sites {
        let held = held_by_site(s, caches, series);
        let boundary = boundary_hint(&run, s, held);
        let rounding = boundary
            .is_none()
            .then(|| rounding_hint(&run, s, held))
            .flatten();
        // The rounding saving is claimed once per site: by the boundary or
        // the rounding hint, else by pooling or large_hot.
        let claimed = boundary.is_some() || rounding.is_some();
        hints.extend(boundary);
        hints.extend(rounding);
        hints.extend(pooling_hint(&run, s, held, claimed));
        hints.extend(large_hot_hint(&run, s, held, claimed));
    }
    hints.extend(bimodal_hints(&run));
    hints.extend(series.iter().filter_map(series_growth_hint));
    hints.extend(
        caches
            .iter()
            .filter(|c| !series.iter().any(|s| s.cache == c.name()))
            .filter_map(|c| traced_growth_hint(c, duration_s)),
    );
    hints.sort_by(|a, b| {
        b.saving_bytes
            .cmp(&a.saving_bytes)
            .then(a.kind.cmp(&b.kind))
            .then_with(|| a.call_site.cmp(&b.call_site))
            .then_with(|| a.cache.cmp(&b.cache))
    });
    hints
}

/// The size class of a cache every kmalloc() of the size shares: a
/// dedicated cache (named, or a bucket cache) already is what a hint would
/// propose.
fn kmalloc_size(cache: &CacheId) -> Option<u64> {
    cache.kmalloc_size_class()
}

fn object_size_of(cache: &CacheId, sizes: &dyn ObjectSizes) -> Option<u64> {
    match cache {
        CacheId::Kmalloc { size, .. } => Some(*size),
        CacheId::ObjectSize(s) => Some(*s),
        CacheId::Named(n) => sizes.object_size(n),
        // Not slab caches: no object size to hint about.
        CacheId::Pages { .. } | CacheId::Vmalloc { .. } | CacheId::Percpu => None,
    }
}

/// Share of the histogram in its fullest bucket, and that bucket.
fn peak(hist: &Hist) -> Option<(usize, f64)> {
    let total = hist.total();
    let (b, &n) = hist.0.iter().enumerate().max_by_key(|(_, &n)| n)?;
    (total > 0).then(|| (b, n as f64 / total as f64))
}

/// Objects a site held over the run: how far the cache's active objects
/// rose above where they were at the start (average and peak over its
/// samples), apportioned by the site's share of the cache's traced
/// allocations. Memory a change would save is memory not held: objects
/// that stay, not allocations churned (a message that lives microseconds
/// holds nothing, however many are sent; objects from before the run are
/// not counted).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Held {
    pub avg_objects: f64,
    pub peak_objects: f64,
}

impl Held {
    /// (average, peak) bytes not held if each object were `per_object`
    /// bytes smaller.
    pub fn saving(&self, per_object: u64) -> (u64, u64) {
        (
            (self.avg_objects * per_object as f64).round() as u64,
            (self.peak_objects * per_object as f64).round() as u64,
        )
    }
}

pub fn held_by_site(
    site: &TracedSite,
    caches: &[TracedCache],
    series: &[CacheSeries],
) -> Option<Held> {
    let name = site.cache.name();
    let points = &series.iter().find(|s| s.cache == name)?.points;
    let cache_allocs = caches
        .iter()
        .find(|c| c.name() == name)
        .map_or(0, |c| c.allocs);
    if points.is_empty() || cache_allocs == 0 {
        return None;
    }
    let share = (site.stats.count as f64 / cache_allocs as f64).min(1.0);
    let start = points[0].1;
    let above = |p: &(f64, u64)| p.1.saturating_sub(start) as f64;
    let avg = points.iter().map(above).sum::<f64>() / points.len() as f64;
    let peak = points.iter().map(above).fold(0.0, f64::max);
    Some(Held {
        avg_objects: avg * share,
        peak_objects: peak * share,
    })
}

/// "would hold 1.2M less on average (2.0M at peak; ~300 of its objects
/// live)", or, with no samples of the cache, what each object would save.
/// Below `MIN_SAVING_BYTES` (objects that do not stay, or no samples of
/// the cache, e.g. kmalloc buckets of their own) no saving is claimed: the
/// per-object figure is what is known.
fn held_words(held: Option<Held>, per_object: u64) -> (u64, String) {
    let per_live = || {
        format!(
            "{} less per object held (how much memory that saves depends on how many stay \
             allocated: the cache's samples showed too few to claim a saving; see kheap leaks)",
            human_size(per_object)
        )
    };
    match held {
        Some(h) if h.saving(per_object).0 >= MIN_SAVING_BYTES => {
            let (avg, peak) = h.saving(per_object);
            (
                avg,
                format!(
                    "{} less memory held on average ({} at peak; ~{:.0} of its objects held on average, \
                     from the cache's growth over the run and the site's share of its allocations)",
                    human_size(avg),
                    human_size(peak),
                    h.avg_objects
                ),
            )
        }
        _ => (0, per_live()),
    }
}

/// "over the 10.0 s run"; a run shorter than a second keeps two decimals
/// ("over the 0.08 s run", not 0.0 beside a rate).
fn run_words(duration_s: f64) -> String {
    match duration_s {
        d if d >= 1.0 => format!("over the {d:.1} s run"),
        d if d > 0.0 => format!("over the {d:.2} s run"),
        _ => "over the run".to_string(),
    }
}

/// The next kmalloc class below `size` and, where kheap can tell, the name
/// of its cache in `cache`'s family: `kmalloc-cg-2k` below
/// `kmalloc-cg-4k`, `msg_msg-1k` below `msg_msg-2k`. A family member is
/// named when /proc/slabinfo has it (bucket caches skip some classes);
/// a shared size class's family has every class, so it is named even
/// without the static read.
fn class_below(
    cache: &CacheId,
    size: u64,
    sizes: &dyn ObjectSizes,
) -> Option<(u64, Option<String>)> {
    let below: Vec<u64> = KMALLOC_SIZES
        .iter()
        .rev()
        .copied()
        .filter(|&k| k < size)
        .collect();
    let name = cache.name();
    let Some(prefix) = name.strip_suffix(&kmalloc_size_name(size)) else {
        return below.first().map(|&k| (k, None));
    };
    let sibling = |k: u64| format!("{prefix}{}", kmalloc_size_name(k));
    if let Some(&k) = below
        .iter()
        .find(|&&k| sizes.object_size(&sibling(k)) == Some(k))
    {
        return Some((k, Some(sibling(k))));
    }
    let &k = below.first()?;
    let shared = cache.kmalloc_size_class().is_some();
    Some((k, shared.then(|| sibling(k))))
}

/// "kmalloc-2k", or "the 2048-byte class" where the cache is not known.
fn class_words(size: u64, name: &Option<String>) -> String {
    name.clone()
        .unwrap_or_else(|| format!("the {size}-byte class"))
}

/// Requests clustering just above a kmalloc class, e.g. 2100 bytes landing
/// in kmalloc-4k: the cache rounds each up to almost twice the need.
pub fn boundary_hint(run: &Run, site: &TracedSite, held: Option<Held>) -> Option<Hint> {
    let s = &site.stats;
    let size = kmalloc_size(&site.cache).filter(|&z| z <= KMALLOC_MAX_CACHE_SIZE)?;
    let (prev, prev_name) = class_below(&site.cache, size, run.sizes)?;
    if s.count < MIN_COUNT {
        return None;
    }
    let avg = s.avg_req();
    let (peak_bucket, share) = peak(&s.hist)?;
    let (lo, hi) = Hist::bounds(peak_bucket);
    let avg_in_peak = (lo as f64) <= avg && avg < hi as f64;
    let just_above =
        avg > prev as f64 && avg - prev as f64 <= (size - prev) as f64 * JUST_ABOVE_FRACTION;
    let per_object = size.saturating_sub(right_size(s));
    let (saving, held_text) = held_words(held, per_object);
    if share < CLUSTER_SHARE || !avg_in_peak || !just_above || s.waste_pct() < MIN_WASTE_PCT {
        return None;
    }
    let cache = site.cache.name();
    let evidence = run.evidence(site);
    let prev_name = class_words(prev, &prev_name);
    let r = right_size(s);
    let change = match evidence.sized_by {
        SizedBy::Code => format!(
            "the code that sets it could trim it to at most {prev} B to fit {prev_name}, or give \
             it a dedicated {r}-byte cache, which would mean {held_text}"
        ),
        SizedBy::Caller => format!(
            "a dedicated {r}-byte cache for the common size would mean {held_text}; whoever \
             chooses the sizes could keep them to at most {prev} B, for {prev_name}"
        ),
    };
    Some(Hint::at_site(
        HintKind::Boundary,
        site,
        format!(
            "{cs} requests ~{avg:.0} B ({share:.0}% of its {n} allocations in {lo}-{hi} B), \
             just above {prev_name}, so {cache} wastes {w:.0}% of each object ({run}); {who}. \
             {change}",
            cs = site.call_site,
            share = share * 100.0,
            n = human_count(s.count),
            hi = hi - 1,
            w = s.waste_pct(),
            run = run_words(run.duration_s),
            who = evidence.who_sets_the_size(&cache),
            change = capitalized(&change),
        ),
        cache,
        saving,
        evidence,
    ))
}

fn capitalized(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// A large share of each object lost to rounding where the caller sets
/// the size: a bucket cache (the kernel keeps those for sizes user space
/// controls), or a size class whose requests vary. A dedicated cache fits
/// no caller-chosen size; whoever chooses the sizes can fit the class.
/// Needs `MIN_COUNT` allocations, `MIN_WASTE_PCT` of the allocated bytes
/// lost, and `ROUNDING_MIN_RATE` per second or a held saving of
/// `MIN_SAVING_BYTES`. The saving claimed is the rounding of the objects
/// held, as for a boundary hint.
pub fn rounding_hint(run: &Run, site: &TracedSite, held: Option<Held>) -> Option<Hint> {
    let s = &site.stats;
    let obj = site
        .cache
        .kmalloc_bucket()
        .or_else(|| site.cache.kmalloc_size_class())?;
    let evidence = run.evidence(site);
    if s.count < MIN_COUNT
        || evidence.sized_by != SizedBy::Caller
        || evidence.waste_pct < MIN_WASTE_PCT
    {
        return None;
    }
    let (saving, held_text) = held_words(held, obj.saturating_sub(right_size(s)));
    if evidence.alloc_rate < ROUNDING_MIN_RATE && saving < MIN_SAVING_BYTES {
        return None;
    }
    let cache = site.cache.name();
    let smaller = class_below(&site.cache, obj, run.sizes)
        .map(|(k, name)| {
            format!(
                ", and requests of at most {k} B would take {}",
                match name {
                    Some(n) => format!("{n}'s {k}-byte objects"),
                    None => format!("{k}-byte objects"),
                }
            )
        })
        .unwrap_or_default();
    let not_dedicated = match evidence.cache_kind {
        CacheKind::Bucket => "",
        _ => " (a dedicated cache fits no one size when sizes vary)",
    };
    let rate = if run.duration_s > 0.0 {
        format!(", {}/s", human_count(evidence.alloc_rate.round() as u64))
    } else {
        String::new()
    };
    Some(Hint::at_site(
        HintKind::Rounding,
        site,
        format!(
            "{cs} loses {w:.0}% of each object to rounding in {cache}: {n} requests of ~{avg:.0} B \
             in {obj}-byte objects {run}{rate}; {who}. Whoever chooses the sizes can fit the \
             class: a {obj}-byte object costs the same for any request up to {obj} B{smaller}\
             {not_dedicated}; sizes that fit would mean {held_text}",
            cs = site.call_site,
            w = evidence.waste_pct,
            n = human_count(s.count),
            avg = s.avg_req(),
            run = run_words(run.duration_s),
            who = evidence.who_sets_the_size(&cache),
        ),
        cache,
        saving,
        evidence,
    ))
}

/// The two fullest buckets of a histogram if they form two separate modes:
/// each holds `MODE_SHARE`, together `MODES_TOGETHER`, and at least one
/// bucket lies between them (sizes at least 2x apart). Lower bucket first.
pub fn two_modes(hist: &Hist) -> Option<(usize, usize)> {
    let total = hist.total();
    if total < MIN_COUNT {
        return None;
    }
    let mut order: Vec<usize> = (0..hist.0.len()).collect();
    order.sort_by(|&a, &b| hist.0[b].cmp(&hist.0[a]).then(a.cmp(&b)));
    let (a, b) = (order[0].min(order[1]), order[0].max(order[1]));
    let share = |i: usize| hist.0[i] as f64 / total as f64;
    (share(a) >= MODE_SHARE
        && share(b) >= MODE_SHARE
        && share(a) + share(b) >= MODES_TOGETHER
        && b - a >= 2)
        .then_some((a, b))
}

/// Call sites whose requests fall into two distinct sizes. A call site,
/// not a function: two calls in one function that ask for different sizes
/// are two buffers, each of one size. When the small requests are served
/// from objects sized for the large ones, the saving is what a cache sized
/// for the small mode would have spared:
/// `small_count * (object_size - upper bound of the small mode)`.
pub fn bimodal_hints(run: &Run) -> Vec<Hint> {
    let sites = run.sites;
    let mut call_sites: Vec<&str> = sites.iter().map(|s| s.call_site.as_str()).collect();
    call_sites.sort_unstable();
    call_sites.dedup();
    call_sites
        .into_iter()
        .filter_map(|cs| {
            let own: Vec<&TracedSite> = sites.iter().filter(|s| s.call_site == cs).collect();
            let mut merged = AllocStats::default();
            for s in &own {
                merged += s.stats;
            }
            let (small, large) = two_modes(&merged.hist)?;
            let (slo, shi) = Hist::bounds(small);
            let (llo, lhi) = Hist::bounds(large);
            let mut saving = 0;
            let mut padded_into: Option<(&CacheId, u64)> = None;
            for s in &own {
                let Some(obj) = object_size_of(&s.cache, run.sizes) else {
                    continue;
                };
                if s.stats.hist.0[small] > 0 && obj >= llo && obj > align8(shi) {
                    saving += s.stats.hist.0[small] * (obj - align8(shi));
                    padded_into.get_or_insert((&s.cache, obj));
                }
            }
            let busiest = own.iter().max_by_key(|s| s.stats.count)?;
            let total = merged.hist.total() as f64;
            let share = |b: usize| merged.hist.0[b] as f64 * 100.0 / total;
            let what = match &padded_into {
                Some((cache, obj)) => format!(
                    "the small ones are padded to {obj}-byte objects in {}: allocating them \
                     from a cache of at most {shi} B would save {}",
                    cache.name(),
                    human_size(saving)
                ),
                None => "they land in different caches; if one buffer size serves both paths, \
                         sizing each path separately keeps the small case small"
                    .to_string(),
            };
            let cache = padded_into.map_or(&busiest.cache, |(c, _)| c);
            Some(Hint {
                kind: HintKind::Bimodal,
                site: Some(busiest.function.clone()),
                call_site: Some(cs.to_string()),
                cache: cache.name(),
                saving_bytes: saving,
                evidence: Some(run.evidence_of(&merged, cache, cs)),
                text: format!(
                    "{cs} requests two distinct sizes: {:.0}% in {slo}-{} B and {:.0}% in {llo}-{} B; {what}",
                    share(small),
                    shi - 1,
                    share(large),
                    lhi.saturating_sub(1),
                ),
            })
        })
        .collect()
}

/// Many small allocations at a high rate: a pooling candidate. `claimed`:
/// a boundary or rounding hint of the site already claims its rounding
/// saving, so savings never add up twice.
pub fn pooling_hint(
    run: &Run,
    site: &TracedSite,
    held: Option<Held>,
    claimed: bool,
) -> Option<Hint> {
    let s = &site.stats;
    let rate = per_second(s.count, run.duration_s);
    let avg = s.avg_req();
    if s.count < MIN_COUNT || rate < POOL_MIN_RATE || avg > POOL_MAX_SIZE as f64 {
        return None;
    }
    let claim = kmalloc_size(&site.cache)
        .filter(|_| !claimed)
        .zip(held)
        .map(|(size, h)| held_words(Some(h), size.saturating_sub(right_size(s))));
    let (saving, extra) = match claim {
        Some((saving, words)) if saving >= MIN_SAVING_BYTES => (
            saving,
            format!(", and a right-sized cache would also mean {words}"),
        ),
        _ => (0, String::new()),
    };
    let cache = site.cache.name();
    Some(Hint::at_site(
        HintKind::Pooling,
        site,
        format!(
            "{cs} makes {r}/s allocations of ~{avg:.0} B from {cache} ({n} {run}); at that rate \
             a per-CPU pool or object reuse would save allocator work{extra}",
            cs = site.call_site,
            r = human_count(rate.round() as u64),
            n = human_count(s.count),
            run = run_words(run.duration_s),
        ),
        cache,
        saving,
        run.evidence(site),
    ))
}

/// Large allocations at a high rate: each is an expensive multi-page
/// allocation (above 8 KiB, straight from the page allocator). `claimed`
/// as for `pooling_hint`.
pub fn large_hot_hint(
    run: &Run,
    site: &TracedSite,
    held: Option<Held>,
    claimed: bool,
) -> Option<Hint> {
    let s = &site.stats;
    let rate = per_second(s.count, run.duration_s);
    let avg = s.avg_req();
    if s.count < MIN_COUNT || rate < LARGE_MIN_RATE || avg < LARGE_MIN_SIZE as f64 {
        return None;
    }
    let cache = site.cache.name();
    // What rounding costs in memory held (not in bytes churned).
    let saving = match (kmalloc_size(&site.cache).filter(|_| !claimed), held) {
        (Some(size), Some(h)) => h.saving(size.saturating_sub(right_size(s))).0,
        _ => 0,
    };
    Some(Hint::at_site(
        HintKind::LargeHot,
        site,
        format!(
            "{cs} allocates ~{a} {r}/s from {cache} ({w:.0}% rounding waste, {n} {run}); in a \
             hot path, reuse a buffer or keep a small pool instead of allocating each time",
            cs = site.call_site,
            a = human_size(avg.round() as u64),
            r = human_count(rate.round() as u64),
            w = s.waste_pct(),
            n = human_count(s.count),
            run = run_words(run.duration_s),
        ),
        cache,
        saving,
        run.evidence(site),
    ))
}

/// A cache whose active objects never went down across the samples and
/// grew by at least `MIN_GROWTH_BYTES`.
pub fn series_growth_hint(series: &CacheSeries) -> Option<Hint> {
    let p = &series.points;
    if p.len() < MIN_SERIES_POINTS {
        return None;
    }
    let steady = p.windows(2).all(|w| w[1].1 >= w[0].1);
    let (t0, first) = p[0];
    let (t1, last) = p[p.len() - 1];
    let grown = last.saturating_sub(first);
    let bytes = grown * series.object_size;
    if !steady || bytes < MIN_GROWTH_BYTES {
        return None;
    }
    let secs = t1 - t0;
    Some(Hint {
        kind: HintKind::Growth,
        site: None,
        call_site: None,
        cache: series.cache.clone(),
        saving_bytes: bytes,
        evidence: None,
        text: format!(
            "{c} grew in every one of {k} intervals: +{o} objects (+{b}) in {secs:.1} s, {rate}/s; \
             if it never levels off, something allocates from it without freeing",
            c = series.cache,
            k = p.len() - 1,
            o = human_count(grown),
            b = human_size(bytes),
            rate = human_size(per_second(bytes, secs).round() as u64),
        ),
    })
}

/// Net growth seen by tracing (allocations minus frees), when no samples
/// say whether it was steady.
pub fn traced_growth_hint(cache: &TracedCache, duration_s: f64) -> Option<Hint> {
    let bytes = u64::try_from(cache.net_bytes()).ok()?;
    if cache.allocs < MIN_COUNT || bytes < MIN_GROWTH_BYTES {
        return None;
    }
    let name = cache.name();
    Some(Hint {
        kind: HintKind::Growth,
        site: None,
        call_site: None,
        evidence: None,
        text: format!(
            "{name}: {a} allocations but {fr} frees {run} ({p:.0}% freed), net +{b}; if this \
             keeps up, something allocates from it without freeing",
            a = human_count(cache.allocs),
            fr = human_count(cache.frees),
            run = run_words(duration_s),
            p = pct(cache.frees, cache.allocs),
            b = human_size(bytes),
        ),
        cache: name,
        saving_bytes: bytes,
    })
}

#[cfg(test)]
mod tests;
