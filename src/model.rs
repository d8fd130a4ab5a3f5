//! The model: pure types and maths that every other layer builds on. Size
//! histograms, allocation statistics, waste, cache and site identities, the
//! counts every report row carries, and human-readable units. `snapshot`
//! holds what is read from the kernel, `live` the leak tracer's live
//! objects. Nothing here touches the kernel or libbpf, so it is unit-tested
//! without root; nothing here imports from the layers above (report,
//! render, cmd) or from the kernel layer.

pub mod backing;
pub mod kallsyms;
pub mod live;
pub mod progress;
pub mod slab_loss;
pub mod snapshot;
pub mod source;

pub use source::{PageUse, Source, Sources, VmapKind};

use std::ops::{AddAssign, Sub};

use serde::{Deserialize, Serialize};

/// Number of log2 buckets; must match `KHEAP_HIST_BUCKETS` in `bpf/kheap.h`
/// (checked at compile time in `kernel/skel.rs` and `kernel/malloc_skel.rs`
/// against the generated types).
pub const HIST_BUCKETS: usize = 32;

/// A log2 histogram of requested sizes. Bucket 0 holds size 0; bucket
/// `b >= 1` holds sizes in `[2^(b-1), 2^b)`; the last bucket takes everything
/// larger too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hist(pub [u64; HIST_BUCKETS]);

impl Default for Hist {
    fn default() -> Self {
        Hist([0; HIST_BUCKETS])
    }
}

/// One non-empty histogram bucket as reported: `lo <= size < hi`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    pub lo: u64,
    pub hi: u64,
    pub count: u64,
}

impl Hist {
    /// The bucket a size falls in (same rule as `size_bucket()` in BPF).
    pub fn bucket_of(size: u64) -> usize {
        if size == 0 {
            return 0;
        }
        let b = 64 - size.leading_zeros() as usize; // floor(log2) + 1
        b.min(HIST_BUCKETS - 1)
    }

    /// `[lo, hi)` of bucket `b`. The last bucket is open-ended; its `hi` is
    /// reported as `u64::MAX`.
    pub fn bounds(b: usize) -> (u64, u64) {
        match b {
            0 => (0, 1),
            b if b == HIST_BUCKETS - 1 => (1 << (b - 1), u64::MAX),
            b => (1 << (b - 1), 1 << b),
        }
    }

    pub fn record(&mut self, size: u64) {
        self.0[Self::bucket_of(size)] += 1;
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&c| c == 0)
    }

    pub fn buckets(&self) -> Vec<Bucket> {
        self.0
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(b, &count)| {
                let (lo, hi) = Self::bounds(b);
                Bucket { lo, hi, count }
            })
            .collect()
    }

    pub fn from_buckets(buckets: &[Bucket]) -> Hist {
        let mut h = Hist::default();
        for b in buckets {
            h.0[Self::bucket_of(b.lo)] += b.count;
        }
        h
    }

    /// Multiplies every bucket by `factor`, rounding, for sampled data
    /// scaled to exact totals.
    pub fn scaled(&self, factor: f64) -> Hist {
        let mut h = *self;
        for c in h.0.iter_mut() {
            *c = (*c as f64 * factor).round() as u64;
        }
        h
    }
}

impl AddAssign for Hist {
    fn add_assign(&mut self, rhs: Hist) {
        for (a, b) in self.0.iter_mut().zip(rhs.0) {
            *a += b;
        }
    }
}

impl Sub for Hist {
    type Output = Hist;
    /// Saturating per bucket: used for interval deltas, where a counter that
    /// went backwards (a map entry was reset) must not wrap around.
    fn sub(self, rhs: Hist) -> Hist {
        let mut h = self;
        for (a, b) in h.0.iter_mut().zip(rhs.0) {
            *a = a.saturating_sub(b);
        }
        h
    }
}

/// Exact counters of one aggregation key (a site, a stack, a cache, a process).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocStats {
    pub count: u64,
    pub bytes_req: u64,
    pub bytes_alloc: u64,
    pub hist: Hist,
}

impl AllocStats {
    /// Bytes lost to slab rounding: allocated minus requested.
    pub fn waste(&self) -> u64 {
        self.bytes_alloc.saturating_sub(self.bytes_req)
    }

    /// Waste as a percentage of the allocated bytes (0 when nothing was).
    pub fn waste_pct(&self) -> f64 {
        pct(self.waste(), self.bytes_alloc)
    }

    /// Mean requested size.
    pub fn avg_req(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.bytes_req as f64 / self.count as f64
        }
    }

    /// Scales counts and bytes by `factor` (sampled stacks to exact totals).
    pub fn scaled(&self, factor: f64) -> AllocStats {
        let s = |v: u64| (v as f64 * factor).round() as u64;
        AllocStats {
            count: s(self.count),
            bytes_req: s(self.bytes_req),
            bytes_alloc: s(self.bytes_alloc),
            hist: self.hist.scaled(factor),
        }
    }
}

impl AddAssign for AllocStats {
    fn add_assign(&mut self, rhs: AllocStats) {
        self.count += rhs.count;
        self.bytes_req += rhs.bytes_req;
        self.bytes_alloc += rhs.bytes_alloc;
        self.hist += rhs.hist;
    }
}

impl Sub for AllocStats {
    type Output = AllocStats;
    fn sub(self, rhs: AllocStats) -> AllocStats {
        AllocStats {
            count: self.count.saturating_sub(rhs.count),
            bytes_req: self.bytes_req.saturating_sub(rhs.bytes_req),
            bytes_alloc: self.bytes_alloc.saturating_sub(rhs.bytes_alloc),
            hist: self.hist - rhs.hist,
        }
    }
}

pub fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Splits `total` over `weights` in proportion, exactly: floors, then the
/// largest remainders get one more each (ties: the earlier weight).
/// All-zero weights give all zeros. Sampled estimates are split so (a
/// site's over its stacks, a stack's over its processes).
pub fn apportion(total: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u128 = weights.iter().map(|&w| w as u128).sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let mut out: Vec<u64> = Vec::with_capacity(weights.len());
    let mut rems: Vec<(u128, usize)> = Vec::with_capacity(weights.len());
    for (i, &w) in weights.iter().enumerate() {
        let exact = total as u128 * w as u128;
        out.push((exact / sum) as u64);
        rems.push((exact % sum, i));
    }
    let left = total - out.iter().sum::<u64>();
    rems.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, i) in rems.iter().take(left as usize) {
        out[i] += 1;
    }
    out
}

/// Which slab cache an allocation came from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CacheId {
    /// A kmalloc() allocation; `size` is the allocated size, `slab` the
    /// cache the object lives in. Larger than `KMALLOC_MAX_CACHE_SIZE`,
    /// kmalloc() goes to the page allocator (kmalloc_large).
    Kmalloc {
        size: u64,
        accounted: bool,
        slab: KmallocSlab,
    },
    /// A dedicated cache (kmem_cache_alloc), by name.
    Named(String),
    /// A cache whose name the kernel did not tell (old tracepoint layouts):
    /// known only by its object size.
    ObjectSize(u64),
    /// Pages of one order from the page allocator, and what they went to.
    Pages { order: u32, used_for: PageUse },
    /// vmap areas, guard page included, by what they are for (vmalloc
    /// proper, vmap, ioremap, vm_map_ram).
    Vmalloc { area: VmapKind },
    /// Per-CPU allocations.
    Percpu,
}

/// Which slab cache a kmalloc() object lives in, as far as kheap knows. The
/// kmalloc tracepoint names none, and the size does not tell (bucket caches
/// such as msg_msg-4k, kmalloc-rnd-NN-*, kmalloc-cg-*): the object's slab
/// does (bpf/slab_cache.bpf.h).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KmallocSlab {
    /// Named by the object's slab.
    Cache(String),
    /// This kernel gives no way to find the slab: named by the size class,
    /// and the report says so (`RunInfo::kmalloc_caches`).
    SizeClass,
    /// The object's slab named no cache of its size: counted under this
    /// label, never guessed.
    Unresolved,
}

/// Largest size served by kmalloc caches (two pages on x86_64 SLUB); above
/// it kmalloc() takes whole pages.
pub const KMALLOC_MAX_CACHE_SIZE: u64 = 8192;

impl CacheId {
    /// The name `/proc/slabinfo` uses for this cache (approximate for kmalloc:
    /// DMA/reclaimable/random variants are not distinguished by the event).
    pub fn name(&self) -> String {
        match self {
            CacheId::Kmalloc { size, .. } if *size > KMALLOC_MAX_CACHE_SIZE => {
                format!("kmalloc-large-{}", human_size(*size))
            }
            CacheId::Kmalloc {
                slab: KmallocSlab::Cache(name),
                ..
            } => name.clone(),
            CacheId::Kmalloc {
                size,
                accounted,
                slab: KmallocSlab::SizeClass,
            } => {
                let cg = if *accounted { "cg-" } else { "" };
                format!("kmalloc-{cg}{}", kmalloc_size_name(*size))
            }
            CacheId::Kmalloc {
                size,
                slab: KmallocSlab::Unresolved,
                ..
            } => format!("{UNRESOLVED_PREFIX}kmalloc-{}]", kmalloc_size_name(*size)),
            CacheId::Named(n) => n.clone(),
            CacheId::ObjectSize(s) => format!("cache-of-{s}-bytes"),
            CacheId::Pages { order, used_for } => match used_for.counted_by() {
                None => format!("pages-order{order}"),
                Some(_) => format!("pages-order{order}-{}", page_use_name(*used_for)),
            },
            CacheId::Vmalloc { area } => area.name().into(),
            CacheId::Percpu => "percpu".into(),
        }
    }

    /// The kmalloc size class of a cache shared by every kmalloc() of that
    /// size (kmalloc-4k, kmalloc-cg-4k, kmalloc-rnd-05-4k, dma-kmalloc-4k),
    /// as opposed to a dedicated one (a kmem_cache, or a bucket cache such
    /// as msg_msg-4k): what a "dedicated cache" hint may improve on.
    pub fn kmalloc_size_class(&self) -> Option<u64> {
        match self {
            CacheId::Kmalloc { size, slab, .. } if *size <= KMALLOC_MAX_CACHE_SIZE => match slab {
                KmallocSlab::Cache(name) => is_kmalloc_size_class(name).then_some(*size),
                KmallocSlab::SizeClass => Some(*size),
                KmallocSlab::Unresolved => None,
            },
            _ => None,
        }
    }

    /// The allocator this cache belongs to.
    pub fn source(&self) -> Source {
        match self {
            CacheId::Kmalloc { .. } | CacheId::Named(_) | CacheId::ObjectSize(_) => Source::Kmalloc,
            CacheId::Pages { .. } => Source::Page,
            CacheId::Vmalloc { .. } => Source::Vmalloc,
            CacheId::Percpu => Source::Percpu,
        }
    }

    /// Whether another source already counts these bytes (pages backing
    /// slabs or vmalloc areas): such rows are shown, but left out of totals.
    pub fn counted_elsewhere(&self) -> bool {
        matches!(self, CacheId::Pages { used_for, .. } if used_for.counted_by().is_some())
    }
}

fn page_use_name(u: PageUse) -> &'static str {
    match u {
        PageUse::Direct => "direct",
        PageUse::Slab => "slab",
        PageUse::Vmalloc => "vmalloc",
        PageUse::Percpu => "percpu",
    }
}

/// One call site allocating from one cache: the kernel's aggregation key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SiteKey {
    pub call_site: u64,
    pub cache: CacheId,
}

impl SiteKey {
    /// `[page]`, `[vmalloc]`: the label of a site that is a whole
    /// allocator. Page and vmalloc events carry no call site, so each of
    /// those sources has one site, and its stacks name the callers.
    pub fn whole_allocator(&self) -> Option<String> {
        let source = self.cache.source();
        (self.call_site == 0 && source != Source::Kmalloc).then(|| format!("[{source}]"))
    }
}

/// How the name of a cache kheap could not name starts (`[unresolved
/// kmalloc-4k]`): plain in every view, and counted in the report header.
pub const UNRESOLVED_PREFIX: &str = "[unresolved ";

/// Whether a slab cache name is one of the kernel's kmalloc size classes
/// (`kmalloc-<size>`, with `cg-`, `rcl-`, `rnd-NN-` or a `dma-` prefix):
/// shared by every kmalloc() of the size, unlike a bucket cache
/// (`msg_msg-4k`) or a dedicated one.
pub fn is_kmalloc_size_class(name: &str) -> bool {
    let rest = name.strip_prefix("dma-").unwrap_or(name);
    let Some(rest) = rest.strip_prefix("kmalloc-") else {
        return false;
    };
    let rest = rest
        .strip_prefix("cg-")
        .or_else(|| rest.strip_prefix("rcl-"))
        .unwrap_or(rest);
    let rest = match rest.strip_prefix("rnd-") {
        Some(r) => match r.split_once('-') {
            Some((n, size)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => size,
            _ => return false,
        },
        None => rest,
    };
    let digits = rest.strip_suffix('k').unwrap_or(rest);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// How a cache that SLUB merged others into is named in every view: the
/// kernel's name for it (the `/proc/slabinfo` row, what the tracepoints
/// say), then the other names that share it, e.g. `ftrace_event_field
/// (merged: Acpi-Parse, damon_region, +4)`. Allocations from any of them
/// are counted under it: the kernel cannot tell them apart.
pub fn merged_cache_name(name: &str, aliases: &[String]) -> String {
    const SHOWN: usize = 3;
    if aliases.is_empty() {
        return name.to_string();
    }
    let mut list = aliases
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if aliases.len() > SHOWN {
        list.push_str(&format!(", +{}", aliases.len() - SHOWN));
    }
    format!("{name}{MERGED_INFIX}{list})")
}

const MERGED_INFIX: &str = " (merged: ";

/// The kernel's own name of a cache named by `merged_cache_name`.
pub fn unmerged_cache_name(name: &str) -> &str {
    name.split_once(MERGED_INFIX).map_or(name, |(n, _)| n)
}

/// kmalloc cache names use "k" for multiples of 1024 (kmalloc-4k, kmalloc-96).
pub fn kmalloc_size_name(size: u64) -> String {
    if size >= 1024 && size.is_multiple_of(1024) {
        format!("{}k", size / 1024)
    } else {
        size.to_string()
    }
}

/// Counts shared by every row kind, flattened into each JSON entry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    pub count: u64,
    pub bytes_req: u64,
    pub bytes_alloc: u64,
    #[serde(default)]
    pub waste_bytes: u64,
    #[serde(default)]
    pub waste_pct: f64,
    #[serde(default)]
    pub avg_size: f64,
    #[serde(default)]
    pub hist: Vec<Bucket>,
}

impl From<&AllocStats> for Counts {
    fn from(s: &AllocStats) -> Counts {
        Counts {
            count: s.count,
            bytes_req: s.bytes_req,
            bytes_alloc: s.bytes_alloc,
            waste_bytes: s.waste(),
            waste_pct: round2(s.waste_pct()),
            avg_size: round2(s.avg_req()),
            hist: s.hist.buckets(),
        }
    }
}

impl Counts {
    pub fn stats(&self) -> AllocStats {
        AllocStats {
            count: self.count,
            bytes_req: self.bytes_req,
            bytes_alloc: self.bytes_alloc,
            hist: Hist::from_buckets(&self.hist),
        }
    }
}

/// Time inside the allocator for one call site through one allocator
/// function (`--latency`). `hist` buckets are nanoseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyRow {
    pub function: String,
    pub call_site: String,
    pub allocator: String,
    pub count: u64,
    pub avg_ns: f64,
    pub total_ns: u64,
    pub hist: Vec<Bucket>,
}

/// Two decimals, for ratios and rates in JSON.
pub fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// `n` divided by `base` until it is under `base` (or the units run out),
/// with the unit it ends in.
fn in_units(n: u64, base: f64, units: &[&'static str]) -> (f64, &'static str) {
    let mut v = n as f64;
    let mut u = 0;
    while v >= base && u < units.len() - 1 {
        v /= base;
        u += 1;
    }
    (v, units[u])
}

/// Bytes in binary units, for table cells: 512, 1.5K, 2.0M, 3.1G.
pub fn human_size(bytes: u64) -> String {
    match in_units(bytes, 1024.0, &["", "K", "M", "G", "T"]) {
        (_, "") => format!("{bytes}"),
        (v, unit) if v >= 100.0 => format!("{v:.0}{unit}"),
        (v, unit) => format!("{v:.1}{unit}"),
    }
}

/// A change in bytes, signed, in binary units: "+1.5M", "-300K", "0".
pub fn signed_size(v: i64) -> String {
    signed(v, human_size)
}

/// A change in a count, signed, with SI suffixes: "+1.2k", "-3", "0".
pub fn signed_count(v: i64) -> String {
    signed(v, human_count)
}

fn signed(v: i64, magnitude: fn(u64) -> String) -> String {
    match v {
        0 => "0".into(),
        v if v > 0 => format!("+{}", magnitude(v as u64)),
        v => format!("-{}", magnitude(v.unsigned_abs())),
    }
}

/// Counts with SI suffixes, for table cells: 999, 1.2k, 3.4M.
pub fn human_count(n: u64) -> String {
    match in_units(n, 1000.0, &["", "k", "M", "G"]) {
        (_, "") => format!("{n}"),
        (v, unit) => format!("{v:.1}{unit}"),
    }
}

/// Who an allocation is charged to in the per-cgroup view: a cgroup v2 id,
/// or no task at all (interrupt context).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CgroupSlot {
    Cgroup(u64),
    Interrupt,
}

/// Who made a stack's allocations: a process, in the cgroup v2 it ran in
/// then, or interrupt context, which is no task's (the task it interrupted
/// is not blamed). Stacks are kept per owner so that exported profiles can
/// label each sample with its process and cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    Process { tgid: u32, cgroup: u64 },
    Interrupt,
}

/// One entry of the kernel's per-cgroup map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CgroupKey {
    pub slot: CgroupSlot,
    /// Charged to the memory cgroup (`__GFP_ACCOUNT` or a `SLAB_ACCOUNT`
    /// cache): counted against the cgroup's memory limit.
    pub accounted: bool,
}

#[cfg(test)]
mod tests;
