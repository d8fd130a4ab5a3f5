//! One read of the maps into a model snapshot, and the deletion of idle
//! keys (`top`).

use std::collections::{HashMap, HashSet};

use anyhow::Result;
use libbpf_rs::{MapCore, MapFlags};

use crate::kernel::maps;
use crate::kernel::skel::{c_str, from_bytes, types};
use crate::model::snapshot::{CgroupKey, EventCounters, IdleKeys, Snapshot};
use crate::model::{progress, CacheId, KmallocSlab, Owner, SiteKey, Source};

use super::keys::{
    cgroup_key, comm_now, free_row, process_of_key, stack_owner, Names, INTERRUPT_TGID,
};
use super::live::LiveRead;
use super::stats::ProgramCounters;
use super::tracer::Tracer;

impl<'obj> Tracer<'obj> {
    /// Capacity of the per-cgroup map (`--by cgroup`).
    pub fn cgroup_capacity(&self) -> u32 {
        self.skel.maps.cgroups.max_entries()
    }

    /// Entries the per-process map holds (`by_process`).
    pub fn process_capacity(&self) -> u32 {
        self.skel.maps.procs.max_entries()
    }

    /// The cgroup v2 ids counted so far (per-cgroup rows and processes'
    /// cgroups), so their paths can be learned while the cgroups exist.
    pub fn cgroup_ids(&self) -> Result<Vec<u64>> {
        let m = &self.skel.maps;
        let mut ids = Vec::new();
        if self.cfg.by_cgroup {
            for raw in maps::keys(&m.cgroups)? {
                let k = from_bytes::<types::cgroup_key>(&raw);
                if k.interrupt == 0 {
                    ids.push(k.cgroup);
                }
            }
        }
        if self.cfg.by_process {
            let infos = maps::read_hash::<u32, types::proc_info, _>(&m.proc_comms)?;
            ids.extend(infos.values().map(|i| i.cgroup).filter(|&id| id != 0));
        }
        if self.cfg.stacks_by_owner() {
            for raw in maps::keys(&m.stacks)? {
                let k = from_bytes::<types::stack_key>(&raw);
                if k.interrupt == 0 && k.cgroup != 0 {
                    ids.push(k.cgroup);
                }
            }
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    // The count is the first word of a slot (bpf/kheap.h, struct site_slot).
    const SLOT_COUNT_AT_ZERO: () = assert!(
        std::mem::offset_of!(types::site_slot, stats) == 0
            && std::mem::offset_of!(types::alloc_stats, count) == 0
    );

    /// The key and counts of every CPU's slots in use, read in place: each
    /// slot's count, then the whole slot only where it is above zero.
    fn slots_in_use(&self) -> Vec<(types::site_key, types::alloc_stats)> {
        let () = Self::SLOT_COUNT_AT_ZERO;
        let slots = &self.site_slots;
        let mut in_use = Vec::new();
        for i in 0..slots.entries() {
            // The count is the slot's first word, and a claim writes the
            // key before it (bpf/kheap.h, struct site_slot): read after
            // the count, the key is the claim's.
            if slots.get::<u64>(i).unwrap_or(0) == 0 {
                continue;
            }
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            if let Some(slot) = slots.get::<types::site_slot>(i) {
                in_use.push((slot.key, slot.stats));
            }
        }
        in_use
    }

    /// The frames of a stack, read once per run.
    fn stack_frames(&self, id: i64) -> Result<Option<Vec<u64>>> {
        if let Some(frames) = self.stack_cache.borrow().get(&id) {
            return Ok(Some(frames.clone()));
        }
        let frames = maps::read_stack(&self.skel.maps.stack_traces, &id.to_ne_bytes())?;
        if let Some(f) = &frames {
            self.stack_cache.borrow_mut().insert(id, f.clone());
        }
        Ok(frames)
    }

    /// Reads and merges every map; with live-object tracking, also every
    /// tracked object with its age now.
    pub fn snapshot(&self) -> Result<Snapshot> {
        self.read_snapshot(true)
    }

    /// The counters of [`Tracer::snapshot`] without the live objects (which
    /// [`Tracer::outstanding`] folds more cheaply): `leaks` stays `None`.
    pub fn counts_snapshot(&self) -> Result<Snapshot> {
        self.read_snapshot(false)
    }

    fn read_snapshot(&self, with_live: bool) -> Result<Snapshot> {
        let m = &self.skel.maps;
        // Read while events keep arriving, in the order that keeps every
        // site adding up (allocated >= outstanding + freed unseen): objects
        // found freed unseen, then the live objects (and the clock their
        // ages are measured against), then the allocation totals. An object
        // whose address comes back between two reads is then counted as
        // freed, never twice.
        let live = match self.cfg.live.filter(|_| with_live) {
            Some(lcfg) => {
                let unseen =
                    maps::read_counts::<types::site_key, types::site_unseen, _>(&m.unseen)?;
                // The clock before the objects too: which are old enough
                // to be named (`asked`).
                let before = self.clock()?;
                let mut objects = Vec::new();
                self.visit_live_at(&mut |t| objects.push(*t))?;
                if let Err(e) = self.learn_asked(&objects, &before) {
                    eprintln!("kheap: warning: merged caches' objects not named: {e:#}");
                }
                let now = self.clock()?;
                Some(LiveRead {
                    lcfg,
                    unseen,
                    objects,
                    now,
                })
            }
            None => None,
        };
        let mut snap = Snapshot::default();
        // Two kernel caches can share a name: their entries are merged.
        // A site's counts are its entry in the map plus its slot on each
        // CPU (bpf/kheap/site_slots.c); no event is in two of them. The maps
        // every event counts in (sites, slots, processes, cgroups) are
        // copied one after the other, before the caches' names are read: a
        // new name can send that read through /sys/kernel/slab, slow
        // enough under emulation that counts read after it would end top's
        // interval late, or differ from the sites' by the events between.
        let in_map = maps::read_counts::<types::site_key, types::alloc_stats, _>(&m.sites)?;
        let in_slots = self.slots_in_use();
        let procs = if self.cfg.by_process {
            maps::read_counts::<u32, types::alloc_stats, _>(&m.procs)?
        } else {
            Vec::new()
        };
        let cgroups = if self.cfg.by_cgroup {
            maps::read_counts::<types::cgroup_key, types::alloc_stats, _>(&m.cgroups)?
        } else {
            Vec::new()
        };
        let names = Names::read(self)?;
        let key = |k: &types::site_key| names.site_key(k);
        for (k, v) in in_map {
            *snap.sites.entry(key(&k)).or_default() += v.into();
        }
        let mut slot_sites = self.slot_sites.borrow_mut();
        for (k, v) in in_slots {
            let site = key(&k);
            *snap.sites.entry(site.clone()).or_default() += v.into();
            slot_sites.insert(site);
        }
        drop(slot_sites);
        let comms: HashMap<u32, (String, u64)> =
            if self.cfg.by_process || self.cfg.stacks_by_owner() {
                maps::read_hash::<u32, types::proc_info, _>(&m.proc_comms)?
                    .into_iter()
                    .map(|(k, v)| (k, (c_str(&v.comm), v.cgroup)))
                    .collect()
            } else {
                HashMap::new()
            };
        snap.comms = comms.iter().map(|(&k, (c, _))| (k, c.clone())).collect();
        for (tgid, v) in procs {
            let Some(pid) = process_of_key(tgid) else {
                snap.procs.insert(None, (String::new(), v.into()));
                continue;
            };
            let (comm, cgroup) = comms.get(&pid).cloned().unwrap_or_default();
            if cgroup != 0 {
                snap.proc_cgroups.insert(pid, cgroup);
            }
            snap.procs.insert(Some(pid), (comm, v.into()));
        }
        for (k, v) in cgroups {
            *snap.cgroups.entry(cgroup_key(&k)).or_default() += v.into();
        }
        let sites_from_stacks = self.cfg.sites_from_stacks();
        let owners = self.cfg.stacks_by_owner();
        let stacks = maps::read_counts::<types::stack_key, types::alloc_stats, _>(&m.stacks)?;
        names.entries_copied();
        for (k, v) in stacks {
            let id = k.stack_id;
            if let std::collections::hash_map::Entry::Vacant(e) = snap.stack_frames.entry(id) {
                if let Some(frames) = self.stack_frames(id)? {
                    e.insert(frames);
                }
            }
            let site = key(&k.site);
            if sites_from_stacks {
                *snap.sites.entry(site.clone()).or_default() += v.into();
            }
            if owners {
                *snap
                    .stack_owners
                    .entry((site.clone(), id))
                    .or_default()
                    .entry(stack_owner(&k))
                    .or_default() += v.into();
            }
            *snap.stacks.entry((site, id)).or_default() += v.into();
        }
        // A process the name map had no room for: its name now, if alive.
        let owner_pids = snap.stack_owners.values().flat_map(|m| m.keys());
        for owner in owner_pids {
            if let Owner::Process { tgid, .. } = *owner {
                snap.comms.entry(tgid).or_insert_with(|| comm_now(tgid));
            }
        }
        let kfree_tags = self.kfree_caches;
        let kmalloc_rows: HashMap<String, CacheId> = snap
            .sites
            .keys()
            .filter_map(|k| match &k.cache {
                CacheId::Kmalloc {
                    slab: KmallocSlab::Cache(n),
                    ..
                } => Some((n.clone(), k.cache.clone())),
                _ => None,
            })
            .collect();
        for (cache, v) in maps::read_counts::<u64, types::cache_frees, _>(&m.cache_frees)? {
            let row = free_row(cache, kfree_tags, &names, &kmalloc_rows);
            *snap.cache_frees.entry(row).or_default() += v.frees;
        }
        let c: types::counters = maps::read_percpu_slot0(&m.counters)?;
        for source in self.cfg.sources.iter().filter(|&s| s != Source::Kmalloc) {
            snap.source_frees
                .insert(source, c.source_frees[source.raw() as usize]);
        }
        // The programs' info once per snapshot: the total for `lost`, the
        // run time top and serve show, and leaks' misses per program.
        let programs = self.program_counters();
        snap.events = self.event_counters(&c, &programs);
        for p in &programs {
            snap.bpf_run += p.run;
        }
        if let Some(read) = live {
            let misses = programs
                .iter()
                .map(|p| (p.tracepoint.to_string(), p.recursion_misses))
                .collect();
            snap.leaks = Some(self.leak_input(read, &c, &key, misses)?);
        }
        Ok(snap)
    }

    fn event_counters(&self, c: &types::counters, programs: &[ProgramCounters]) -> EventCounters {
        EventCounters {
            // Leaks: tracked frees are derived from the sites (LeakInput).
            frees: if self.cfg.live.is_some() {
                c.frees_untracked
            } else {
                c.frees
            },
            frees_null: c.frees_null,
            alloc_failed: c.alloc_failed,
            stack_samples: c.stack_samples,
            // Stacks are stored by the hash of their frames: no bucket
            // collisions (bpf/stack_store.bpf.h).
            lost_stack_collision: 0,
            lost_stack_other: c.lost_stack_other,
            map_full_sites: c.map_full_sites,
            map_full_stacks: c.map_full_stacks,
            map_full_procs: c.map_full_procs,
            map_full_cgroups: c.map_full_cgroups,
            map_full_caches: c.map_full_caches,
            kmalloc_cache_stale: c.cache_memo_stale,
            recursion_misses: programs.iter().map(|p| p.recursion_misses).sum(),
        }
    }

    /// Bytes of the page frees of pages not tracked so far (leaks): read
    /// when /proc/meminfo is, so that frees between attaching and that read
    /// (the tracer's own start-up memory going back) count on neither side.
    pub fn page_bytes_freed_untracked(&self) -> Result<u64> {
        let c: types::counters = maps::read_percpu_slot0(&self.skel.maps.counters)?;
        Ok(c.page_bytes_freed_untracked)
    }

    /// The status line's counters: one read of the per-CPU counters slot
    /// and of each program's info (for the runs the kernel skipped), no walk
    /// of the aggregation maps, however big they are. Map fill
    /// comes from entries counted as they are created, which holds while
    /// nothing deletes entries (record, leaks; not top, which removes idle
    /// keys).
    pub fn progress(&self) -> Result<progress::Counters> {
        let m = &self.skel.maps;
        let c: types::counters = maps::read_percpu_slot0(&m.counters)?;
        let ev = self.event_counters(&c, &self.program_counters());
        let fill = |name, entries, map: &dyn MapCore| progress::MapFill {
            name,
            entries,
            capacity: map.max_entries().into(),
        };
        let mut maps = vec![fill("sites", c.sites_created, &m.sites)];
        if self.cfg.stack_sample_every != 0 {
            maps.push(fill("stacks", c.stacks_created, &m.stacks));
        }
        if self.cfg.by_process {
            maps.push(fill("processes", c.procs_created, &m.procs));
        }
        if self.cfg.by_cgroup {
            maps.push(fill("cgroups", c.cgroups_created, &m.cgroups));
        }
        if self.cfg.live.is_some() {
            let live = c.live_added.saturating_sub(c.live_removed);
            maps.push(progress::MapFill {
                name: "objects",
                entries: live,
                capacity: self.cfg.live.map_or(0, |l| l.max_objects).into(),
            });
        }
        Ok(progress::Counters {
            events: c.allocs,
            lost_stacks: ev.lost_stacks(),
            // Leaks: objects not tracked because the object map was full
            // are not aggregated either.
            not_aggregated: ev.map_full() + c.map_full_live,
            skipped: ev.recursion_misses,
            maps,
        })
    }

    /// Deletes the given idle keys from the maps, with the stack traces only
    /// they used and the names of deleted processes. Returns the deleted
    /// entries' values at deletion (read and deleted in one syscall), so the
    /// caller can account for events that arrived after its last read.
    pub fn remove_idle(&self, idle: &IdleKeys) -> Result<Snapshot> {
        let mut removed = Snapshot::default();
        if idle.is_empty() {
            return Ok(removed);
        }
        let m = &self.skel.maps;
        let names = Names::read(self)?;

        // A site that holds a slot on some CPU keeps it for the run: it is
        // never removed, and stays in the caller's view. One that took its
        // first slot since the last read counts there only events after
        // it, which the next read adds as new.
        let in_slots = self.slot_sites.borrow();
        let sites: HashSet<&SiteKey> = idle
            .sites
            .iter()
            .filter(|k| !in_slots.contains(*k))
            .collect();
        for raw in maps::keys(&m.sites)? {
            let k = names.site_key(&from_bytes::<types::site_key>(&raw));
            if sites.contains(&k) {
                if let Some(v) = maps::take_counts::<types::alloc_stats, _>(&m.sites, &raw)? {
                    *removed.sites.entry(k).or_default() += v.into();
                }
            }
        }

        let stacks: HashSet<&(SiteKey, i64)> = idle.stacks.iter().collect();
        let mut still_used = HashSet::new();
        for raw in maps::keys(&m.stacks)? {
            let sk = from_bytes::<types::stack_key>(&raw);
            let k = (names.site_key(&sk.site), sk.stack_id);
            if !stacks.contains(&k) {
                still_used.insert(sk.stack_id);
                continue;
            }
            if let Some(v) = maps::take_counts::<types::alloc_stats, _>(&m.stacks, &raw)? {
                *removed.stacks.entry(k).or_default() += v.into();
            }
        }
        let unused: HashSet<i64> = removed
            .stacks
            .keys()
            .map(|(_, id)| *id)
            .filter(|id| !still_used.contains(id))
            .collect();
        for id in unused {
            if let Some(frames) = self.stack_frames(id)? {
                removed.stack_frames.insert(id, frames);
            }
            // Already gone is fine; a stack that recurs is stored again.
            let _ = m.stack_traces.delete(&id.to_ne_bytes());
            self.stack_cache.borrow_mut().remove(&id);
        }

        for &pid in &idle.procs {
            let key = pid.unwrap_or(INTERRUPT_TGID).to_ne_bytes();
            if let Some(v) = maps::take_counts::<types::alloc_stats, _>(&m.procs, &key)? {
                let comm = m
                    .proc_comms
                    .lookup(&key, MapFlags::ANY)?
                    .map(|b| c_str(&from_bytes::<types::proc_info>(&b).comm))
                    .unwrap_or_default();
                let _ = m.proc_comms.delete(&key);
                removed.procs.insert(pid, (comm, v.into()));
            }
        }

        let cgroups: HashSet<&CgroupKey> = idle.cgroups.iter().collect();
        for raw in maps::keys(&m.cgroups)? {
            let k = cgroup_key(&from_bytes::<types::cgroup_key>(&raw));
            if cgroups.contains(&k) {
                if let Some(v) = maps::take_counts::<types::alloc_stats, _>(&m.cgroups, &raw)? {
                    *removed.cgroups.entry(k).or_default() += v.into();
                }
            }
        }

        let caches: HashSet<&CacheId> = idle.caches.iter().collect();
        for raw in maps::keys(&m.cache_frees)? {
            let id = names.cache_id(from_bytes::<u64>(&raw));
            if caches.contains(&id) {
                if let Some(v) = maps::take_counts::<types::cache_frees, _>(&m.cache_frees, &raw)? {
                    *removed.cache_frees.entry(id).or_default() += v.frees;
                }
            }
        }
        Ok(removed)
    }
}
