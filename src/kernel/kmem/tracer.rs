//! The tracer: the loaded object, its links and what a read needs to
//! remember between reads.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use libbpf_rs::Link;

use crate::kernel::attach::{Fallback, Mechanism};
use crate::kernel::features::Tracefs;
use crate::kernel::maps::MappedArray;
use crate::kernel::skel::{types, KheapSkel};
use crate::sys::slab_sysfs::WatchedSlabSysfs;

use crate::model::SiteKey;

use super::config::Config;

pub struct Tracer<'obj> {
    pub(super) skel: KheapSkel<'obj>,
    pub(super) links: Vec<Link>,
    pub(super) cfg: Config,
    pub(super) mech: Mechanism,
    /// How hooks whose tracepoint this kernel lacks attach to their
    /// function instead (vmalloc before 6.2), if any does.
    pub(super) fallback: Option<Fallback>,
    /// The programs attached (not a kprobe path's entry programs), each
    /// by the tracepoint it is attached to, and its name.
    pub(super) programs: Vec<(&'static str, String)>,
    /// Hook → how it is attached ("kmalloc: tp_btf").
    pub attached: Vec<String>,
    /// Hooks not attached, with the reason (and, where this kernel gives
    /// no way to find the cache of a kmalloc object, why).
    pub skipped: Vec<String>,
    /// How the cache of a kmalloc object is found, or why it is not.
    pub kmalloc_caches: String,
    /// kfree events name their cache (`start::kfree_caches_traced`).
    pub kfree_caches: bool,
    /// The kernel memory of the run's BPF maps, as the kernel counts it
    /// (`model::kernel_memory`): the kmem object's, its object store and,
    /// with `--latency`, the latency object's.
    pub kernel_memory: u64,
    /// Stack traces already read, by id (a hash of their frames: an id
    /// always means the same frames), so a refreshing view reads each once.
    pub(super) stack_cache: RefCell<HashMap<i64, Vec<u64>>>,
    /// Sites that held a slot on some CPU at the last read
    /// (bpf/kheap/site_slots.c). A slot is held for the run, so idle aging
    /// leaves these alone without reading the slots again.
    pub(super) slot_sites: RefCell<HashSet<SiteKey>>,
    /// The site slots of every CPU, mapped read-only: a read looks at each
    /// slot's count in place and copies only the slots in use.
    pub(super) site_slots: MappedArray,
    /// Which caches SLUB merged (/sys/kernel/slab), read again when a
    /// cache comes or goes.
    pub(super) slab_sysfs: RefCell<WatchedSlabSysfs>,
    /// leaks' object table, mapped (`kheap/live_objects.c`); None without
    /// one (not leaks, or no BPF atomics: the hash map holds every object).
    pub(super) live_table: Option<LiveTable>,
    /// leaks: which cache the code of merged caches' objects asked for
    /// (`asked`).
    pub(super) asked: RefCell<AskedCaches>,
    /// The clock when the programs were loaded, to measure the tick rate
    /// that turns live objects' jiffies into ages.
    pub(super) clock0: types::clock_sample,
    /// The clock when the programs were detached: the end of the run, the
    /// moment the report's ages are taken at (its duration's end too).
    pub(super) ended: Option<types::clock_sample>,
    // Held so a tracefs kheap mounted itself stays mounted while attached.
    pub(super) _tracefs: Option<Tracefs>,
}

impl Tracer<'_> {
    /// Drops the links newest first: the reverse of the attach order.
    pub(super) fn drop_links(&mut self) {
        while let Some(link) = self.links.pop() {
            drop(link);
        }
    }
}

impl Drop for Tracer<'_> {
    fn drop(&mut self) {
        self.drop_links();
    }
}

/// The two arrays of leaks' object table, mapped (the buckets writable:
/// `Tracer::age_out_oldest` frees their slots).
pub(super) struct LiveTable {
    pub buckets: MappedArray,
    pub slots: MappedArray,
}

/// What the tracer learned of the objects of merged caches (`asked`).
#[derive(Default)]
pub(super) struct AskedCaches {
    /// By address: the allocation read (its jiffies stamp) and the name of
    /// the cache its code asked for, or `None` when the object did not
    /// prove one.
    pub(super) by_ptr: HashMap<u64, (u64, Option<String>)>,
    /// Call sites by whether they allocate sockets (`asked::SOCK_ALLOCATORS`).
    pub(super) sock_sites: HashMap<u64, bool>,
    pub(super) syms: Option<crate::symbolize::KernelSymbols>,
}

impl AskedCaches {
    /// The cache the code of the allocation `ts` at `ptr` asked for, where
    /// it was proven.
    pub fn name_of(&self, ptr: u64, ts: u64) -> Option<String> {
        match self.by_ptr.get(&ptr) {
            Some((t, name)) if *t == ts => name.clone(),
            _ => None,
        }
    }
}
