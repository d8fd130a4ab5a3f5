//! The daemon's cumulative metric state: per-interval deltas in, counters
//! that only ever grow out. Pure.
//!
//! Caches are few (a few hundred at most), so every cache has its own
//! series. Sites are many, so at most N label sets have their own series
//! and everything else is summed into `site="other"`:
//! - a label set is ranked by its allocated bytes, decayed each interval
//!   (recent activity counts most), and the N best have their own series;
//! - each interval's delta goes to the series the label set has *then*: a
//!   set that falls out of the top N stops being exported (its series ends
//!   where it stood, never lower) and its later counts go to `other` from
//!   then on; counted once, never moved after the fact;
//! - a set that comes back continues from where its counter stood, so no
//!   series ever goes backwards while the daemon runs. Sets idle for a long
//!   time are forgotten (memory stays flat); one that recurs after that is a
//!   new series starting from zero, which Prometheus treats like a restart.
//!
//! Cgroups (`--by-cgroup`) are ranked the same way ([`Ranked`]), capped by
//! `--cgroups N`.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::model::{AllocStats, Hist, Source};

/// The labels a site series may carry, chosen with `--labels`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SiteLabel {
    /// The allocating function (the call site, symbolized).
    Site,
    /// The slab cache.
    Cache,
}

impl SiteLabel {
    pub fn name(self) -> &'static str {
        match self {
            SiteLabel::Site => "site",
            SiteLabel::Cache => "cache",
        }
    }

    /// Parses `site,cache` (any order, no repeats, at least one).
    pub fn parse_list(s: &str) -> Result<Vec<SiteLabel>, String> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim) {
            let l = match part {
                "site" => SiteLabel::Site,
                "cache" => SiteLabel::Cache,
                other => {
                    return Err(format!(
                        "unknown label {other:?}: choose from site, cache (stacks are never labels)"
                    ))
                }
            };
            if out.contains(&l) {
                return Err(format!("label {part:?} given twice"));
            }
            out.push(l);
        }
        out.sort();
        Ok(out)
    }
}

/// One site delta of an interval: its function and cache names, and the
/// allocator (`--source`) the cache belongs to.
#[derive(Clone, Debug)]
pub struct SiteDelta {
    pub site: String,
    pub cache: String,
    pub source: Source,
    /// Pages that back another source (`CacheId::counted_elsewhere`).
    pub counted_elsewhere: bool,
    pub stats: AllocStats,
}

/// Cumulative counters of one series.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SeriesCounters {
    pub allocations: u64,
    pub bytes_req: u64,
    pub bytes_alloc: u64,
}

impl SeriesCounters {
    pub fn add(&mut self, s: &AllocStats) {
        self.allocations += s.count;
        self.bytes_req += s.bytes_req;
        self.bytes_alloc += s.bytes_alloc;
    }
    /// Bytes lost to slab rounding (allocated minus requested).
    pub fn waste(&self) -> u64 {
        self.bytes_alloc.saturating_sub(self.bytes_req)
    }
}

/// Cumulative counters of one cache, with its size histogram and frees.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounters {
    pub counters: SeriesCounters,
    pub frees: u64,
    /// Requested sizes (log2 buckets, see `Hist`).
    pub hist: Hist,
}

/// Cumulative counters of one source (`--source`): every allocation it
/// saw, its frees, and the bytes of pages that back another source (also
/// counted by that source, so left out of a sum over sources).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceCounters {
    pub counters: SeriesCounters,
    pub frees: u64,
    pub counted_elsewhere_bytes: u64,
}

/// Label values of one site series, in the order of the chosen labels.
pub type LabelValues = Vec<String>;

/// The label values of the series that sums everything outside the top N.
pub const OTHER: &str = "other";

#[derive(Clone, Debug, Default)]
struct SiteState {
    counters: SeriesCounters,
    /// Allocated bytes, decayed per interval: the ranking.
    score: f64,
    /// Intervals since the last event.
    idle: u32,
}

/// Each interval, scores are multiplied by this before the interval's bytes
/// are added: activity 20 intervals old weighs about a tenth.
const DECAY: f64 = 0.9;

/// A label set that is not exported and saw nothing for this many intervals
/// is forgotten.
pub const FORGET_AFTER: u32 = 600;

/// Series of many possible label sets, at most N of them exported (the
/// best-ranked) and everything else summed into one series whose label
/// values are all `other`. Sites use it, and so do cgroups (`--by-cgroup`).
#[derive(Clone, Debug)]
pub struct Ranked {
    max: usize,
    sets: HashMap<LabelValues, SiteState>,
    /// The label sets with their own series now.
    members: HashSet<LabelValues>,
    other: SeriesCounters,
}

impl Ranked {
    pub fn new(max: usize) -> Ranked {
        Ranked {
            max,
            sets: HashMap::new(),
            members: HashSet::new(),
            other: SeriesCounters::default(),
        }
    }

    /// A new N takes effect at the next interval's ranking (SIGHUP).
    pub fn set_max(&mut self, n: usize) {
        self.max = n;
    }

    /// Adds one interval's deltas, one per label set (summed by the caller).
    pub fn add_interval(&mut self, by_values: HashMap<LabelValues, AllocStats>) {
        for s in self.sets.values_mut() {
            s.score *= DECAY;
            s.idle = s.idle.saturating_add(1);
        }
        for (v, stats) in &by_values {
            let s = self.sets.entry(v.clone()).or_default();
            s.score += stats.bytes_alloc as f64;
            s.idle = 0;
        }
        self.rank();
        for (v, stats) in by_values {
            if self.members.contains(&v) {
                self.sets.get_mut(&v).unwrap().counters.add(&stats);
            } else {
                self.other.add(&stats);
            }
        }
        let members = &self.members;
        self.sets
            .retain(|v, s| members.contains(v) || s.idle < FORGET_AFTER);
    }

    /// Picks the N best-scored label sets (ties by label values, so the
    /// choice is stable).
    fn rank(&mut self) {
        let mut all: Vec<(&LabelValues, f64)> =
            self.sets.iter().map(|(v, s)| (v, s.score)).collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        self.members = all
            .into_iter()
            .take(self.max)
            .map(|(v, _)| v.clone())
            .collect();
    }

    /// The exported series (label values, counters), sorted, then `other`
    /// (its `labels` label values all `other`).
    pub fn series(&self, labels: usize) -> Vec<(LabelValues, SeriesCounters)> {
        let mut out: Vec<(LabelValues, SeriesCounters)> = self
            .members
            .iter()
            .map(|v| (v.clone(), self.sets[v].counters))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out.push((vec![OTHER.to_string(); labels], self.other));
        out
    }

    /// Whether a label set has its own series now.
    pub fn is_member(&self, v: &LabelValues) -> bool {
        self.members.contains(v)
    }

    /// Label sets remembered (exported or not): what memory grows with.
    pub fn remembered(&self) -> usize {
        self.sets.len()
    }

    /// Forgets the label sets `gone` picks (processes that exited): their
    /// series are no longer exported, and what they counted stays theirs
    /// (nothing moves to `other`). Returns how many were forgotten.
    pub fn retire(&mut self, gone: &dyn Fn(&LabelValues) -> bool) -> usize {
        let before = self.sets.len();
        self.sets.retain(|v, _| !gone(v));
        self.members.retain(|v| !gone(v));
        before - self.sets.len()
    }
}

/// Everything the daemon accumulates from interval deltas.
#[derive(Clone, Debug)]
pub struct SeriesState {
    labels: Vec<SiteLabel>,
    caches: BTreeMap<String, CacheCounters>,
    sources: BTreeMap<Source, SourceCounters>,
    sites: Ranked,
}

impl SeriesState {
    pub fn new(labels: Vec<SiteLabel>, max_sites: usize) -> SeriesState {
        SeriesState {
            labels,
            caches: BTreeMap::new(),
            sources: BTreeMap::new(),
            sites: Ranked::new(max_sites),
        }
    }

    pub fn labels(&self) -> &[SiteLabel] {
        &self.labels
    }

    /// A new N takes effect at the next interval's ranking (SIGHUP).
    pub fn set_max_sites(&mut self, n: usize) {
        self.sites.set_max(n);
    }

    /// Adds one interval: its site deltas and its frees per cache.
    pub fn add_interval(&mut self, sites: &[SiteDelta], cache_frees: &[(String, u64)]) {
        for d in sites {
            let c = self.caches.entry(d.cache.clone()).or_default();
            c.counters.add(&d.stats);
            c.hist += d.stats.hist;
            let s = self.sources.entry(d.source).or_default();
            s.counters.add(&d.stats);
            if d.counted_elsewhere {
                s.counted_elsewhere_bytes += d.stats.bytes_alloc;
            }
        }
        for (cache, frees) in cache_frees {
            self.caches.entry(cache.clone()).or_default().frees += frees;
        }

        // Several kernel sites can share one label set (two call sites in
        // one function, or labels without the site): summed first.
        let mut by_values: HashMap<LabelValues, AllocStats> = HashMap::new();
        for d in sites {
            *by_values
                .entry(self.values_of(&d.site, &d.cache))
                .or_default() += d.stats;
        }
        self.sites.add_interval(by_values);
    }

    pub fn caches(&self) -> &BTreeMap<String, CacheCounters> {
        &self.caches
    }

    /// Adds one interval's frees per source. A traced source has a series
    /// from its first interval on, events or not.
    pub fn add_source_frees(&mut self, frees: &[(Source, u64)]) {
        for &(source, n) in frees {
            self.sources.entry(source).or_default().frees += n;
        }
    }

    pub fn sources(&self) -> &BTreeMap<Source, SourceCounters> {
        &self.sources
    }

    /// The exported site series (label values, counters), sorted, then
    /// `other` (all its label values `other`).
    pub fn site_series(&self) -> Vec<(LabelValues, SeriesCounters)> {
        self.sites.series(self.labels.len())
    }

    /// Whether a label set has its own series now.
    pub fn is_member(&self, v: &LabelValues) -> bool {
        self.sites.is_member(v)
    }

    /// The label values a site has under the chosen labels.
    pub fn values_of(&self, site: &str, cache: &str) -> LabelValues {
        self.labels
            .iter()
            .map(|l| match l {
                SiteLabel::Site => site.to_string(),
                SiteLabel::Cache => cache.to_string(),
            })
            .collect()
    }

    /// Label sets remembered (exported or not): what memory grows with.
    pub fn remembered(&self) -> usize {
        self.sites.remembered()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(site: &str, cache: &str, count: u64, size: u64) -> SiteDelta {
        let mut hist = Hist::default();
        hist.0[Hist::bucket_of(size)] = count;
        SiteDelta {
            site: site.into(),
            cache: cache.into(),
            source: Source::Kmalloc,
            counted_elsewhere: false,
            stats: AllocStats {
                count,
                bytes_req: count * size,
                bytes_alloc: count * size.next_power_of_two(),
                hist,
            },
        }
    }

    fn both() -> Vec<SiteLabel> {
        vec![SiteLabel::Site, SiteLabel::Cache]
    }

    fn series(s: &SeriesState) -> HashMap<LabelValues, u64> {
        s.site_series()
            .into_iter()
            .map(|(v, c)| (v, c.allocations))
            .collect()
    }

    fn v(a: &str, b: &str) -> LabelValues {
        vec![a.to_string(), b.to_string()]
    }

    #[test]
    fn labels_parse_and_refuse_unknowns() {
        assert_eq!(SiteLabel::parse_list("cache,site").unwrap(), both());
        assert_eq!(
            SiteLabel::parse_list("cache").unwrap(),
            vec![SiteLabel::Cache]
        );
        assert!(SiteLabel::parse_list("stack")
            .unwrap_err()
            .contains("never"));
        assert!(SiteLabel::parse_list("site,site").is_err());
    }

    #[test]
    fn caches_sum_every_site_and_count_frees() {
        let mut s = SeriesState::new(both(), 1);
        s.add_interval(
            &[
                delta("a", "kmalloc-64", 10, 40),
                delta("b", "kmalloc-64", 5, 60),
            ],
            &[("kmalloc-64".into(), 7)],
        );
        let c = s.caches()["kmalloc-64"];
        assert_eq!(c.counters.allocations, 15);
        assert_eq!(c.counters.bytes_req, 400 + 300);
        assert_eq!(c.counters.waste(), 15 * 64 - 700);
        assert_eq!(c.frees, 7);
        assert_eq!(c.hist.total(), 15);
    }

    #[test]
    fn the_top_n_have_series_and_other_gets_the_rest() {
        let mut s = SeriesState::new(both(), 2);
        s.add_interval(
            &[
                delta("big", "c", 100, 100),
                delta("mid", "c", 50, 100),
                delta("small", "c", 1, 100),
            ],
            &[],
        );
        let m = series(&s);
        assert_eq!(m.len(), 3, "two sites and other: {m:?}");
        assert_eq!(m[&v("big", "c")], 100);
        assert_eq!(m[&v("mid", "c")], 50);
        assert_eq!(m[&v("other", "other")], 1);
        // Totals match the unbounded totals.
        assert_eq!(m.values().sum::<u64>(), 151);
    }

    #[test]
    fn a_site_that_falls_out_keeps_its_count_and_other_only_grows() {
        let mut s = SeriesState::new(both(), 1);
        s.add_interval(&[delta("a", "c", 10, 64)], &[]);
        assert_eq!(series(&s)[&v("a", "c")], 10);
        // b overtakes a: from now on a's events go to other.
        s.add_interval(&[delta("b", "c", 1000, 64), delta("a", "c", 3, 64)], &[]);
        let m = series(&s);
        assert_eq!(m[&v("b", "c")], 1000);
        assert!(!m.contains_key(&v("a", "c")), "a is no longer exported");
        assert_eq!(m[&v("other", "other")], 3, "only a's new events");
        // a comes back on top: continues from 10, never lower.
        for _ in 0..3 {
            s.add_interval(&[delta("a", "c", 100_000, 64)], &[]);
        }
        let m = series(&s);
        assert_eq!(m[&v("a", "c")], 10 + 300_000);
        assert_eq!(m[&v("other", "other")], 3, "b had nothing new to move");
    }

    #[test]
    fn sites_sharing_label_values_are_summed() {
        let mut s = SeriesState::new(vec![SiteLabel::Cache], 10);
        s.add_interval(&[delta("a", "c", 2, 8), delta("b", "c", 3, 8)], &[]);
        let m = series(&s);
        assert_eq!(m[&vec!["c".to_string()]], 5);
        assert_eq!(m[&vec!["other".to_string()]], 0);
    }

    #[test]
    fn idle_label_sets_are_forgotten() {
        let mut s = SeriesState::new(both(), 1);
        s.add_interval(&[delta("a", "c", 1, 8), delta("b", "c", 1, 16)], &[]);
        assert_eq!(s.remembered(), 2);
        for _ in 0..FORGET_AFTER {
            s.add_interval(&[], &[]);
        }
        assert_eq!(
            s.remembered(),
            1,
            "the member stays, the idle outsider goes"
        );
    }
}
