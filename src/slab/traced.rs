//! The traced half of `kheap slab`, as plain data. Whatever collects it (the
//! BPF side) fills these in; nothing here depends on libbpf, so reports and
//! hints can be tested on synthetic runs.

use crate::model::live::Outstanding;
use crate::model::{AllocStats, CacheId};

/// Totals for one cache over the traced run.
#[derive(Clone, Debug, PartialEq)]
pub struct TracedCache {
    pub cache: CacheId,
    pub allocs: u64,
    pub frees: u64,
    /// Sum of requested sizes.
    pub bytes_req: u64,
    /// Sum of allocated (object) sizes.
    pub bytes_alloc: u64,
}

impl TracedCache {
    pub fn new(cache: CacheId) -> TracedCache {
        TracedCache {
            cache,
            allocs: 0,
            frees: 0,
            bytes_req: 0,
            bytes_alloc: 0,
        }
    }

    /// The `/proc/slabinfo` name rows are joined on.
    pub fn name(&self) -> String {
        self.cache.name()
    }

    /// Internal fragmentation: bytes lost to rounding requests up to the
    /// cache's object size.
    pub fn waste(&self) -> u64 {
        self.bytes_alloc.saturating_sub(self.bytes_req)
    }

    /// Objects allocated and not freed during the run (negative when the
    /// run freed more than it allocated).
    pub fn net_objs(&self) -> i64 {
        self.allocs as i64 - self.frees as i64
    }

    /// `net_objs` in bytes, at the mean allocated size.
    pub fn net_bytes(&self) -> i64 {
        if self.allocs == 0 {
            return 0;
        }
        let mean = self.bytes_alloc as f64 / self.allocs as f64;
        (self.net_objs() as f64 * mean).round() as i64
    }
}

/// One call site and one cache it allocated from. A call site using
/// several caches appears once per cache; a function with several call
/// sites once per call site: two calls in one function are two buffers.
#[derive(Clone, Debug, PartialEq)]
pub struct TracedSite {
    pub function: String,
    /// `function+0xoff`, as site rows' `location` names it (the caller's
    /// frame where the call site is an allocation wrapper).
    pub call_site: String,
    pub cache: CacheId,
    /// `stats.hist` is the histogram of requested sizes.
    pub stats: AllocStats,
    /// What it still holds at the end, when objects were tracked.
    /// (Objects the run allocated and still held at its end, when every
    /// object was tracked by address, `--sort growth`: exact per site, as
    /// `kheap leaks` counts them; frees of objects allocated before the
    /// run are not in it, nothing says which site made those.)
    pub held: Option<Outstanding>,
}

/// Everything traced over one run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TracedRun {
    pub duration_s: f64,
    pub caches: Vec<TracedCache>,
    pub sites: Vec<TracedSite>,
    /// What the tracer could not trace or name on this kernel (a hook it
    /// lacks, kfree's frees counted in the totals only), for the notes.
    pub skipped: Vec<String>,
    /// Every object was tracked by address (`--sort growth`): each site's
    /// `held` is known, and a cache's `frees` are the frees of the objects
    /// the run allocated (frees of older objects are not counted per cache
    /// then), so that allocations minus frees is what is still held.
    pub objects_tracked: bool,
}
