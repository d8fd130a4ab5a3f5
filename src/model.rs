//! The model: pure types and maths that every other layer builds on. Size
//! histograms, allocation statistics, waste, cache and site identities, the
//! counts every report row carries, and human-readable units. `snapshot`
//! holds what is read from the kernel, `live` the leak tracer's live
//! objects. Nothing here touches the kernel or libbpf, so it is unit-tested
//! without root; nothing here imports from the layers above (report,
//! render, cmd) or from the kernel layer.

pub mod backing;
pub mod identity;
pub mod kallsyms;
pub mod kernel_memory;
pub mod live;
pub mod malloc;
pub mod progress;
pub mod slab_loss;
pub mod snapshot;
pub mod source;
pub mod units;

// One path for the model's core types, `model::X`, whichever file holds
// them.
pub use identity::*;
pub use source::{PageUse, Source, Sources, VmapKind};
pub use units::*;

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
