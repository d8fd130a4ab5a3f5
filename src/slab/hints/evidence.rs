//! What a site hint knows beyond rounding, and says as its evidence: the
//! kind of cache the site allocated from (a kmalloc size class every
//! kmalloc() of the size shares, a bucket cache of one purpose, a cache of
//! its own), whether the call site's requested sizes vary, and from those
//! who sets the size: the caller at run time (a length handed in) or the
//! kernel code (a fixed size, such as a struct's). Only what the traced
//! figures show: no name kheap cannot know.

use std::collections::HashMap;

use serde::Serialize;

use super::super::traced::TracedSite;
use crate::model::slab_loss::per_second;
use crate::model::{AllocStats, CacheId, Hist};

/// What kind of cache a site allocated from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheKind {
    /// A kmalloc size class shared by every kmalloc() of the size
    /// (`kmalloc-2k`, `kmalloc-cg-2k`, `kmalloc-rnd-05-2k`, `dma-kmalloc-2k`).
    SizeClass,
    /// A kmalloc bucket cache (`msg_msg-2k`): a copy of the size classes
    /// that one kind of allocation uses (`kmem_buckets`,
    /// `CONFIG_SLAB_BUCKETS`), which the kernel keeps for sizes user space
    /// controls.
    Bucket,
    /// A cache of its own (`kmem_cache_alloc`).
    Dedicated,
    /// Anything else: a kmalloc cache kheap could not name, large kmalloc
    /// (pages), a cache known only by its object size.
    Other,
}

impl CacheKind {
    pub fn of(cache: &CacheId) -> CacheKind {
        if cache.kmalloc_bucket().is_some() {
            CacheKind::Bucket
        } else if cache.kmalloc_size_class().is_some() {
            CacheKind::SizeClass
        } else if matches!(cache, CacheId::Named(_)) {
            CacheKind::Dedicated
        } else {
            CacheKind::Other
        }
    }
}

/// How a call site's requested sizes spread, over every cache it
/// allocated from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sizes {
    /// Every request fell in one power-of-two range and one size class: a
    /// fixed size, or sizes close together (the histogram cannot tell).
    OneRange,
    /// Requests fell in more than one power-of-two range or size class:
    /// the size varies from call to call.
    Varying,
}

/// Who sets the size, from the cache kind and the spread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SizedBy {
    /// The caller, at run time: the sizes vary, or the site allocates from
    /// a bucket cache.
    Caller,
    /// The kernel code: one range of sizes in a cache that is not a
    /// bucket, as a fixed size (a struct's, a constant) gives.
    Code,
}

/// The figures a site hint stands on. `count`, `alloc_rate`,
/// `waste_bytes` and `waste_pct` are the hint's site in its cache; `sizes`,
/// `size_lo` and `size_hi` its call site over every cache.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Evidence {
    pub cache_kind: CacheKind,
    pub sizes: Sizes,
    /// The smallest and largest requested size the call site's histogram
    /// allows: its lowest bucket's `lo`, its highest bucket's `hi - 1`.
    pub size_lo: u64,
    pub size_hi: u64,
    pub sized_by: SizedBy,
    pub count: u64,
    /// Allocations per second over the run (0 when its length is unknown).
    pub alloc_rate: f64,
    /// Bytes lost to rounding: allocated minus requested.
    pub waste_bytes: u64,
    /// `waste_bytes` as a share of the allocated bytes.
    pub waste_pct: f64,
}

/// One call site's requests over every cache it allocated from: their
/// histogram and the kmalloc size classes they landed in.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Spread {
    pub hist: Hist,
    pub classes: Vec<u64>,
}

impl Spread {
    fn add(&mut self, site: &TracedSite) {
        self.hist += site.stats.hist;
        if let CacheId::Kmalloc { size, .. } = site.cache {
            if !self.classes.contains(&size) {
                self.classes.push(size);
            }
        }
    }

    /// Every call site's spread, in one pass over the sites.
    pub fn by_call_site(sites: &[TracedSite]) -> HashMap<&str, Spread> {
        let mut out: HashMap<&str, Spread> = HashMap::new();
        for s in sites {
            out.entry(s.call_site.as_str()).or_default().add(s);
        }
        out
    }
}

impl Evidence {
    /// The evidence of `stats` (one site in `cache`, or a call site's
    /// sum), with the spread of the call site `call_site` over every
    /// cache in `sites`.
    pub fn of(
        stats: &AllocStats,
        cache: &CacheId,
        call_site: &str,
        sites: &[TracedSite],
        duration_s: f64,
    ) -> Evidence {
        let mut spread = Spread::default();
        for s in sites.iter().filter(|s| s.call_site == call_site) {
            spread.add(s);
        }
        Evidence::with_spread(stats, cache, Some(&spread), duration_s)
    }

    /// As `of`, with the call site's spread already summed (`None`: the
    /// call site is not among the traced sites, and `stats` alone tell).
    pub fn with_spread(
        stats: &AllocStats,
        cache: &CacheId,
        spread: Option<&Spread>,
        duration_s: f64,
    ) -> Evidence {
        let (hist, classes) = match spread {
            Some(s) if !s.hist.is_empty() || !s.classes.is_empty() => (s.hist, s.classes.len()),
            _ => (stats.hist, 0),
        };
        let filled: Vec<usize> = (0..hist.0.len()).filter(|&b| hist.0[b] > 0).collect();
        let sizes = if filled.len() > 1 || classes > 1 {
            Sizes::Varying
        } else {
            Sizes::OneRange
        };
        let (size_lo, size_hi) = match (filled.first(), filled.last()) {
            (Some(&lo), Some(&hi)) => (Hist::bounds(lo).0, Hist::bounds(hi).1.saturating_sub(1)),
            _ => (0, 0),
        };
        let cache_kind = CacheKind::of(cache);
        let sized_by = if cache_kind == CacheKind::Bucket || sizes == Sizes::Varying {
            SizedBy::Caller
        } else {
            SizedBy::Code
        };
        Evidence {
            cache_kind,
            sizes,
            size_lo,
            size_hi,
            sized_by,
            count: stats.count,
            alloc_rate: per_second(stats.count, duration_s),
            waste_bytes: stats.waste(),
            waste_pct: stats.waste_pct(),
        }
    }

    /// The evidence of one traced site.
    pub fn of_site(site: &TracedSite, sites: &[TracedSite], duration_s: f64) -> Evidence {
        Evidence::of(&site.stats, &site.cache, &site.call_site, sites, duration_s)
    }

    fn range(&self) -> String {
        format!("{}-{} B", self.size_lo, self.size_hi)
    }

    /// Who sets the size, and what says so: one clause, e.g. "the caller
    /// sets the size: msg_msg-2k is a bucket cache (…)".
    pub fn who_sets_the_size(&self, cache: &str) -> String {
        let range = self.range();
        match (self.cache_kind, self.sizes) {
            (CacheKind::Bucket, sizes) => format!(
                "the caller sets the size: {cache} is a bucket cache (kmem_buckets, a copy of the \
                 kmalloc size classes the kernel keeps for allocations whose size user space \
                 controls, such as a message, write or ioctl length){}",
                match sizes {
                    Sizes::Varying => format!(", and this call site's requests vary ({range})"),
                    Sizes::OneRange =>
                        format!(", though every request of this run fell in {range}"),
                }
            ),
            (_, Sizes::Varying) => format!(
                "the caller sets the size at run time: this call site's requests vary ({range}), \
                 as a length handed in does (a message, write or ioctl length, a count of entries)"
            ),
            (_, Sizes::OneRange) => format!(
                "the kernel code sets the size, as far as this run shows: every request fell in \
                 {range}, as a fixed size (a struct's, a constant) does"
            ),
        }
    }
}
