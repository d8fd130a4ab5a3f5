//! The live objects of `leaks`: folded by site and stack, or read one by
//! one with their ages, measured on the kernel's tick.

use std::collections::HashMap;

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, ProgramInput};

use crate::kernel::maps;
use crate::kernel::skel::{from_bytes, types};
use crate::model::live::{
    jiffies_to_ns, nearest_hz, AgedOut, LeakEvents, LeakInput, LiveObject, Outstanding,
    OutstandingBySite, OutstandingRead, Unseen,
};
use crate::model::snapshot::{CgroupKey, CgroupSlot};
use crate::model::SiteKey;

use super::asked::{LiveAt, TrackedObject};
use super::config::LiveConfig;
use super::keys::{comm_now, site_key, Names};
use super::tracer::Tracer;

/// The slots of the object table that are taken, read from its buckets.
fn table_slots_taken(table: &super::tracer::LiveTable) -> Vec<u32> {
    let mut taken = Vec::new();
    for b in 0..table.buckets.entries() {
        let Some(bucket) = table.buckets.get::<types::live_bucket>(b) else {
            continue;
        };
        for (way, &ptr) in bucket.ptr.iter().enumerate() {
            if ptr != 0 {
                taken.push(b * bucket.ptr.len() as u32 + way as u32);
            }
        }
    }
    taken
}

/// What a snapshot copies of the live objects, in the order it reads them
/// (read_snapshot says why): objects found freed unseen, the live objects,
/// then the clock their ages are measured against.
pub(super) struct LiveRead {
    pub lcfg: LiveConfig,
    pub unseen: Vec<(types::site_key, types::site_unseen)>,
    pub objects: Vec<TrackedObject>,
    pub now: types::clock_sample,
}

impl<'obj> Tracer<'obj> {
    /// Calls `visit` with every tracked object: those in the object
    /// table's slots, then those spilled into the hash map. The table is
    /// read from memory (its arrays are mapped): first which slots are
    /// taken, then those slots. An object is written right after its
    /// address is published, in the same BPF program, so a slot seen taken
    /// is written by the time the second pass reads it (a program preempted
    /// in between, on a preemptible kernel, could leave one object read
    /// with the slot's previous contents, in that reading only); one freed
    /// in between is reported once, as it was, as a hash map entry deleted
    /// during its read would be.
    pub(super) fn visit_live(&self, visit: &mut dyn FnMut(&types::live_obj)) -> Result<()> {
        if let Some(table) = &self.live_table {
            for slot in table_slots_taken(table) {
                if let Some(o) = table.slots.get::<types::live_obj>(slot) {
                    visit(&o);
                }
            }
        }
        maps::visit_hash_values::<types::live_obj, _>(&self.skel.maps.live, visit)
    }

    /// [`Tracer::visit_live`] with each object's address and where it was
    /// read.
    pub(super) fn visit_live_at(&self, visit: &mut dyn FnMut(&TrackedObject)) -> Result<()> {
        if let Some(table) = &self.live_table {
            let ways = super::config::LIVE_WAYS;
            for slot in table_slots_taken(table) {
                let Some(bucket) = table.buckets.get::<types::live_bucket>(slot / ways) else {
                    continue;
                };
                if let Some(obj) = table.slots.get::<types::live_obj>(slot) {
                    visit(&TrackedObject {
                        ptr: bucket.ptr[(slot % ways) as usize],
                        at: LiveAt::Slot(slot),
                        obj,
                    });
                }
            }
        }
        maps::visit_hash_entries::<u64, types::live_obj, _>(
            &self.skel.maps.live,
            &mut |ptr, obj| {
                visit(&TrackedObject {
                    ptr: *ptr,
                    at: LiveAt::Spilled,
                    obj: *obj,
                })
            },
        )
    }

    /// Forgets the `n` oldest tracked objects (`kheap serve`'s ageing,
    /// `model::live::objects_to_age_out`), while the programs run: a slot
    /// of the object table is freed with the compare-and-swap its
    /// programs use (one the object's own free emptied first, or that a
    /// new object took, is left alone), a spilled object is deleted from
    /// the hash map and uncounted from `live_spilled` as its free would.
    /// Returns what was forgotten, by site; each forgotten object's free is
    /// then counted as untracked (frees_untracked), as one of an object
    /// allocated before tracing is.
    pub fn age_out_oldest(&mut self, n: u64) -> Result<AgedOut> {
        enum At {
            Slot { bucket: u32, way: usize, ptr: u64 },
            Spilled(u64),
        }
        let mut all: Vec<(types::live_obj, At)> = Vec::new();
        if let Some(table) = &self.live_table {
            for b in 0..table.buckets.entries() {
                let Some(bucket) = table.buckets.get::<types::live_bucket>(b) else {
                    continue;
                };
                for (way, &ptr) in bucket.ptr.iter().enumerate() {
                    let slot = b * bucket.ptr.len() as u32 + way as u32;
                    if ptr == 0 {
                        continue;
                    }
                    if let Some(o) = table.slots.get::<types::live_obj>(slot) {
                        all.push((
                            o,
                            At::Slot {
                                bucket: b,
                                way,
                                ptr,
                            },
                        ));
                    }
                }
            }
        }
        for (ptr, o) in maps::read_hash_entries::<u64, types::live_obj, _>(&self.skel.maps.live)? {
            all.push((o, At::Spilled(ptr)));
        }
        all.sort_unstable_by_key(|(o, _)| o.ts);
        all.truncate(n.min(all.len() as u64) as usize);
        let mut raw: HashMap<[u8; std::mem::size_of::<types::site_key>()], Outstanding> =
            HashMap::new();
        let mut youngest_ts = None;
        let mut unspilled = 0u64;
        for (o, at) in &all {
            let forgotten = match *at {
                At::Slot { bucket, way, ptr } => self
                    .live_table
                    .as_ref()
                    .is_some_and(|t| t.buckets.compare_and_clear(bucket, way, ptr)),
                At::Spilled(ptr) => {
                    let deleted = self.skel.maps.live.delete(&ptr.to_ne_bytes()).is_ok();
                    unspilled += u64::from(deleted);
                    deleted
                }
            };
            if !forgotten {
                continue;
            }
            // SAFETY: a plain C struct of integers, without implicit padding.
            let site = unsafe { plain::as_bytes(&o.site) };
            *raw.entry(site.try_into().expect("site_key size"))
                .or_default() += Outstanding::one(o.bytes_alloc as u64);
            youngest_ts = youngest_ts.max(Some(o.ts));
        }
        if unspilled > 0 && self.live_table.is_some() {
            let bss = self
                .skel
                .maps
                .bss_data
                .as_deref_mut()
                .context("the BPF object has no .bss section")?;
            // SAFETY: the mapped .bss, which the programs change only with
            // atomic adds; aligned (a u64 field of a C struct).
            let spilled = unsafe { std::sync::atomic::AtomicU64::from_ptr(&mut bss.live_spilled) };
            spilled.fetch_sub(unspilled, std::sync::atomic::Ordering::SeqCst);
        }
        let now = self.clock()?;
        let hz = self.tick_rate(&now)?;
        let names = Names::read(self)?;
        let mut out = AgedOut {
            youngest_age_ns: youngest_ts
                .map_or(0, |ts| jiffies_to_ns(now.jiffies.saturating_sub(ts), hz)),
            ..AgedOut::default()
        };
        for (site, v) in raw {
            let site = names.site_key(&from_bytes::<types::site_key>(&site));
            *out.by_site.entry(site).or_default() += v;
        }
        Ok(out)
    }

    /// The live objects folded by site and stack (0: no stack sampled),
    /// with the live map's full-map drops so far. Folded while read: no
    /// allocation per object, so a full map of 262,144 objects costs one
    /// pass. `None` without live-object tracking.
    pub fn outstanding(&self) -> Result<Option<OutstandingRead>> {
        if self.cfg.live.is_none() {
            return Ok(None);
        }
        let m = &self.skel.maps;
        // Raw keys first (the site key's bytes), names once per group.
        type RawKey = ([u8; std::mem::size_of::<types::site_key>()], i64);
        let mut raw: HashMap<RawKey, Outstanding> = HashMap::new();
        let mut by_process: HashMap<Option<u32>, Outstanding> = HashMap::new();
        let per_process = self.cfg.by_process;
        self.visit_live(&mut |o| {
            // SAFETY: a plain C struct of integers, without implicit padding.
            let site = unsafe { plain::as_bytes(&o.site) };
            let k = (site.try_into().expect("site_key size"), o.stack_id);
            *raw.entry(k).or_default() += Outstanding::one(o.bytes_alloc as u64);
            if per_process {
                // Every event is tested for interrupt context (by_process).
                *by_process
                    .entry((o.interrupt == 0).then_some(o.tgid))
                    .or_default() += Outstanding::one(o.bytes_alloc as u64);
            }
        })?;
        let names = Names::read(self)?;
        let mut groups: HashMap<(SiteKey, i64), Outstanding> = HashMap::new();
        for ((site, stack_id), v) in raw {
            let site = names.site_key(&from_bytes::<types::site_key>(&site));
            *groups.entry((site, stack_id)).or_default() += v;
        }
        let c: types::counters = maps::read_percpu_slot0(&m.counters)?;
        Ok(Some(OutstandingRead {
            groups,
            by_process,
            map_full_live: c.map_full_live,
        }))
    }

    /// The live objects folded by site and, with `by_cgroup`, by the
    /// cgroup (or interrupt context) that allocated them: one reading of
    /// leaks' timeline. One pass over the object map, batched, with no
    /// allocation per object. `None` without live-object tracking.
    pub fn outstanding_by_site(&self, by_cgroup: bool) -> Result<Option<OutstandingBySite>> {
        if self.cfg.live.is_none() {
            return Ok(None);
        }
        type RawKey = ([u8; std::mem::size_of::<types::site_key>()], u64, bool);
        let mut raw: HashMap<RawKey, Outstanding> = HashMap::new();
        self.visit_live(&mut |o| {
            // SAFETY: a plain C struct of integers, without implicit padding.
            let site = unsafe { plain::as_bytes(&o.site) };
            let (cgroup, interrupt) = match by_cgroup {
                true => (o.cgroup, o.interrupt != 0),
                false => (0, false),
            };
            let k = (site.try_into().expect("site_key size"), cgroup, interrupt);
            *raw.entry(k).or_default() += Outstanding::one(o.bytes_alloc as u64);
        })?;
        let names = self.cache_names()?;
        let mut out = OutstandingBySite::new();
        for ((site, cgroup, interrupt), v) in raw {
            let site = site_key(&from_bytes::<types::site_key>(&site), &names);
            let slot = by_cgroup.then_some(if interrupt {
                CgroupSlot::Interrupt
            } else {
                CgroupSlot::Cgroup(cgroup)
            });
            *out.entry((site, slot)).or_default() += v;
        }
        Ok(Some(out))
    }

    /// The leaks part of a snapshot, from what read_snapshot copied of the
    /// live objects, the event counters and each program's misses.
    pub(super) fn leak_input(
        &self,
        read: LiveRead,
        c: &types::counters,
        key: &dyn Fn(&types::site_key) -> SiteKey,
        recursion_misses: Vec<(String, u64)>,
    ) -> Result<LeakInput> {
        let LiveRead {
            lcfg,
            unseen: unseen_read,
            objects: live,
            now,
        } = read;
        let hz = self.tick_rate(&now)?;
        // After detach, ages are as at the end of the run (the report's
        // duration ends there too), not at this later read.
        let at = self.ended.unwrap_or(now);
        let mut unseen: HashMap<SiteKey, Unseen> = HashMap::new();
        for (k, u) in unseen_read {
            // Two kernel caches can share a name: their entries are merged.
            let e = unseen.entry(key(&k)).or_default();
            e.count += u.count;
            e.bytes_alloc += u.bytes_alloc;
        }
        let mut comms = HashMap::new();
        for t in &live {
            comms
                .entry(t.obj.tgid)
                .or_insert_with(|| comm_now(t.obj.tgid));
        }
        let asked = self.asked.borrow();
        Ok(LeakInput {
            live: live
                .iter()
                .map(|t| (&t.obj, asked.name_of(t.ptr, t.obj.ts)))
                .map(|(o, asked_cache)| LiveObject {
                    site: key(&o.site),
                    stack_id: (o.stack_id != 0).then_some(o.stack_id),
                    bytes_req: o.bytes_req as u64,
                    bytes_alloc: o.bytes_alloc as u64,
                    age_ns: jiffies_to_ns(at.jiffies.saturating_sub(o.ts), hz),
                    tgid: o.tgid,
                    cgroup: CgroupKey {
                        slot: if o.interrupt != 0 {
                            CgroupSlot::Interrupt
                        } else {
                            CgroupSlot::Cgroup(o.cgroup)
                        },
                        accounted: o.accounted != 0,
                    },
                    asked_cache,
                })
                .collect(),
            unseen,
            events: LeakEvents {
                frees_null: c.frees_null,
                frees_untracked: c.frees_untracked,
                reused_live: c.reused_live,
                map_full_live: c.map_full_live,
                map_busy: c.map_busy,
                page_bytes_freed_untracked: c.page_bytes_freed_untracked,
            },
            sample_every: lcfg.sample_every.max(1),
            min_age_ns: 0,
            max_objects: lcfg.max_objects,
            recursion_misses,
            kind: "leaks".to_string(),
            comms,
            contexts_known: self.cfg.tests_context(),
        })
    }

    /// Reads the kernel's jiffies and CLOCK_MONOTONIC together, by running
    /// the object's `clock` program.
    pub(super) fn clock(&self) -> Result<types::clock_sample> {
        self.skel
            .progs
            .clock
            .test_run(ProgramInput::default())
            .context("running the BPF clock program")?;
        let bss = self
            .skel
            .maps
            .bss_data
            .as_deref()
            .context("the BPF object has no .bss section")?;
        // The kernel wrote it behind the compiler's back.
        Ok(unsafe { std::ptr::read_volatile(&bss.clock_now) })
    }

    /// Kernel ticks per second, from the jiffies and nanoseconds elapsed
    /// since the tracer started (at least 200 ms, waited for if need be),
    /// snapped to the nearest rate Linux offers. Ages are measured against
    /// `now`, not against the later sample a short run waits for.
    fn tick_rate(&self, now: &types::clock_sample) -> Result<u64> {
        const MIN_NS: u64 = 200_000_000;
        let mut later = *now;
        let elapsed = later.ns.saturating_sub(self.clock0.ns);
        if elapsed < MIN_NS {
            std::thread::sleep(std::time::Duration::from_nanos(MIN_NS - elapsed));
            later = self.clock()?;
        }
        Ok(nearest_hz(
            later.jiffies.saturating_sub(self.clock0.jiffies),
            later.ns.saturating_sub(self.clock0.ns),
        ))
    }
}
