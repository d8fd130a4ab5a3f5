//! leaks: the cache a merged cache's objects were asked for, read from the
//! objects themselves (bpf/kheap/asked_cache.c). SLUB hands the code that
//! creates a cache it merges the cache it merged it into, so the
//! allocation events name that one; a socket names its protocol, whose
//! cache its code asked for. An object is named only where all of this
//! holds: its cache has aliases; its call site is in a function that
//! allocates a socket from its protocol's cache (`SOCK_ALLOCATORS`); it is
//! at least two ticks old (sk_alloc() zeroes the socket and names its
//! protocol as soon as the allocator returns it); its protocol's cache is
//! the very cache it was allocated from; and it is still the same tracked
//! allocation once read. Anything else stays not known.

use std::collections::{HashMap, HashSet};

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags, ProgramInput};

use crate::kernel::skel::{c_str, from_bytes, types};
use crate::model::Source;
use crate::symbolize::{KernelSymbols, Symbolize};

use super::tracer::Tracer;

/// The functions whose kmem_cache_alloc() allocates a socket from its
/// protocol's cache: sk_prot_alloc(), or, where the compiler inlined it,
/// its callers sk_alloc() and sk_clone_lock().
pub const SOCK_ALLOCATORS: [&str; 3] = ["sk_prot_alloc", "sk_alloc", "sk_clone_lock"];

/// Objects one read names at most; the rest wait for the next read.
const PER_READ: usize = 1 << 16;

/// Objects one run of the program reads (KHEAP_ASKED_BATCH in bpf/kheap.h).
pub(super) const KHEAP_ASKED_BATCH: usize = 64;

/// Where a tracked object was read: a slot of the object table, or the
/// hash map it spills into (keyed by its address).
#[derive(Clone, Copy, Debug)]
pub(super) enum LiveAt {
    Slot(u32),
    Spilled,
}

/// A tracked object as read, with its address and where it was.
#[derive(Clone, Copy)]
pub(super) struct TrackedObject {
    pub ptr: u64,
    pub at: LiveAt,
    pub obj: types::live_obj,
}

impl<'obj> Tracer<'obj> {
    /// `objects` were read after the clock said `before`.
    pub(super) fn learn_asked(
        &self,
        objects: &[TrackedObject],
        before: &types::clock_sample,
    ) -> Result<()> {
        if self.ended.is_some() {
            return Ok(());
        }
        let merged = self.merged_caches()?;
        let mut asked = self.asked.borrow_mut();
        // What is no longer tracked (as the same allocation) is forgotten.
        if !asked.by_ptr.is_empty() {
            let mut kept = HashMap::new();
            for t in objects {
                if let Some(e) = asked.by_ptr.remove(&t.ptr) {
                    if e.0 == t.obj.ts {
                        kept.insert(t.ptr, e);
                    }
                }
            }
            asked.by_ptr = kept;
        }
        let kmalloc = Source::Kmalloc.raw();
        let mut candidates: Vec<&TrackedObject> = objects
            .iter()
            .filter(|t| {
                t.obj.site.source == kmalloc
                    && merged.contains(&t.obj.site.cache)
                    && t.obj.ts.saturating_add(2) <= before.jiffies
                    && !asked.by_ptr.contains_key(&t.ptr)
            })
            .collect();
        if candidates.is_empty() {
            return Ok(());
        }
        let unknown_sites: Vec<u64> = candidates
            .iter()
            .map(|t| t.obj.site.call_site)
            .filter(|s| !asked.sock_sites.contains_key(s))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        if !unknown_sites.is_empty() {
            let syms = asked.syms.get_or_insert_with(|| KernelSymbols::new(None));
            let frames = syms.symbolize(&unknown_sites);
            for (site, f) in unknown_sites.iter().zip(frames) {
                let sock = f
                    .function
                    .as_deref()
                    .is_some_and(|name| SOCK_ALLOCATORS.contains(&name));
                asked.sock_sites.insert(*site, sock);
            }
        }
        candidates.retain(|t| asked.sock_sites[&t.obj.site.call_site]);
        candidates.truncate(PER_READ);
        for batch in candidates.chunks(KHEAP_ASKED_BATCH) {
            let names = self.run_asked_batch(batch)?;
            for (t, name) in batch.iter().zip(names) {
                if self.still_tracked(t) {
                    asked.by_ptr.insert(t.ptr, (t.obj.ts, name));
                }
            }
        }
        Ok(())
    }

    /// Runs the `asked_cache` program on one batch of objects.
    fn run_asked_batch(&self, batch: &[&TrackedObject]) -> Result<Vec<Option<String>>> {
        let mut b = types::asked_batch::default();
        for (slot, t) in b.slot.iter_mut().zip(batch) {
            slot.obj = t.ptr;
            slot.cache = t.obj.site.cache;
        }
        let map = &self.skel.maps.asked_batch;
        let zero = 0u32.to_ne_bytes();
        // SAFETY: a plain C struct of integers and bytes, without padding.
        map.update(&zero, unsafe { plain::as_bytes(&b) }, MapFlags::ANY)
            .context("writing the objects to name")?;
        self.skel
            .progs
            .asked_cache
            .test_run(ProgramInput::default())
            .context("running the BPF asked_cache program")?;
        let out = map
            .lookup(&zero, MapFlags::ANY)
            .context("reading the objects' names")?
            .context("the asked_batch map has no entry")?;
        let b = from_bytes::<types::asked_batch>(&out);
        Ok(b.slot[..batch.len()]
            .iter()
            .map(|s| Some(c_str(&s.name)).filter(|n| !n.is_empty()))
            .collect())
    }

    /// Whether `t` is still tracked as the allocation it was read as: at
    /// its address, with its stamp and site. An object freed since, and
    /// one whose address a later allocation took (younger, so another
    /// stamp), is not.
    fn still_tracked(&self, t: &TrackedObject) -> bool {
        let now = match t.at {
            LiveAt::Slot(slot) => {
                let Some(table) = &self.live_table else {
                    return false;
                };
                let ways = super::config::LIVE_WAYS;
                let Some(bucket) = table.buckets.get::<types::live_bucket>(slot / ways) else {
                    return false;
                };
                if bucket.ptr[(slot % ways) as usize] != t.ptr {
                    return false;
                }
                table.slots.get::<types::live_obj>(slot)
            }
            LiveAt::Spilled => self
                .skel
                .maps
                .live
                .lookup(&t.ptr.to_ne_bytes(), MapFlags::ANY)
                .ok()
                .flatten()
                .map(|v| from_bytes::<types::live_obj>(&v)),
        };
        now.is_some_and(|o| {
            o.ts == t.obj.ts
                && o.site.call_site == t.obj.site.call_site
                && o.site.cache == t.obj.site.cache
        })
    }
}
