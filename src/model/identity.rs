//! Which cache and which call site an allocation belongs to, and how
//! caches are named (kmalloc size classes, merged caches, page, vmalloc and
//! percpu rows).

use super::source::{PageUse, Source, VmapKind};
use super::units::human_size;

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

    /// The object size of a kmalloc bucket cache (`msg_msg-2k`: a
    /// `kmem_buckets` copy of the size classes that one purpose's
    /// kmalloc() calls use, `CONFIG_SLAB_BUCKETS`), as opposed to a size
    /// class every kmalloc() of the size shares. Known only where the
    /// object's slab names the cache (`KmallocSlab::Cache`).
    pub fn kmalloc_bucket(&self) -> Option<u64> {
        match self {
            CacheId::Kmalloc {
                size,
                slab: KmallocSlab::Cache(name),
                ..
            } if *size <= KMALLOC_MAX_CACHE_SIZE && !is_kmalloc_size_class(name) => Some(*size),
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
