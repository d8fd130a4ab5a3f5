//! Map keys as the model names them: sites, caches (by the names the
//! object recorded and SLUB's merges), cgroups and stack owners.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::path::Path;

use anyhow::Result;

use crate::kernel::maps;
use crate::kernel::skel::{c_str, types};
use crate::model::snapshot::{CgroupKey, CgroupSlot};
use crate::model::{
    merged_cache_name, CacheId, KmallocSlab, Owner, PageUse, SiteKey, Source, VmapKind,
    UNRESOLVED_PREFIX,
};
use crate::sys::slab_sysfs::{SlabSysfs, SYS_KERNEL_SLAB};

use super::tracer::Tracer;

impl<'obj> Tracer<'obj> {
    /// The caches' names by pointer; a cache SLUB merged others into
    /// names them too (`merged_cache_name`), in every view.
    pub(super) fn cache_names(&self) -> Result<HashMap<u64, String>> {
        Ok(self
            .cache_aliases()?
            .into_iter()
            .map(|(k, (n, aliases))| (k, merged_cache_name(&n, &aliases)))
            .collect())
    }

    /// The caches SLUB merged others into, by pointer.
    pub(super) fn merged_caches(&self) -> Result<HashSet<u64>> {
        Ok(self
            .cache_aliases()?
            .into_iter()
            .filter(|(_, (_, aliases))| !aliases.is_empty())
            .map(|(k, _)| k)
            .collect())
    }

    /// The caches' own names by pointer, with the names SLUB merged into
    /// each.
    fn cache_aliases(&self) -> Result<HashMap<u64, (String, Vec<String>)>> {
        let names: Vec<(u64, String)> =
            maps::read_hash::<u64, types::cache_name, _>(&self.skel.maps.cache_names)?
                .into_iter()
                .map(|(k, v)| (k, c_str(&v.name)))
                .collect();
        // Opened again when a cache came or went since (a merge happens
        // when a cache is created).
        let mut slab = self.slab_sysfs.borrow_mut();
        let no_sysfs = SlabSysfs::default();
        let fs = slab
            .current(Path::new(SYS_KERNEL_SLAB))
            .unwrap_or(&no_sysfs);
        Ok(names
            .into_iter()
            .map(|(k, n)| {
                let aliases = fs.aliases_of(&n);
                (k, (n, aliases))
            })
            .collect())
    }
}

/// A process's name as /proc says now; empty once it has exited.
pub(super) fn comm_now(tgid: u32) -> String {
    crate::sys::process_name(tgid).unwrap_or_default()
}

/// Who made the allocations of a stack entry (keyed so with
/// `Config::stack_owners`).
pub(super) fn stack_owner(k: &types::stack_key) -> Owner {
    if k.interrupt != 0 {
        Owner::Interrupt
    } else {
        Owner::Process {
            tgid: k.tgid,
            cgroup: k.cgroup,
        }
    }
}

/// The `procs` key of interrupt context's row (KHEAP_INTERRUPT_TGID in
/// bpf/kheap.h, checked in kmem's tests): above every tgid.
pub(super) const INTERRUPT_TGID: u32 = u32::MAX;

/// The process a `procs` key names; `None` for interrupt context's row.
pub(super) fn process_of_key(tgid: u32) -> Option<u32> {
    (tgid != INTERRUPT_TGID).then_some(tgid)
}

/// Cache names for one read of the maps. A cache's name is written before
/// the first counts of any entry that uses it, but entries read after the
/// names can be newer than them: a miss reads the names again, once, and
/// once more after each `entries_copied()`.
pub(super) struct Names<'t, 'obj> {
    tracer: &'t Tracer<'obj>,
    names: RefCell<HashMap<u64, String>>,
    reread: std::cell::Cell<bool>,
}

impl<'t, 'obj> Names<'t, 'obj> {
    pub(super) fn read(tracer: &'t Tracer<'obj>) -> Result<Self> {
        Ok(Names {
            tracer,
            names: RefCell::new(tracer.cache_names()?),
            reread: std::cell::Cell::new(false),
        })
    }

    /// Entries were copied from the maps since the names were read: the
    /// next miss among them reads the names again, which then hold every
    /// name those entries need.
    pub(super) fn entries_copied(&self) {
        self.reread.set(false);
    }

    fn refresh_for(&self, cache: u64) {
        let pointer = cache >= (1 << 32);
        if pointer && !self.reread.get() && !self.names.borrow().contains_key(&cache) {
            self.reread.set(true);
            if let Ok(names) = self.tracer.cache_names() {
                *self.names.borrow_mut() = names;
            }
        }
    }

    pub(super) fn site_key(&self, k: &types::site_key) -> SiteKey {
        self.refresh_for(k.cache);
        site_key(k, &self.names.borrow())
    }

    pub(super) fn cache_id(&self, cache: u64) -> CacheId {
        self.refresh_for(cache);
        cache_id(cache, 0, false, &self.names.borrow())
    }
}

pub(super) fn site_key(k: &types::site_key, names: &HashMap<u64, String>) -> SiteKey {
    let cache = match Source::from_raw(k.source) {
        Some(Source::Page) => CacheId::Pages {
            order: k.kmalloc_size,
            used_for: PageUse::from_raw(k.page_use),
        },
        Some(Source::Vmalloc) => CacheId::Vmalloc {
            area: VmapKind::from_raw(k.vmap_kind),
        },
        Some(Source::Percpu) => CacheId::Percpu,
        // A number kheap does not know is read as the slab's, whose
        // events carry a cache.
        Some(Source::Kmalloc) | None => {
            cache_id(k.cache, k.kmalloc_size, k.kmalloc_accounted != 0, names)
        }
    };
    SiteKey {
        call_site: k.call_site,
        cache,
    }
}

/// Names the cache of a key. kmalloc events (a size) carry the cache their
/// object lives in, or 0 above the kmalloc caches and where the kernel gives
/// no way to find it (the size class stands in), or
/// `KHEAP_CACHE_UNRESOLVED`. Classic tracepoints without a cache name key
/// by `(object size << 1) | 1`. A cache pointer whose name was not recorded
/// is labelled as unresolved, never by its address.
pub fn cache_id(
    cache: u64,
    kmalloc_size: u32,
    accounted: bool,
    names: &HashMap<u64, String>,
) -> CacheId {
    let named = names.get(&cache);
    if kmalloc_size != 0 {
        let slab = match (cache, named) {
            (0, _) => KmallocSlab::SizeClass,
            (_, Some(n)) if cache != KHEAP_CACHE_UNRESOLVED => KmallocSlab::Cache(n.clone()),
            _ => KmallocSlab::Unresolved,
        };
        return CacheId::Kmalloc {
            size: kmalloc_size as u64,
            // The charge only names a size class (kmalloc-cg-*). A cache the
            // slab named is one row whatever the charge: before 5.14,
            // charged and uncharged objects share kmalloc-<size> (seen on
            // 5.10 as two kmalloc-4k rows).
            accounted: accounted && !matches!(slab, KmallocSlab::Cache(_)),
            slab,
        };
    }
    if let Some(n) = named {
        return CacheId::Named(n.clone());
    }
    if cache < (1 << 32) && cache & 1 == 1 {
        return CacheId::ObjectSize(cache >> 1);
    }
    CacheId::Named(format!("{UNRESOLVED_PREFIX}cache]"))
}

/// KHEAP_CACHE_UNRESOLVED in bpf/kheap.h (checked in kmem's tests).
pub(super) const KHEAP_CACHE_UNRESOLVED: u64 = 2;
/// KHEAP_KFREE_CACHE_TAG in bpf/kheap.h (checked in kmem's tests).
pub(super) const KHEAP_KFREE_CACHE_TAG: u64 = 2;

/// The cache row a free belongs to. kfree's keys carry the tag bit
/// (bpf/kheap.h, KHEAP_KFREE_CACHE_TAG) and join the kmalloc row of their
/// cache when the run saw allocations from it (kmalloc rows are keyed by
/// size class and cache, not by name alone); the others are the cache's own.
pub(super) fn free_row(
    cache: u64,
    kfree_tags: bool,
    names: &Names<'_, '_>,
    kmalloc_rows: &HashMap<String, CacheId>,
) -> CacheId {
    if kfree_tags && cache & KHEAP_KFREE_CACHE_TAG != 0 {
        let id = names.cache_id(cache & !KHEAP_KFREE_CACHE_TAG);
        if let CacheId::Named(n) = &id {
            if let Some(row) = kmalloc_rows.get(n) {
                return row.clone();
            }
        }
        return id;
    }
    names.cache_id(cache)
}

/// A cgroup map key as the model names it.
pub(super) fn cgroup_key(k: &types::cgroup_key) -> CgroupKey {
    CgroupKey {
        slot: if k.interrupt != 0 {
            CgroupSlot::Interrupt
        } else {
            CgroupSlot::Cgroup(k.cgroup)
        },
        accounted: k.accounted != 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_keys_name_their_cache() {
        let mut names = HashMap::new();
        names.insert(0xffff888100042c00, "dentry".to_string());
        names.insert(0xffff888100043c00, "msg_msg-4k".to_string());
        let kmalloc = |slab| CacheId::Kmalloc {
            size: 4096,
            accounted: true,
            slab,
        };
        assert_eq!(
            cache_id(0, 4096, true, &names),
            kmalloc(KmallocSlab::SizeClass)
        );
        assert_eq!(
            cache_id(0xffff888100043c00, 4096, true, &names),
            CacheId::Kmalloc {
                size: 4096,
                accounted: false,
                slab: KmallocSlab::Cache("msg_msg-4k".into())
            }
        );
        // One row per named cache, charged or not (5.10's kmalloc-4k).
        assert_eq!(
            cache_id(0xffff888100043c00, 4096, false, &names),
            cache_id(0xffff888100043c00, 4096, true, &names)
        );
        assert_eq!(
            cache_id(KHEAP_CACHE_UNRESOLVED, 4096, true, &names),
            kmalloc(KmallocSlab::Unresolved)
        );
        assert_eq!(
            cache_id(0xffff888100044c00, 4096, true, &names).name(),
            "[unresolved kmalloc-4k]"
        );
        assert_eq!(
            cache_id(0xffff888100042c00, 0, false, &names),
            CacheId::Named("dentry".into())
        );
        assert_eq!(
            cache_id((192 << 1) | 1, 0, false, &names),
            CacheId::ObjectSize(192)
        );
        assert_eq!(
            cache_id(0xffff888100042d00, 0, false, &names).name(),
            "[unresolved cache]"
        );
    }
}
