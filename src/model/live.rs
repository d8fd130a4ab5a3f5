//! Pure retention maths: live objects read from the kernel, folded per site,
//! stack and cache, with age histograms. No libbpf here, so it is
//! unit-tested without root.

use std::collections::{BTreeMap, HashMap};
use std::ops::AddAssign;

use serde::{Deserialize, Serialize};

use crate::model::{AllocStats, CacheId, CgroupKey, CgroupSlot, Owner, SiteKey};

/// One object allocated while tracing and not seen freed (yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveObject {
    pub site: SiteKey,
    /// Allocation stack, if one was captured for it.
    pub stack_id: Option<i64>,
    pub bytes_req: u64,
    pub bytes_alloc: u64,
    /// Time since the allocation when the snapshot was read.
    pub age_ns: u64,
    pub tgid: u32,
    /// The allocating task's cgroup (or interrupt context), and whether the
    /// object is charged to its memory cgroup (known with --by cgroup).
    pub cgroup: CgroupKey,
    /// The cache its code asked for, where SLUB merged that cache into the
    /// one `site` names and the object proved which (a socket's protocol:
    /// kernel::kmem's `asked`); `None` when not known.
    pub asked_cache: Option<String>,
}

impl LiveObject {
    /// The process that made it; `None` in interrupt context, which is
    /// no process's.
    pub fn process(&self) -> Option<u32> {
        match self.cgroup.slot {
            CgroupSlot::Interrupt => None,
            CgroupSlot::Cgroup(_) => Some(self.tgid),
        }
    }

    /// Who made it, as its stack entry is keyed: interrupt context, or its
    /// process in its cgroup.
    pub fn owner(&self) -> Owner {
        match self.cgroup.slot {
            CgroupSlot::Interrupt => Owner::Interrupt,
            CgroupSlot::Cgroup(cgroup) => Owner::Process {
                tgid: self.tgid,
                cgroup,
            },
        }
    }
}

/// Ticks to nanoseconds at `hz` ticks per second.
pub fn jiffies_to_ns(ticks: u64, hz: u64) -> u64 {
    (ticks as u128 * 1_000_000_000 / hz.max(1) as u128) as u64
}

/// The kernel tick rate closest to `ticks` counted over `ns` (Linux offers
/// 100, 250, 300 and 1000).
pub fn nearest_hz(ticks: u64, ns: u64) -> u64 {
    let measured = ticks as f64 * 1e9 / ns.max(1) as f64;
    [100u64, 250, 300, 1000]
        .into_iter()
        .min_by(|a, b| {
            (*a as f64 - measured)
                .abs()
                .total_cmp(&(*b as f64 - measured).abs())
        })
        .unwrap_or(250)
}

/// Age buckets: bucket 0 holds ages under 1 ms; bucket `b >= 1` holds
/// `[2^(b-1), 2^b)` ms (the last one everything older, ~12 days and up).
pub const AGE_BUCKETS: usize = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgeHist {
    pub count: [u64; AGE_BUCKETS],
    pub bytes: [u64; AGE_BUCKETS],
    /// Σ bytes·age and Σ bytes·age² of each bucket, ages in whole ms
    /// (u128: 2^40 bytes held for 2^27 ms, squared, still fit): what a
    /// growth slope over any run needs (`Retained::growth_bytes_per_s`).
    pub bytes_ms: [u128; AGE_BUCKETS],
    pub bytes_ms2: [u128; AGE_BUCKETS],
}

impl Default for AgeHist {
    fn default() -> Self {
        AgeHist {
            count: [0; AGE_BUCKETS],
            bytes: [0; AGE_BUCKETS],
            bytes_ms: [0; AGE_BUCKETS],
            bytes_ms2: [0; AGE_BUCKETS],
        }
    }
}

/// One non-empty age bucket as reported: `lo_s <= age < hi_s`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgeBucket {
    pub lo_s: f64,
    pub hi_s: f64,
    pub count: u64,
    pub bytes: u64,
}

impl AgeHist {
    pub fn bucket_of(age_ns: u64) -> usize {
        let ms = age_ns / 1_000_000;
        if ms == 0 {
            return 0;
        }
        ((64 - ms.leading_zeros()) as usize).min(AGE_BUCKETS - 1)
    }

    /// `[lo, hi)` of bucket `b` in seconds; the last bucket's `hi` is
    /// infinite, reported as `f64::MAX`.
    pub fn bounds_s(b: usize) -> (f64, f64) {
        let ms = |v: u64| v as f64 / 1000.0;
        match b {
            0 => (0.0, ms(1)),
            b if b == AGE_BUCKETS - 1 => (ms(1 << (b - 1)), f64::MAX),
            b => (ms(1 << (b - 1)), ms(1 << b)),
        }
    }

    pub fn record(&mut self, age_ns: u64, bytes: u64) {
        let b = Self::bucket_of(age_ns);
        self.count[b] += 1;
        self.bytes[b] += bytes;
        let ms = u128::from(age_ns / 1_000_000);
        self.bytes_ms[b] += u128::from(bytes) * ms;
        self.bytes_ms2[b] += u128::from(bytes) * ms * ms;
    }

    pub fn buckets(&self) -> Vec<AgeBucket> {
        (0..AGE_BUCKETS)
            .filter(|&b| self.count[b] > 0)
            .map(|b| {
                let (lo_s, hi_s) = Self::bounds_s(b);
                AgeBucket {
                    lo_s,
                    hi_s,
                    count: self.count[b],
                    bytes: self.bytes[b],
                }
            })
            .collect()
    }

    /// Each bucket's count and bytes scaled, rounded.
    pub fn scaled(&self, by_count: f64, by_bytes: f64) -> AgeHist {
        let mut h = *self;
        for b in 0..AGE_BUCKETS {
            h.count[b] = (h.count[b] as f64 * by_count).round() as u64;
            h.bytes[b] = (h.bytes[b] as f64 * by_bytes).round() as u64;
            h.bytes_ms[b] = (h.bytes_ms[b] as f64 * by_bytes).round() as u128;
            h.bytes_ms2[b] = (h.bytes_ms2[b] as f64 * by_bytes).round() as u128;
        }
        h
    }
}

impl AddAssign for AgeHist {
    fn add_assign(&mut self, o: AgeHist) {
        for b in 0..AGE_BUCKETS {
            self.count[b] += o.count[b];
            self.bytes[b] += o.bytes[b];
            self.bytes_ms[b] += o.bytes_ms[b];
            self.bytes_ms2[b] += o.bytes_ms2[b];
        }
    }
}

/// What is still outstanding of one key, and what was freed of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retained {
    pub count: u64,
    pub bytes_req: u64,
    pub bytes_alloc: u64,
    pub ages: AgeHist,
    pub oldest_ns: u64,
    /// Tracked objects seen freed during the run (transient).
    pub freed: u64,
    pub freed_bytes_alloc: u64,
    /// Tracked objects whose free was not seen (their address was reused).
    pub freed_unseen: u64,
}

impl Retained {
    pub fn add_object(&mut self, o: &LiveObject) {
        self.count += 1;
        self.bytes_req += o.bytes_req;
        self.bytes_alloc += o.bytes_alloc;
        self.ages.record(o.age_ns, o.bytes_alloc);
        self.oldest_ns = self.oldest_ns.max(o.age_ns);
    }

    /// How fast what is still outstanding grew over a run of `duration_s`
    /// (T). H(t), the bytes still outstanding at the end that had been
    /// allocated by time t, rises by an object's bytes at its allocation;
    /// growth is H's least-squares slope over [0, T - h]. Objects younger
    /// than h may be in flight (a queue's messages, a request's buffers)
    /// and are left out: h is the age bucket boundary (a power of two of
    /// milliseconds) at or below a quarter of the run, 4.096 s of a 30 s
    /// run. An object of b bytes and age a ≥ h moves the slope by
    /// 6·b·(T - a)·(a - h)/(T - h)³: a steady leak at r bytes/s gives r,
    /// what was held from the start (a = T) adds nothing, nor does what
    /// was freed during the run. Ages are read a little after the end: T
    /// is at least the oldest age, so that no object comes before the
    /// start.
    pub fn growth_bytes_per_s(&self, duration_s: f64) -> f64 {
        let t = (duration_s * 1000.0).max((self.oldest_ns / 1_000_000) as f64);
        // The bucket a quarter of the run falls in starts at h, and is the
        // first one counted.
        let first = AgeHist::bucket_of((t / 4.0) as u64 * 1_000_000);
        let h = AgeHist::bounds_s(first).0 * 1000.0;
        let w = t - h;
        if w <= 0.0 {
            return 0.0;
        }
        let (mut bytes, mut ms, mut ms2) = (0.0, 0.0, 0.0);
        for b in first..AGE_BUCKETS {
            bytes += self.ages.bytes[b] as f64;
            ms += self.ages.bytes_ms[b] as f64;
            ms2 += self.ages.bytes_ms2[b] as f64;
        }
        // Σ b·(T - a)·(a - h) = -Σb·a² + (T + h)·Σb·a - T·h·Σb, per ms;
        // each term is at least 0, so only rounding takes the sum below.
        let per_ms = 6.0 * (-ms2 + (t + h) * ms - t * h * bytes) / (w * w * w);
        (per_ms * 1000.0).max(0.0)
    }

    /// Scales counts by `by_count` and bytes by `by_bytes` (sampled data to
    /// estimated totals); the oldest age is a fact and stays.
    pub fn scaled(&self, by_count: f64, by_bytes: f64) -> Retained {
        let c = |v: u64| (v as f64 * by_count).round() as u64;
        let b = |v: u64| (v as f64 * by_bytes).round() as u64;
        Retained {
            count: c(self.count),
            bytes_req: b(self.bytes_req),
            bytes_alloc: b(self.bytes_alloc),
            ages: self.ages.scaled(by_count, by_bytes),
            oldest_ns: self.oldest_ns,
            freed: c(self.freed),
            freed_bytes_alloc: b(self.freed_bytes_alloc),
            freed_unseen: c(self.freed_unseen),
        }
    }
}

impl AddAssign for Retained {
    fn add_assign(&mut self, o: Retained) {
        self.count += o.count;
        self.bytes_req += o.bytes_req;
        self.bytes_alloc += o.bytes_alloc;
        self.ages += o.ages;
        self.oldest_ns = self.oldest_ns.max(o.oldest_ns);
        self.freed += o.freed;
        self.freed_bytes_alloc += o.freed_bytes_alloc;
        self.freed_unseen += o.freed_unseen;
    }
}

/// Tracked objects of one site whose free no tracepoint showed (their
/// address was handed out again while tracked), summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unseen {
    pub count: u64,
    pub bytes_alloc: u64,
}

/// Counters of the leak tracer, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeakEvents {
    pub frees_null: u64,
    pub frees_untracked: u64,
    pub reused_live: u64,
    pub map_full_live: u64,
    pub map_busy: u64,
    /// Bytes of the page frees among `frees_untracked` (PAGE_SIZE << order
    /// each): pages allocated before tracing that went back to the
    /// allocator.
    pub page_bytes_freed_untracked: u64,
}

/// The leak tracer's view at one moment, as input to `report::build`.
#[derive(Clone, Debug, Default)]
pub struct LeakInput {
    pub live: Vec<LiveObject>,
    pub unseen: HashMap<SiteKey, Unseen>,
    pub events: LeakEvents,
    /// 1: every address traced; N: addresses hashed, about one in N traced.
    pub sample_every: u32,
    /// Only objects at least this old count as outstanding.
    pub min_age_ns: u64,
    pub max_objects: u32,
    /// (program, misses): events the kernel dropped because a BPF program
    /// was already running on that CPU.
    pub recursion_misses: Vec<(String, u64)>,
    /// "snapshot" (mid-run) or "leaks" (end of run).
    pub kind: String,
    /// Command names of the processes (tgid) that allocated live objects,
    /// read when the snapshot was taken (absent: the process is gone).
    pub comms: HashMap<u32, String>,
    /// Every object's context was tested (`--by process`, `--by cgroup`,
    /// a filter of tasks): an object allocated in interrupt context is
    /// known as such. Otherwise only those with a sampled stack are, and
    /// the rest would pass for the interrupted process's: no process rows.
    pub contexts_known: bool,
}

/// Outstanding objects folded per key.
#[derive(Clone, Debug, Default)]
pub struct RetainedIndex {
    pub sites: HashMap<SiteKey, Retained>,
    pub stacks: HashMap<(SiteKey, i64), Retained>,
    /// The same stacks split by who made the objects.
    pub stack_owners: HashMap<(SiteKey, i64), HashMap<Owner, Retained>>,
    /// By the process (tgid) that allocated them; interrupt context's
    /// under `None`.
    pub procs: HashMap<Option<u32>, Retained>,
    /// The cgroup of each process's newest outstanding object: where it
    /// runs now, or ran last.
    pub proc_cgroups: HashMap<u32, u64>,
    /// By the cgroup that allocated them (or interrupt context), charged to
    /// the memory cgroup or not.
    pub cgroups: HashMap<CgroupKey, Retained>,
    /// By site, the outstanding objects (of those in `sites`) whose code
    /// asked for another cache than the merged one the site names
    /// (`LiveObject::asked_cache`), by that cache's name.
    pub asked: HashMap<SiteKey, BTreeMap<String, u64>>,
}

impl LeakInput {
    /// Caps every age at the traced time: no object allocated while
    /// tracing is older, and the jiffies ages are read with a 1-tick
    /// granularity. Done once here, so the age buckets and the oldest age
    /// are made from the same numbers.
    pub fn cap_ages(&mut self, traced_ns: u64) {
        for o in &mut self.live {
            o.age_ns = o.age_ns.min(traced_ns);
        }
    }
}

impl RetainedIndex {
    /// Folds the live objects at least `min_age_ns` old. What each site
    /// freed is what it allocated (`allocs`, from the kernel's per-site
    /// totals) minus what is live (of any age) minus what was freed unseen.
    /// Per cgroup, freed is what the cgroup allocated (`cgroup_allocs`,
    /// with --by cgroup) minus what is live.
    pub fn build(
        input: &LeakInput,
        allocs: &HashMap<SiteKey, AllocStats>,
        cgroup_allocs: &HashMap<CgroupKey, AllocStats>,
    ) -> RetainedIndex {
        let mut idx = RetainedIndex::default();
        let mut live_any_age: HashMap<&SiteKey, (u64, u64)> = HashMap::new();
        let mut cgroup_live: HashMap<CgroupKey, (u64, u64)> = HashMap::new();
        let mut newest: HashMap<u32, u64> = HashMap::new();
        for o in &input.live {
            let l = live_any_age.entry(&o.site).or_default();
            l.0 += 1;
            l.1 += o.bytes_alloc;
            let l = cgroup_live.entry(o.cgroup).or_default();
            l.0 += 1;
            l.1 += o.bytes_alloc;
            if let CgroupSlot::Cgroup(id) = o.cgroup.slot {
                let age = newest.entry(o.tgid).or_insert(u64::MAX);
                if o.age_ns <= *age && id != 0 {
                    *age = o.age_ns;
                    idx.proc_cgroups.insert(o.tgid, id);
                }
            }
            if o.age_ns < input.min_age_ns {
                continue;
            }
            idx.sites.entry(o.site.clone()).or_default().add_object(o);
            if let Some(name) = &o.asked_cache {
                *idx.asked
                    .entry(o.site.clone())
                    .or_default()
                    .entry(name.clone())
                    .or_default() += 1;
            }
            idx.procs.entry(o.process()).or_default().add_object(o);
            idx.cgroups.entry(o.cgroup).or_default().add_object(o);
            if let Some(id) = o.stack_id {
                let key = (o.site.clone(), id);
                idx.stack_owners
                    .entry(key.clone())
                    .or_default()
                    .entry(o.owner())
                    .or_default()
                    .add_object(o);
                idx.stacks.entry(key).or_default().add_object(o);
            }
        }
        for (site, a) in allocs {
            let (live, live_bytes) = live_any_age.get(site).copied().unwrap_or_default();
            let u = input.unseen.get(site).copied().unwrap_or_default();
            let r = idx.sites.entry(site.clone()).or_default();
            // Saturating: a snapshot read while running sees the maps at
            // slightly different instants.
            r.freed = a.count.saturating_sub(live + u.count);
            r.freed_bytes_alloc = a.bytes_alloc.saturating_sub(live_bytes + u.bytes_alloc);
            r.freed_unseen = u.count;
        }
        // Frees unseen are known per site only: here they count as freed.
        for (key, a) in cgroup_allocs {
            let (live, live_bytes) = cgroup_live.get(key).copied().unwrap_or_default();
            let r = idx.cgroups.entry(*key).or_default();
            r.freed = a.count.saturating_sub(live);
            r.freed_bytes_alloc = a.bytes_alloc.saturating_sub(live_bytes);
        }
        idx
    }

    /// Per cache, summed over the sites allocating from it.
    pub fn by_cache(&self) -> HashMap<CacheId, Retained> {
        let mut out: HashMap<CacheId, Retained> = HashMap::new();
        for (site, r) in &self.sites {
            *out.entry(site.cache.clone()).or_default() += *r;
        }
        out
    }

    pub fn total(&self) -> Retained {
        let mut t = Retained::default();
        for r in self.sites.values() {
            t += *r;
        }
        t
    }
}

/// Outstanding objects of one (site, stack) group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outstanding {
    pub objects: u64,
    pub bytes_alloc: u64,
}

impl Outstanding {
    /// One object of `bytes_alloc` bytes.
    pub fn one(bytes_alloc: u64) -> Outstanding {
        Outstanding {
            objects: 1,
            bytes_alloc,
        }
    }
}

impl std::ops::AddAssign for Outstanding {
    fn add_assign(&mut self, o: Outstanding) {
        self.objects += o.objects;
        self.bytes_alloc += o.bytes_alloc;
    }
}

/// The live-object map read folded by site and (with `--by cgroup`) the
/// cgroup or interrupt context that allocated: a reading of leaks' timeline.
pub type OutstandingBySite = HashMap<(SiteKey, Option<CgroupSlot>), Outstanding>;

/// The live-object map read folded by (site, stack) (the kernel layer's
/// `Tracer::outstanding`).
#[derive(Clone, Debug, Default)]
pub struct OutstandingRead {
    /// By (site, stack id); stack id 0: no stack was sampled for them.
    pub groups: HashMap<(SiteKey, i64), Outstanding>,
    /// By the process that allocated them (`None`: interrupt context);
    /// only when the tracer counts by process (`by_process`), else empty.
    pub by_process: HashMap<Option<u32>, Outstanding>,
    /// Objects not tracked because the live map was full (cumulative).
    pub map_full_live: u64,
}

impl OutstandingRead {
    /// Every object read.
    pub fn objects(&self) -> u64 {
        self.groups.values().map(|o| o.objects).sum()
    }
}

/// When `kheap serve --track-outstanding` ages its store: once it holds
/// three quarters of its capacity, its oldest objects are forgotten until it
/// holds half (docs/design/serve-outstanding.md says why).
pub const AGE_OUT_AT: (u64, u64) = (3, 4);

/// How many of the `objects` in a store of `capacity` objects are aged
/// out, oldest first: none below [`AGE_OUT_AT`] of the capacity, else down
/// to half the capacity.
pub fn objects_to_age_out(objects: u64, capacity: u64) -> u64 {
    let (num, den) = AGE_OUT_AT;
    if capacity == 0 || objects * den < capacity * num {
        return 0;
    }
    objects.saturating_sub(capacity / 2)
}

/// Objects forgotten by the store while still outstanding (their frees are
/// not seen): by site, and the age of the youngest of them when they were
/// forgotten (every object younger than it is still tracked).
#[derive(Clone, Debug, Default)]
pub struct AgedOut {
    pub by_site: HashMap<SiteKey, Outstanding>,
    pub youngest_age_ns: u64,
}

impl AgedOut {
    pub fn objects(&self) -> u64 {
        self.by_site.values().map(|o| o.objects).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::KmallocSlab;

    #[test]
    fn the_store_is_aged_from_three_quarters_down_to_half() {
        assert_eq!(objects_to_age_out(0, 1000), 0);
        assert_eq!(objects_to_age_out(749, 1000), 0);
        assert_eq!(objects_to_age_out(750, 1000), 250);
        assert_eq!(objects_to_age_out(1000, 1000), 500);
        // Small stores: 6 of 8 is the mark, 4 are kept.
        assert_eq!(objects_to_age_out(5, 8), 0);
        assert_eq!(objects_to_age_out(6, 8), 2);
        assert_eq!(objects_to_age_out(8, 8), 4);
        assert_eq!(objects_to_age_out(1, 1), 1);
        assert_eq!(objects_to_age_out(3, 0), 0);
    }

    fn site(call_site: u64) -> SiteKey {
        SiteKey {
            call_site,
            cache: CacheId::Kmalloc {
                size: 4096,
                accounted: true,
                slab: KmallocSlab::SizeClass,
            },
        }
    }

    fn obj(call_site: u64, stack: Option<i64>, age_ms: u64) -> LiveObject {
        LiveObject {
            site: site(call_site),
            stack_id: stack,
            bytes_req: 2148,
            bytes_alloc: 4096,
            age_ns: age_ms * 1_000_000,
            tgid: 1,
            cgroup: CgroupKey {
                slot: CgroupSlot::Cgroup(42),
                accounted: true,
            },
            asked_cache: None,
        }
    }

    /// What `objs` still hold grows at this many bytes per second over a
    /// run of `run_s`.
    fn growth_of(objs: impl IntoIterator<Item = LiveObject>, run_s: f64) -> f64 {
        let mut r = Retained::default();
        for o in objs {
            r.add_object(&o);
        }
        r.growth_bytes_per_s(run_s)
    }

    #[test]
    fn a_steady_leak_grows_at_its_rate_and_what_was_there_from_the_start_does_not() {
        // One 4096-byte object every 10 ms for the whole 10 s run: 409,600
        // bytes a second (h = 2.048 s: the objects older than that, over
        // the first 7.952 s, rise at the same rate).
        let steady = (0..1000).map(|i| obj(1, None, i * 10));
        let g = growth_of(steady, 10.0);
        assert!((g / 409_600.0 - 1.0).abs() < 2e-3, "{g}");
        // The same bytes, all allocated as the run began (and read a
        // little after its end): held, not growing.
        assert_eq!(
            growth_of((0..1000).map(|_| obj(1, None, 10_050)), 10.0),
            0.0
        );
        // Nothing held, nothing grown.
        assert_eq!(Retained::default().growth_bytes_per_s(10.0), 0.0);
    }

    #[test]
    fn what_is_younger_than_a_quarter_of_the_run_is_not_growth_yet() {
        // A queue's 1000 messages in flight, all younger than 1.3 s when a
        // 30 s run ends (the oldest held 1.3 s: issue 46), against 1000
        // objects leaked steadily over the run: the same 4 MB held.
        let in_flight = growth_of((0..1000).map(|i| obj(1, None, i * 13 / 10)), 30.0);
        let leak = growth_of((0..1000).map(|i| obj(1, None, i * 30)), 30.0);
        assert_eq!(in_flight, 0.0);
        assert!(
            (leak / (1000.0 * 4096.0 / 30.0) - 1.0).abs() < 2e-3,
            "{leak}"
        );
        // h of a 30 s run is 4.096 s (2^12 ms <= 7.5 s < 2^13 ms): 4.096 s
        // old counts, a millisecond younger does not.
        let at = |age_ms| growth_of([obj(1, None, age_ms)], 30.0);
        assert_eq!(at(4095), 0.0);
        // 6·b·(T - a)·(a - h)/(T - h)³ with a = 10 s: 6 × 4096 × 20 × 5.904
        // / 25.904³ = 166.95 B/s.
        assert!((at(10_000) - 166.95).abs() < 0.01, "{}", at(10_000));
        // A run under 4 ms counts every age (h = 0).
        assert!(growth_of([obj(1, None, 1)], 0.003) > 0.0);
    }

    #[test]
    fn growth_adds_up_over_rows_and_scales_with_sampled_bytes() {
        let mut a = Retained::default();
        let mut b = Retained::default();
        for i in 0..500 {
            a.add_object(&obj(1, None, i * 20));
            b.add_object(&obj(2, None, i * 20 + 10));
        }
        let mut both = a;
        both += b;
        let sum = a.growth_bytes_per_s(10.0) + b.growth_bytes_per_s(10.0);
        assert!(sum > 0.0);
        assert!(
            (both.growth_bytes_per_s(10.0) - sum).abs() < 1e-6 * sum,
            "{sum}"
        );
        // One address in 4 sampled: the estimate is 4 times the sample's.
        let scaled = a.scaled(4.0, 4.0).growth_bytes_per_s(10.0);
        assert!((scaled / a.growth_bytes_per_s(10.0) - 4.0).abs() < 1e-9);
    }

    fn allocated(count: u64) -> AllocStats {
        AllocStats {
            count,
            bytes_req: count * 2148,
            bytes_alloc: count * 4096,
            ..Default::default()
        }
    }

    #[test]
    fn ticks_become_nanoseconds() {
        assert_eq!(jiffies_to_ns(250, 250), 1_000_000_000);
        assert_eq!(jiffies_to_ns(3, 1000), 3_000_000);
        assert_eq!(nearest_hz(26, 100_000_000), 250);
        assert_eq!(nearest_hz(99, 100_000_000), 1000);
        assert_eq!(nearest_hz(29, 100_000_000), 300);
        assert_eq!(nearest_hz(10, 100_000_000), 100);
    }

    #[test]
    fn age_buckets_are_log2_milliseconds() {
        assert_eq!(AgeHist::bucket_of(0), 0);
        assert_eq!(AgeHist::bucket_of(999_999), 0);
        assert_eq!(AgeHist::bucket_of(1_000_000), 1);
        assert_eq!(AgeHist::bucket_of(1_500_000_000), 11); // 1500 ms in [1024, 2048)
        assert_eq!(AgeHist::bounds_s(11), (1.024, 2.048));
        assert_eq!(AgeHist::bucket_of(u64::MAX), AGE_BUCKETS - 1);
        for ms in [1u64, 3, 999, 1000, 65_000, 1 << 30] {
            let (lo, hi) = AgeHist::bounds_s(AgeHist::bucket_of(ms * 1_000_000));
            let s = ms as f64 / 1000.0;
            assert!(lo <= s && s < hi, "{s}s not in [{lo},{hi})");
        }
    }

    #[test]
    fn index_folds_live_objects_and_frees_per_site_and_stack() {
        let mut input = LeakInput {
            live: vec![
                obj(0x10, Some(7), 1500),
                obj(0x10, None, 1600),
                obj(0x20, Some(8), 5),
            ],
            ..Default::default()
        };
        input.unseen.insert(
            site(0x10),
            Unseen {
                count: 1,
                bytes_alloc: 4096,
            },
        );
        let allocs = HashMap::from([(site(0x10), allocated(6)), (site(0x20), allocated(1))]);
        let idx = RetainedIndex::build(&input, &allocs, &HashMap::new());
        let a = idx.sites[&site(0x10)];
        assert_eq!((a.count, a.bytes_alloc, a.bytes_req), (2, 8192, 4296));
        assert_eq!(
            (a.freed, a.freed_bytes_alloc, a.freed_unseen),
            (3, 12288, 1)
        );
        assert_eq!(a.oldest_ns, 1_600_000_000);
        assert_eq!(a.ages.buckets().len(), 1);
        assert_eq!(a.ages.buckets()[0].count, 2);
        assert_eq!(a.ages.buckets()[0].bytes, 8192);
        assert_eq!(idx.stacks[&(site(0x10), 7)].count, 1);
        assert_eq!(idx.stacks.len(), 2);
        let owner = Owner::Process {
            tgid: 1,
            cgroup: 42,
        };
        assert_eq!(idx.stack_owners[&(site(0x10), 7)][&owner].count, 1);
        assert_eq!(idx.procs[&Some(1)].count, 3, "all allocated by tgid 1");
        let t = idx.total();
        assert_eq!((t.count, t.bytes_alloc), (3, 3 * 4096));
        assert_eq!(idx.by_cache().len(), 1);

        // Allocated in interrupt context while tgid 1 ran: no process's.
        let mut irq = obj(0x10, None, 1700);
        irq.cgroup.slot = CgroupSlot::Interrupt;
        input.live.push(irq);
        let idx = RetainedIndex::build(&input, &allocs, &HashMap::new());
        assert_eq!(idx.procs[&Some(1)].count, 3);
        assert_eq!(idx.procs[&None].count, 1, "the interrupt row");
    }

    #[test]
    fn min_age_keeps_only_old_objects() {
        let input = LeakInput {
            live: vec![obj(0x10, None, 1500), obj(0x10, None, 5)],
            min_age_ns: 1_000_000_000,
            ..Default::default()
        };
        let allocs = HashMap::from([(site(0x10), allocated(3))]);
        let idx = RetainedIndex::build(&input, &allocs, &HashMap::new());
        assert_eq!(idx.sites[&site(0x10)].count, 1);
        assert_eq!(
            idx.sites[&site(0x10)].freed,
            1,
            "young objects are not freed"
        );
    }

    #[test]
    fn scaling_multiplies_counts_but_keeps_the_oldest_age() {
        let mut r = Retained::default();
        r.add_object(&obj(0x10, None, 1500));
        let s = r.scaled(4.0, 4.0);
        assert_eq!((s.count, s.bytes_alloc), (4, 4 * 4096));
        assert_eq!(s.ages.count[11], 4);
        assert_eq!(s.oldest_ns, r.oldest_ns);
    }
}
