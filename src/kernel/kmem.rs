//! The one tracer on the kmem tracepoints: bpf/kheap.bpf.c loaded and
//! attached for record, top, slab (allocations by site, stack, cache and
//! process) and leaks (the same, plus every live object by address). The
//! difference between them is configuration, fixed before load. Links are
//! RAII: dropping the tracer (on any exit path, errors included) detaches
//! everything.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

use anyhow::{bail, Context, Result};
use libbpf_rs::query::{ProgInfoIter, ProgInfoQueryOptions};
use libbpf_rs::skel::OpenSkel;
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, Program, ProgramInput, ProgramMut};

use crate::kernel::attach::{self, Fallback, Hook, Mechanism, Role, HOOKS};
use crate::kernel::features::{self, KernelBtf, Tracefs};
use crate::kernel::maps;
use crate::kernel::skel::{c_str, from_bytes, types, KheapSkel, KheapSkelBuilder, OpenKheapSkel};
use crate::kernel::storage::ObjectStorage;
use crate::model::live::{
    jiffies_to_ns, nearest_hz, LeakEvents, LeakInput, LiveObject, Outstanding, OutstandingBySite,
    OutstandingRead, Unseen,
};
use crate::model::snapshot::{
    CgroupKey, CgroupSlot, EventCounters, IdleKeys, ProgRunTime, Snapshot,
};
use crate::model::{
    merged_cache_name, progress, CacheId, KmallocSlab, Owner, PageUse, SiteKey, Source, Sources,
    VmapKind, UNRESOLVED_PREFIX,
};
use crate::slab::sysfs::{SlabSysfs, SYS_KERNEL_SLAB};

pub use crate::kernel::attach::AttachMode;

/// What a run traces and how.
#[derive(Clone, Debug)]
pub struct Config {
    pub min_size: u64,
    pub max_size: Option<u64>,
    /// 1: every stack; N (a power of two): about one event in N; 0: none.
    pub stack_sample_every: u32,
    pub pids: Vec<u32>,
    pub follow_children: bool,
    pub comm: Option<String>,
    pub by_process: bool,
    /// Count per cgroup v2 id, accounted or not, and interrupts apart.
    pub by_cgroup: bool,
    /// Only tasks in these cgroup v2 ids or below them.
    pub cgroups: Vec<u64>,
    /// Key sampled stacks by who made them too (process and cgroup, or
    /// interrupt context): `Snapshot::stack_owners`, the labels of exported
    /// profiles. Costs a few helper calls on the sampled stack path only.
    pub stack_owners: bool,
    /// Frees per cache for kfree() too (top, slab, serve): each kfree event
    /// asks the object's slab, where the kernel's kfunc can (6.13+ with
    /// tp_btf); elsewhere kfree frees are counted in the total only.
    pub kfree_caches: bool,
    pub attach: AttachMode,
    pub max_sites: u32,
    pub max_stacks: u32,
    /// Attach the free tracepoints too (frees per cache, net counts).
    /// Tracking live objects always does.
    pub trace_frees: bool,
    /// Remember every object until its free (`kheap leaks`).
    pub live: Option<LiveConfig>,
    /// The allocators traced (`--source`); the slab only by default.
    pub sources: Sources,
    /// Count kheap's own allocations too. Off by default: reading the maps
    /// allocates in the kernel (batch lookups kvmalloc their buffers), and a
    /// tool should not report its own footprint as the workload's.
    pub include_self: bool,
}

/// Settings of live-object tracking.
#[derive(Clone, Copy, Debug)]
pub struct LiveConfig {
    /// 1: every address; N (a power of two): addresses whose hash picks
    /// about one in N.
    pub sample_every: u32,
    /// Capacity of the object map.
    pub max_objects: u32,
}

impl Default for LiveConfig {
    fn default() -> Self {
        LiveConfig {
            sample_every: 1,
            max_objects: 262_144,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            min_size: 0,
            max_size: None,
            stack_sample_every: 1024,
            pids: Vec::new(),
            follow_children: false,
            comm: None,
            by_process: false,
            by_cgroup: false,
            cgroups: Vec::new(),
            stack_owners: false,
            kfree_caches: false,
            attach: AttachMode::Auto,
            max_sites: 8192,
            max_stacks: 8192,
            trace_frees: true,
            live: None,
            include_self: false,
            sources: Sources::default(),
        }
    }
}

impl Config {
    /// Stacks are captured and keyed by who made them.
    fn stacks_by_owner(&self) -> bool {
        self.stack_owners && self.stack_sample_every != 0
    }

    /// Every stack is captured and counted under its stack only; sites are
    /// summed from stacks in user space (one map update per event).
    fn sites_from_stacks(&self) -> bool {
        self.stack_sample_every == 1 && self.live.is_none()
    }
}

pub struct Tracer<'obj> {
    skel: KheapSkel<'obj>,
    links: Vec<Link>,
    cfg: Config,
    mech: Mechanism,
    /// How hooks whose tracepoint this kernel lacks attach to their
    /// function instead (vmalloc before 6.2), if any does.
    fallback: Option<Fallback>,
    /// The hooks attached.
    hooks: Vec<&'static Hook>,
    /// Hook → how it is attached ("kmalloc: tp_btf").
    pub attached: Vec<String>,
    /// Hooks not attached, with the reason (and, where this kernel gives
    /// no way to find the cache of a kmalloc object, why).
    pub skipped: Vec<String>,
    /// How the cache of a kmalloc object is found, or why it is not.
    pub kmalloc_caches: String,
    /// kfree events name their cache (`kfree_caches_traced`).
    pub kfree_caches: bool,
    /// Stack traces already read, by id (a hash of their frames: an id
    /// always means the same frames), so a refreshing view reads each once.
    stack_cache: RefCell<HashMap<i64, Vec<u64>>>,
    /// Which caches SLUB merged (/sys/kernel/slab), read on first use.
    /// and how many cache names there were then.
    slab_sysfs: RefCell<Option<(SlabSysfs, usize)>>,
    /// The clock when the programs were loaded, to measure the tick rate
    /// that turns live objects' jiffies into ages.
    clock0: types::clock_sample,
    /// The clock when the programs were detached: the end of the run, the
    /// moment the report's ages are taken at (its duration's end too).
    ended: Option<types::clock_sample>,
    // Held so a tracefs kheap mounted itself stays mounted while attached.
    _tracefs: Option<Tracefs>,
}

impl<'obj> Tracer<'obj> {
    /// Opens, configures, loads and attaches with the cheapest mechanism
    /// the kernel accepts (tp_btf, then raw_tp, then classic tracepoints).
    /// `lat_starts` is the latency object's per-task map (`--latency`),
    /// shared so call sites stay right while exit probes hide return
    /// addresses.
    pub fn start(
        cfg: &Config,
        storage: &'obj mut ObjectStorage,
        lat_starts: Option<BorrowedFd<'_>>,
    ) -> Result<Tracer<'obj>> {
        let kbtf = features::kernel_btf()?;
        let mut slots = storage.slots();
        let (mut tracer, refused) = attach::start_first(cfg.attach, |mech| {
            let slot = slots.next().context("no object storage left")?;
            Self::start_with(cfg, kbtf, mech, slot, lat_starts)
        })?;
        // Shown in the report header: why a cheaper way was not used.
        tracer.skipped.extend(refused);
        Ok(tracer)
    }

    fn start_with(
        cfg: &Config,
        kbtf: &KernelBtf,
        mech: Mechanism,
        slot: &'obj mut MaybeUninit<OpenObject>,
        lat_starts: Option<BorrowedFd<'_>>,
    ) -> Result<Tracer<'obj>> {
        if mech == Mechanism::Btf && !kbtf.typed_programs {
            bail!("the kernel exposes no BTF of its own to check typed programs with");
        }
        let tracefs = if mech.needs_tracefs() {
            Some(Tracefs::ensure_mounted()?)
        } else {
            None
        };
        let trace_frees = cfg.trace_frees || cfg.live.is_some();
        let mut skipped = Vec::new();
        let mut enabled: Vec<&'static Hook> = Vec::new();
        let mut fallback = None;
        for hook in HOOKS.iter().filter(|h| h.source == Source::Kmalloc) {
            let wanted = match hook.role {
                Role::Alloc => cfg.sources.contains(Source::Kmalloc),
                Role::Free => trace_frees && cfg.sources.contains(Source::Kmalloc),
                Role::Fork => cfg.follow_children,
            };
            if !wanted {
                continue;
            }
            let tp = hook.tracepoint;
            if mech.has_hook(hook, kbtf, tracefs.as_ref()) {
                enabled.push(hook);
            } else if hook.until.is_some() {
                // Newer kernels fire these events as another hook's.
            } else if cfg.live.is_some() && hook.role != Role::Fork {
                // Without every free hook, everything would look leaked.
                bail!("kheap leaks needs the kmem:{tp} tracepoint, which this kernel lacks");
            } else {
                skipped.push(format!("{tp}: not available on this kernel"));
            }
        }
        for source in cfg.sources.iter().filter(|&s| s != Source::Kmalloc) {
            match source_hooks_available(source, trace_frees, kbtf) {
                Ok((hooks, via)) => {
                    if via.is_some() {
                        fallback = via;
                    }
                    enabled.extend(hooks)
                }
                Err(why) => skipped.push(why),
            }
        }
        // Frees before allocations, whatever their source.
        enabled.sort_by_key(|h| HOOKS.iter().position(|x| std::ptr::eq(x, *h)));
        if !enabled.iter().any(|h| h.role == Role::Alloc) {
            bail!(
                "this kernel has no tracepoint of the sources asked for ({}): nothing to trace",
                cfg.sources
            );
        }
        if cfg.follow_children && !enabled.iter().any(|h| h.role == Role::Fork) {
            eprintln!("kheap: warning: sched_process_fork is not available; children of the command are not followed");
        }

        let mut open = crate::kernel::features::open_skel(KheapSkelBuilder::default(), slot)
            .context("opening the BPF object")?;
        // Read at most once, and only where a table of kernel addresses is
        // needed (bucket-cache bases, label ranges).
        let kallsyms = Kallsyms::default();
        let kmalloc_caches = configure(&mut open, cfg, kbtf, mech, &kallsyms, lat_starts)?;
        if let Err(why) = &kmalloc_caches {
            skipped.push(why.clone());
        }
        let labels = label_ranges(cfg, &kallsyms)?;
        // Programs that hook a function's entry besides its return.
        let entry_programs: Vec<String> = enabled
            .iter()
            .filter_map(|h| h.entry_program(fallback?))
            .collect();
        if let Some(rodata) = open.maps.rodata_data.as_deref_mut() {
            rodata.cfg.backing_ranges = labels.page;
            rodata.cfg.vmap_ranges = labels.vmap;
            rodata.cfg.given_stacks = u8::from(!entry_programs.is_empty());
        }
        if entry_programs.is_empty() {
            open.maps
                .vmap_entries
                .set_max_entries(1)
                .context("sizing the vmap entry map")?;
        }
        // Exactly the programs of the chosen mechanism and hooks load; any
        // other program left in the object would fail the whole load.
        let verifier_stats = crate::kernel::verifier_stats_asked();
        for mut prog in open.open_object_mut().progs_mut() {
            let name = prog.name().to_string_lossy().into_owned();
            let on = if name == "clock" {
                cfg.live.is_some()
            } else if entry_programs.contains(&name) {
                true
            } else {
                enabled
                    .iter()
                    .any(|h| program_name(h, mech, fallback) == name)
            };
            prog.set_autoload(on);
            if on && verifier_stats {
                prog.set_log_level(crate::kernel::VERIFIER_STATS_LOG_LEVEL);
            }
        }
        let skel = open
            .load()
            .context("loading the BPF programs into the kernel")?;
        let mut tracer = Tracer {
            skel,
            links: Vec::new(),
            cfg: cfg.clone(),
            mech,
            fallback,
            hooks: Vec::new(),
            attached: Vec::new(),
            skipped,
            kmalloc_caches: kmalloc_caches.unwrap_or_else(|why| why),
            kfree_caches: kfree_caches_traced(cfg, kbtf, mech),
            stack_cache: RefCell::default(),
            slab_sysfs: RefCell::default(),
            clock0: types::clock_sample::default(),
            ended: None,
            _tracefs: tracefs,
        };
        if cfg.live.is_some() {
            tracer.clock0 = tracer.clock()?;
        }
        for (i, value) in labels.ranges.iter().enumerate() {
            tracer
                .skel
                .maps
                .backing_ranges
                .update(
                    &(i as u32).to_ne_bytes(),
                    // SAFETY: a plain C struct of integers (explicit padding).
                    unsafe { plain::as_bytes(value) },
                    MapFlags::ANY,
                )
                .context("writing the stack-label function ranges")?;
        }
        for &pid in &cfg.pids {
            tracer.add_pid(pid)?;
        }
        for &id in &cfg.cgroups {
            tracer
                .skel
                .maps
                .cgroup_filter
                .update(&id.to_ne_bytes(), &[1u8], MapFlags::ANY)
                .context("adding a cgroup to the filter map")?;
        }
        for hook in enabled {
            let tp = hook.tracepoint;
            let prog = tracer
                .program(hook)
                .with_context(|| format!("no {} program for {tp}", mech.name()))?;
            // A raw_tp program may serve several tracepoints (the _node
            // ones before 6.1): attached by the hook's name, not its
            // section's.
            let link = if prog.name().to_string_lossy().ends_with("_raw") {
                prog.attach_raw_tracepoint(tp)
            } else {
                prog.attach()
            }
            .with_context(|| format!("attaching to {tp}"))?;
            tracer.links.push(link);
            // After the return's: the kernel runs the handlers of one probed
            // address newest first, and the kretprobe's replaces the return
            // address with kretprobe_trampoline, where a 5.10 stack walk
            // stops. (A return whose entry was not seen is counted without
            // what the entry gives.)
            if let Some(name) = fallback.and_then(|via| hook.entry_program(via)) {
                let prog = tracer
                    .program_named(&name)
                    .with_context(|| format!("no program {name}"))?;
                let link = prog
                    .attach()
                    .with_context(|| format!("attaching to {tp}'s entry"))?;
                tracer.links.push(link);
            }
            tracer.hooks.push(hook);
            let how = match (hook.function, fallback) {
                (Some(f), Some(via)) => format!("{} on {f}", via.name()),
                _ if hook.raw_only => Mechanism::Raw.name().to_string(),
                _ => mech.name().to_string(),
            };
            tracer.attached.push(format!("{tp}: {how}"));
        }
        Ok(tracer)
    }

    /// The loaded program of one hook, for this tracer's mechanism.
    fn program(&self, hook: &Hook) -> Option<&ProgramMut<'obj>> {
        self.program_named(&program_name(hook, self.mech, self.fallback))
    }

    fn program_named(&self, name: &str) -> Option<&ProgramMut<'obj>> {
        let p = &self.skel.progs;
        let all = [
            &p.kmalloc_btf,
            &p.kmalloc_raw,
            &p.kmalloc_tp,
            &p.cache_alloc_btf,
            &p.cache_alloc_raw,
            &p.cache_alloc_tp,
            &p.kfree_btf,
            &p.kfree_raw,
            &p.kfree_tp,
            &p.cache_free_btf,
            &p.cache_free_raw,
            &p.cache_free_tp,
            &p.fork_btf,
            &p.fork_raw,
            &p.fork_tp,
            &p.page_alloc_raw,
            &p.page_free_raw,
            &p.vmalloc_alloc_raw,
            &p.vmalloc_free_raw,
            &p.vmalloc_alloc_fexit,
            &p.vmalloc_free_fentry,
            &p.vmalloc_alloc_kprobe,
            &p.vmalloc_alloc_kretprobe,
            &p.vmalloc_free_kprobe,
            &p.percpu_alloc_raw,
            &p.percpu_free_raw,
        ];
        all.into_iter().find(|p| p.name() == name)
    }

    /// Adds a process (tgid) to the set whose allocations are counted.
    pub fn add_pid(&self, pid: u32) -> Result<()> {
        self.skel
            .maps
            .pid_filter
            .update(&pid.to_ne_bytes(), &[1u8], MapFlags::ANY)
            .context("adding a PID to the filter map")
    }

    /// Capacity of the per-cgroup map (`--by cgroup`).
    pub fn cgroup_capacity(&self) -> u32 {
        self.skel.maps.cgroups.max_entries()
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

    /// Detaches every program now; the maps stay readable.
    pub fn detach(&mut self) {
        self.links.clear();
        if self.cfg.live.is_some() {
            self.ended = self.clock().ok();
        }
    }

    /// The caches' names by pointer; a cache SLUB merged others into
    /// names them too (`merged_cache_name`), in every view.
    fn cache_names(&self) -> Result<HashMap<u64, String>> {
        let names: Vec<(u64, String)> =
            maps::read_hash::<u64, types::cache_name, _>(&self.skel.maps.cache_names)?
                .into_iter()
                .map(|(k, v)| (k, c_str(&v.name)))
                .collect();
        let mut slab = self.slab_sysfs.borrow_mut();
        // Read again when caches were named since (a merge happens when a
        // cache is created), at most once per new name.
        if slab.as_ref().is_none_or(|(_, seen)| names.len() > *seen) {
            let fs = SlabSysfs::open(Path::new(SYS_KERNEL_SLAB))
                .ok()
                .flatten()
                .unwrap_or_default();
            *slab = Some((fs, names.len()));
        }
        let (fs, _) = slab.as_ref().expect("just read");
        Ok(names
            .into_iter()
            .map(|(k, n)| {
                let shown = merged_cache_name(&n, &fs.aliases_of(&n));
                (k, shown)
            })
            .collect())
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
        maps::visit_hash_values::<types::live_obj, _>(&m.live, &mut |o| {
            // SAFETY: a plain C struct of integers, without implicit padding.
            let site = unsafe { plain::as_bytes(&o.site) };
            let k = (site.try_into().expect("site_key size"), o.stack_id);
            let e = raw.entry(k).or_default();
            e.objects += 1;
            e.bytes_alloc += o.bytes_alloc as u64;
        })?;
        let names = Names::read(self)?;
        let mut groups: HashMap<(SiteKey, i64), Outstanding> = HashMap::new();
        for ((site, stack_id), v) in raw {
            let site = names.site_key(&from_bytes::<types::site_key>(&site));
            let e = groups.entry((site, stack_id)).or_default();
            e.objects += v.objects;
            e.bytes_alloc += v.bytes_alloc;
        }
        let c: types::counters = maps::read_percpu_slot0(&m.counters)?;
        Ok(Some(OutstandingRead {
            groups,
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
        maps::visit_hash_values::<types::live_obj, _>(&self.skel.maps.live, &mut |o| {
            // SAFETY: a plain C struct of integers, without implicit padding.
            let site = unsafe { plain::as_bytes(&o.site) };
            let (cgroup, interrupt) = match by_cgroup {
                true => (o.cgroup, o.interrupt != 0),
                false => (0, false),
            };
            let k = (site.try_into().expect("site_key size"), cgroup, interrupt);
            let e = raw.entry(k).or_default();
            e.objects += 1;
            e.bytes_alloc += o.bytes_alloc as u64;
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
            let e = out.entry((site, slot)).or_default();
            e.objects += v.objects;
            e.bytes_alloc += v.bytes_alloc;
        }
        Ok(Some(out))
    }

    fn read_snapshot(&self, with_live: bool) -> Result<Snapshot> {
        let m = &self.skel.maps;
        let names = Names::read(self)?;
        let key = |k: &types::site_key| names.site_key(k);
        // Read while events keep arriving, in the order that keeps every
        // site adding up (allocated >= outstanding + freed unseen): objects
        // found freed unseen, then the live objects (and the clock their
        // ages are measured against), then the allocation totals. An object
        // whose address comes back between two reads is then counted as
        // freed, never twice.
        let live = match self.cfg.live.filter(|_| with_live) {
            Some(lcfg) => {
                let unseen =
                    maps::read_percpu_hash::<types::site_key, types::site_unseen, _>(&m.unseen)?;
                let objects = maps::read_hash_values::<types::live_obj, _>(&m.live)?;
                let now = self.clock()?;
                Some((lcfg, unseen, objects, now))
            }
            None => None,
        };
        let mut snap = Snapshot::default();
        // Two kernel caches can share a name: their entries are merged.
        for (k, v) in maps::read_percpu_hash::<types::site_key, types::alloc_stats, _>(&m.sites)? {
            *snap.sites.entry(key(&k)).or_default() += v.into();
        }
        // Processes right after sites (both are counted on every event):
        // the slower stack reads below would widen the gap between them.
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
        if self.cfg.by_process {
            let procs = maps::read_percpu_hash::<u32, types::alloc_stats, _>(&m.procs)?;
            for (pid, v) in procs {
                let (comm, cgroup) = comms.get(&pid).cloned().unwrap_or_default();
                if cgroup != 0 {
                    snap.proc_cgroups.insert(pid, cgroup);
                }
                snap.procs.insert(pid, (comm, v.into()));
            }
        }
        if self.cfg.by_cgroup {
            for (k, v) in
                maps::read_percpu_hash::<types::cgroup_key, types::alloc_stats, _>(&m.cgroups)?
            {
                *snap.cgroups.entry(cgroup_key(&k)).or_default() += v.into();
            }
        }
        let sites_from_stacks = self.cfg.sites_from_stacks();
        let owners = self.cfg.stacks_by_owner();
        for (k, v) in maps::read_percpu_hash::<types::stack_key, types::alloc_stats, _>(&m.stacks)?
        {
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
        for (cache, v) in maps::read_percpu_hash::<u64, types::cache_frees, _>(&m.cache_frees)? {
            let row = free_row(cache, kfree_tags, &names, &kmalloc_rows);
            *snap.cache_frees.entry(row).or_default() += v.frees;
        }
        let c: types::counters = maps::read_percpu_slot0(&m.counters)?;
        for source in self.cfg.sources.iter().filter(|&s| s != Source::Kmalloc) {
            snap.source_frees
                .insert(source, c.source_frees[source.raw() as usize]);
        }
        snap.events = self.event_counters(&c);
        if let Some((lcfg, unseen, objects, now)) = live {
            snap.leaks = Some(self.leak_input(lcfg, unseen, objects, now, &c, &key)?);
        }
        Ok(snap)
    }

    fn event_counters(&self, c: &types::counters) -> EventCounters {
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
    /// (no walk of the aggregation maps, however big they are). Map fill
    /// comes from entries counted as they are created, which holds while
    /// nothing deletes entries (record, leaks; not top, which removes idle
    /// keys).
    pub fn progress(&self) -> Result<progress::Counters> {
        let m = &self.skel.maps;
        let c: types::counters = maps::read_percpu_slot0(&m.counters)?;
        let ev = self.event_counters(&c);
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
            maps.push(fill("objects", live, &m.live));
        }
        Ok(progress::Counters {
            events: c.allocs,
            lost_stacks: ev.lost_stacks(),
            // Leaks: objects not tracked because the object map was full
            // are not aggregated either.
            not_aggregated: ev.map_full() + c.map_full_live,
            maps,
        })
    }

    fn leak_input(
        &self,
        lcfg: LiveConfig,
        unseen_read: Vec<(types::site_key, types::site_unseen)>,
        live: Vec<types::live_obj>,
        now: types::clock_sample,
        c: &types::counters,
        key: &dyn Fn(&types::site_key) -> SiteKey,
    ) -> Result<LeakInput> {
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
        for o in &live {
            comms.entry(o.tgid).or_insert_with(|| comm_now(o.tgid));
        }
        Ok(LeakInput {
            live: live
                .iter()
                .map(|o| LiveObject {
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
            recursion_misses: self
                .program_stats()
                .into_iter()
                .map(|(tp, s)| (tp, s.recursion_misses))
                .collect(),
            kind: "leaks".to_string(),
            comms,
        })
    }

    /// Reads the kernel's jiffies and CLOCK_MONOTONIC together, by running
    /// the object's `clock` program.
    fn clock(&self) -> Result<types::clock_sample> {
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

        let sites: HashSet<&SiteKey> = idle.sites.iter().collect();
        for raw in maps::keys(&m.sites)? {
            let k = names.site_key(&from_bytes::<types::site_key>(&raw));
            if sites.contains(&k) {
                if let Some(v) = maps::take_percpu::<types::alloc_stats, _>(&m.sites, &raw)? {
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
            if let Some(v) = maps::take_percpu::<types::alloc_stats, _>(&m.stacks, &raw)? {
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
            let key = pid.to_ne_bytes();
            if let Some(v) = maps::take_percpu::<types::alloc_stats, _>(&m.procs, &key)? {
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
                if let Some(v) = maps::take_percpu::<types::alloc_stats, _>(&m.cgroups, &raw)? {
                    *removed.cgroups.entry(k).or_default() += v.into();
                }
            }
        }

        let caches: HashSet<&CacheId> = idle.caches.iter().collect();
        for raw in maps::keys(&m.cache_frees)? {
            let id = names.cache_id(from_bytes::<u64>(&raw));
            if caches.contains(&id) {
                if let Some(v) = maps::take_percpu::<types::cache_frees, _>(&m.cache_frees, &raw)? {
                    *removed.cache_frees.entry(id).or_default() += v.frees;
                }
            }
        }
        Ok(removed)
    }

    /// Per attached hook: run time, run count and recursion misses (events
    /// the kernel skipped because a BPF program was already running on the
    /// CPU), from the kernel's program info. Run time and count only advance
    /// while BPF run-time statistics are enabled (`enable_run_time_stats`).
    pub fn program_stats(&self) -> Vec<(String, ProgRunTime)> {
        let ours: Vec<(u32, &str)> = self
            .hooks
            .iter()
            .filter_map(|h| {
                let id = Program::id_from_fd(self.program(h)?.as_fd()).ok()?;
                Some((id, h.tracepoint))
            })
            .collect();
        let mut out: Vec<(String, ProgRunTime)> =
            ProgInfoIter::with_query_opts(ProgInfoQueryOptions::default())
                .filter_map(|info| {
                    let (_, tp) = ours.iter().find(|(id, _)| *id == info.id)?;
                    Some((
                        tp.to_string(),
                        ProgRunTime {
                            run_time_ns: info.run_time_ns,
                            run_cnt: info.run_cnt,
                            recursion_misses: info.recursion_misses,
                        },
                    ))
                })
                .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The attached programs' run time, run count and recursion misses,
    /// summed.
    pub fn run_time(&self) -> ProgRunTime {
        let mut total = ProgRunTime::default();
        for (_, s) in self.program_stats() {
            total.run_time_ns += s.run_time_ns;
            total.run_cnt += s.run_cnt;
            total.recursion_misses += s.recursion_misses;
        }
        total
    }
}

/// Turns on the kernel's BPF run-time statistics (run_time_ns, run_cnt per
/// program) for as long as the returned descriptor is open. They cost a
/// little on every program run, so they are enabled only while needed.
pub fn enable_run_time_stats() -> Result<OwnedFd> {
    let fd = unsafe { libbpf_sys::bpf_enable_stats(libbpf_sys::BPF_STATS_RUN_TIME) };
    if fd < 0 {
        bail!(
            "enabling BPF run-time statistics: {}",
            std::io::Error::from_raw_os_error(-fd)
        );
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn configure(
    open: &mut OpenKheapSkel<'_>,
    cfg: &Config,
    kbtf: &KernelBtf,
    mech: Mechanism,
    kallsyms: &Kallsyms,
    lat_starts: Option<BorrowedFd<'_>>,
) -> Result<std::result::Result<String, String>> {
    let rodata = open
        .maps
        .rodata_data
        .as_deref_mut()
        .context("the BPF object has no read-only data section")?;
    let c = &mut rodata.cfg;
    c.min_size = cfg.min_size;
    c.max_size = cfg.max_size.unwrap_or(0);
    c.gfp_account_mask = kbtf.gfp_account_mask;
    c.slab_account_mask = kbtf.slab_account_mask;
    c.by_cgroup = u8::from(cfg.by_cgroup);
    c.filter.cgroups = u8::from(!cfg.cgroups.is_empty());
    c.capture_stacks = u8::from(cfg.stack_sample_every > 0);
    c.stack_sample_mask = cfg.stack_sample_every.saturating_sub(1);
    c.by_process = u8::from(cfg.by_process);
    c.stack_owners = u8::from(cfg.stacks_by_owner());
    c.filter.pids = u8::from(!cfg.pids.is_empty());
    if !cfg.include_self {
        c.filter.ignore_tgid = std::process::id();
    }
    if let Some(comm) = &cfg.comm {
        c.filter.comm_set = 1;
        for (dst, src) in c.filter.comm.iter_mut().zip(comm.bytes().take(15)) {
            *dst = src as i8;
        }
    }
    c.sources = cfg.sources.bits();
    c.page_shift = page_shift();
    // The same page lookup names the cache of kmem_cache events before 6.1,
    // which pass none (bpf/kmem_classic.bpf.h, cache_events_pass_cache).
    let kmalloc_caches = kmalloc_cache_resolution(kbtf, mech, kallsyms)
        .map_err(|why| match kbtf.cache_events_pass_cache {
            true => why,
            false => format!(
                "{why}; this kernel's kmem_cache events (before 6.1) name no cache either, so \
                 those caches show as their object size"
            ),
        })
        .map(|bases| {
            rodata.resolve_kmalloc_caches = 1;
            match bases {
                Some((direct_map, vmemmap)) => {
                    rodata.direct_map_base_addr = direct_map;
                    rodata.vmemmap_base_addr = vmemmap;
                    "the object's slab, found through its page (page_offset_base and vmemmap_base \
                 from /proc/kallsyms)"
                        .to_string()
                }
                None => "the object's slab, named by the kernel (bpf_get_kmem_cache)".to_string(),
            }
        });
    let c = &mut rodata.cfg;
    c.kfree_caches = u8::from(kfree_caches_traced(cfg, kbtf, mech));
    if let Some(live) = cfg.live {
        c.track_live = 1;
        c.ptr_sample_mask = live.sample_every.max(1) - 1;
    }
    if let Some(fd) = lat_starts {
        c.latency_active = 1;
        open.maps.lat_starts.reuse_fd(fd)?;
    }
    open.maps.sites.set_max_entries(cfg.max_sites)?;
    open.maps.stacks.set_max_entries(cfg.max_stacks)?;
    // Stacks are stored before they are counted, and top deletes idle ones:
    // room for twice the stacks kept.
    open.maps
        .stack_traces
        .set_max_entries(cfg.max_stacks.saturating_mul(2))?;
    match cfg.live {
        Some(live) => {
            open.maps.live.set_max_entries(live.max_objects)?;
            open.maps.unseen.set_max_entries(cfg.max_sites)?;
        }
        // Maps a mode does not use keep one entry (zero is refused).
        None => {
            open.maps.live.set_max_entries(1)?;
            open.maps.unseen.set_max_entries(1)?;
        }
    }
    if !cfg.by_cgroup {
        open.maps.cgroups.set_max_entries(1)?;
    }
    if !cfg.by_process {
        open.maps.procs.set_max_entries(1)?;
    }
    // Process names: of process rows, and of the processes stacks are
    // keyed by.
    if !cfg.by_process && !cfg.stacks_by_owner() {
        open.maps.proc_comms.set_max_entries(1)?;
    }
    Ok(kmalloc_caches)
}

/// Whether kfree events name their cache in this run (`Config::kfree_caches`
/// where the kfunc can; leaks counts no frees per cache).
fn kfree_caches_traced(cfg: &Config, kbtf: &KernelBtf, mech: Mechanism) -> bool {
    cfg.kfree_caches && cfg.live.is_none() && mech == Mechanism::Btf && kbtf.kmem_cache_kfunc
}

/// The cache row a free belongs to. kfree's keys carry the tag bit
/// (bpf/kheap.h, KHEAP_KFREE_CACHE_TAG) and join the kmalloc row of their
/// cache when the run saw allocations from it (kmalloc rows are keyed by
/// size class and cache, not by name alone); the others are the cache's own.
fn free_row(
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

/// How the kmalloc programs find the cache an object lives in
/// (bpf/slab_cache.bpf.h): Ok(None) through the kernel's kfunc (typed
/// programs on 6.13+), Ok(Some(addresses of `page_offset_base` and
/// `vmemmap_base`)) through the object's page. Err: the line the report
/// header and `kheap doctor` show, where this kernel gives no way (kallsyms
/// without data symbols, i.e. no CONFIG_KALLSYMS_ALL, or not x86-64's
/// memory layout); kmalloc caches are then named by their size class.
fn kmalloc_cache_resolution(
    kbtf: &KernelBtf,
    mech: Mechanism,
    kallsyms: &Kallsyms,
) -> std::result::Result<Option<(u64, u64)>, String> {
    if mech == Mechanism::Btf && kbtf.kmem_cache_kfunc {
        return Ok(None);
    }
    let why = |what: &str| {
        format!(
            "kmalloc caches: named by size class, not by the object's slab ({what}): bucket, \
             random and accounted copies (msg_msg-4k, kmalloc-rnd-01-4k, kmalloc-cg-4k) are \
             not told apart"
        )
    };
    if !cfg!(target_arch = "x86_64") {
        return Err(why("the page lookup knows x86-64's memory layout only"));
    }
    let text = kallsyms.text().map_err(|e| why(&format!("{e:#}")))?;
    direct_map_and_vmemmap_bases(text).map(Some).ok_or_else(|| {
        why(
            "/proc/kallsyms lists no page_offset_base/vmemmap_base: a kernel without \
                 CONFIG_KALLSYMS_ALL",
        )
    })
}

/// The addresses of the kernel's `page_offset_base` and `vmemmap_base`
/// variables, if kallsyms lists them.
fn direct_map_and_vmemmap_bases(kallsyms: &str) -> Option<(u64, u64)> {
    let find = |name| crate::model::kallsyms::address_of(kallsyms, name);
    Some((find("page_offset_base")?, find("vmemmap_base")?))
}

/// The hooks of a source beyond the slab, all of them or none: a source
/// without its free hook would look like it leaks, one without its
/// allocation hook would count nothing. With how they attach where the
/// tracepoints are missing (`attach::source_mechanism`). Err: the line
/// that says why.
fn source_hooks_available(
    source: Source,
    trace_frees: bool,
    kbtf: &KernelBtf,
) -> std::result::Result<(Vec<&'static Hook>, Option<Fallback>), String> {
    let via = attach::source_mechanism(source, kbtf)
        .map_err(|why| format!("{source}: not traced: {why}"))?;
    let hooks = crate::kernel::hooks::source_hooks(source)
        .filter(|h| h.role == Role::Alloc || trace_frees)
        .collect();
    Ok((hooks, via))
}

/// The program of a hook: its function's when the hook falls back to it.
fn program_name(hook: &Hook, mech: Mechanism, fallback: Option<Fallback>) -> String {
    match (hook.function, fallback) {
        (Some(_), Some(via)) => hook.fallback_program(via),
        _ => hook.program(mech),
    }
}

/// The text ranges that label events by the functions on their stack
/// (bpf/sources.bpf.h, `stack_label`), in the map's order: with the page
/// source and a source whose pages it would count again, the functions
/// that allocate those pages (only for the sources traced, so a page is
/// left out of the totals only when another source counts it); then, with
/// vmalloc, the functions that say what a vmap area is for.
#[derive(Default)]
struct LabelRanges {
    ranges: Vec<types::backing_range>,
    page: u32,
    vmap: u32,
}

/// /proc/kallsyms, read on first use.
#[derive(Default)]
struct Kallsyms(std::cell::OnceCell<String>);

impl Kallsyms {
    fn text(&self) -> Result<&str> {
        if let Some(t) = self.0.get() {
            return Ok(t);
        }
        let t = std::fs::read_to_string("/proc/kallsyms").context("reading /proc/kallsyms")?;
        Ok(self.0.get_or_init(|| t))
    }
}

fn label_ranges(cfg: &Config, kallsyms: &Kallsyms) -> Result<LabelRanges> {
    let pages = cfg.sources.contains(Source::Page);
    let vmap = cfg.sources.contains(Source::Vmalloc);
    if !pages && !vmap {
        return Ok(LabelRanges::default());
    }
    let kallsyms = kallsyms.text()?;
    let range = |start, end, label| types::backing_range {
        start,
        end,
        label,
        ..Default::default()
    };
    let mut ranges: Vec<types::backing_range> = Vec::new();
    if pages {
        ranges.extend(
            crate::model::backing::backing_ranges(kallsyms)
                .into_iter()
                .filter(|r| {
                    r.label
                        .counted_by()
                        .is_some_and(|s| cfg.sources.contains(s))
                })
                .map(|r| range(r.start, r.end, r.label.raw())),
        );
    }
    ranges.truncate(KHEAP_BACKING_RANGES);
    let page = ranges.len() as u32;
    if vmap {
        ranges.extend(
            crate::model::backing::vmap_ranges(kallsyms)
                .into_iter()
                .map(|r| range(r.start, r.end, r.label.raw())),
        );
    }
    ranges.truncate(KHEAP_BACKING_RANGES);
    Ok(LabelRanges {
        page,
        vmap: ranges.len() as u32 - page,
        ranges,
    })
}

/// Must match KHEAP_BACKING_RANGES in bpf/kheap.h (the map's size).
const KHEAP_BACKING_RANGES: usize = 40;

/// log2 of the page size, for the page allocator's bytes (PAGE_SIZE << order).
fn page_shift() -> u8 {
    crate::sys::page_size().trailing_zeros() as u8
}

/// A process's name as /proc says now; empty once it has exited.
fn comm_now(tgid: u32) -> String {
    crate::sys::process_name(tgid).unwrap_or_default()
}

/// Who made the allocations of a stack entry (keyed so with
/// `Config::stack_owners`).
fn stack_owner(k: &types::stack_key) -> Owner {
    if k.interrupt != 0 {
        Owner::Interrupt
    } else {
        Owner::Process {
            tgid: k.tgid,
            cgroup: k.cgroup,
        }
    }
}

/// Cache names for one read of the maps. A cache's name is written just
/// after the first entry that uses it, so an entry read after the names
/// can be newer than them: a miss reads the names again, once per read.
struct Names<'t, 'obj> {
    tracer: &'t Tracer<'obj>,
    names: RefCell<HashMap<u64, String>>,
    reread: std::cell::Cell<bool>,
}

impl<'t, 'obj> Names<'t, 'obj> {
    fn read(tracer: &'t Tracer<'obj>) -> Result<Self> {
        Ok(Names {
            tracer,
            names: RefCell::new(tracer.cache_names()?),
            reread: std::cell::Cell::new(false),
        })
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

    fn site_key(&self, k: &types::site_key) -> SiteKey {
        self.refresh_for(k.cache);
        site_key(k, &self.names.borrow())
    }

    fn cache_id(&self, cache: u64) -> CacheId {
        self.refresh_for(cache);
        cache_id(cache, 0, false, &self.names.borrow())
    }
}

fn site_key(k: &types::site_key, names: &HashMap<u64, String>) -> SiteKey {
    let cache = match Source::from_raw(k.source) {
        Some(Source::Page) => CacheId::Pages {
            order: k.kmalloc_size,
            used_for: PageUse::from_raw(k.page_use),
        },
        Some(Source::Vmalloc) => CacheId::Vmalloc {
            area: VmapKind::from_raw(k.vmap_kind),
        },
        Some(Source::Percpu) => CacheId::Percpu,
        _ => cache_id(k.cache, k.kmalloc_size, k.kmalloc_accounted != 0, names),
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

/// Must match KHEAP_CACHE_UNRESOLVED in bpf/kheap.h.
const KHEAP_CACHE_UNRESOLVED: u64 = 2;
/// Must match KHEAP_KFREE_CACHE_TAG in bpf/kheap.h.
const KHEAP_KFREE_CACHE_TAG: u64 = 2;

/// A cgroup map key as the model names it.
fn cgroup_key(k: &types::cgroup_key) -> CgroupKey {
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

    #[test]
    fn only_exact_record_runs_sum_sites_from_stacks() {
        let exact = Config {
            stack_sample_every: 1,
            ..Config::default()
        };
        assert!(exact.sites_from_stacks());
        assert!(!Config::default().sites_from_stacks());
        let leaks = Config {
            live: Some(LiveConfig::default()),
            ..exact
        };
        assert!(!leaks.sites_from_stacks());
    }
}
