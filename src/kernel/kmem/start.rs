//! Opening, configuring, loading and attaching the kmem object.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::os::fd::BorrowedFd;

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::OpenSkel;
use libbpf_rs::{MapCore, MapFlags, OpenObject, ProgramMut};

use crate::kernel::attach::{self, Fallback, Hook, Mechanism, Role, HOOKS};
use crate::kernel::features::{self, KernelBtf, Tracefs};
use crate::kernel::footprint::possible_cpus;
use crate::kernel::maps::MappedArray;
use crate::kernel::skel::{full_object_fits, types, KheapSkelBuilder, OpenKheapSkel};
use crate::kernel::storage::ObjectStorage;
use crate::model::Source;

use super::config::{Config, LiveStore};
use super::labels::{kmalloc_cache_resolution, label_ranges, Kallsyms, PageBases};
use super::tracer::{LiveTable, Tracer};

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
        if let Some(why) = features::kmem_unsupported(kbtf) {
            bail!(why);
        }
        // Refused before anything loads when the maps would not fit.
        super::budget::check(cfg, lat_starts.is_some())?;
        let mut slots = storage.slots();
        let table = cfg.live.is_some() && full_object_fits();
        // Read at most once for all the attempts below (a kernel before
        // 6.13 refuses tp_btf, and raw_tp is tried next), and only where a
        // table of kernel addresses is needed (bucket-cache bases, label
        // ranges): the kernel generates its 5 MB anew for every read, about
        // a tenth of a short run in an emulated guest.
        let kallsyms = Kallsyms::default();
        let (mut tracer, refused) = attach::start_first(cfg.attach, |mech| {
            let slot = slots.next().context("no object storage left")?;
            match Self::start_with(cfg, kbtf, &kallsyms, mech, slot, lat_starts, table) {
                // Older verifiers (5.15's) give up on leaks' program with the
                // object table before the end of its paths; without it, the
                // program is the one kernels before 5.12 load.
                Err(e) if table && verifier_gave_up(&e) => {
                    let slot = slots.next().context("no object storage left")?;
                    let mut tracer =
                        Self::start_with(cfg, kbtf, &kallsyms, mech, slot, lat_starts, false)?;
                    tracer.skipped.push(
                        "leaks' object table: this kernel's verifier gave up checking its \
                         program (too many instructions); objects are kept in a hash map \
                         (about twice the cost per object)"
                            .into(),
                    );
                    Ok(tracer)
                }
                result => result,
            }
        })?;
        // Shown in the report header: why a cheaper way was not used.
        tracer.skipped.extend(refused);
        Ok(tracer)
    }

    fn start_with(
        cfg: &Config,
        kbtf: &KernelBtf,
        kallsyms: &Kallsyms,
        mech: Mechanism,
        slot: &'obj mut MaybeUninit<OpenObject>,
        lat_starts: Option<BorrowedFd<'_>>,
        table: bool,
    ) -> Result<Tracer<'obj>> {
        if mech == Mechanism::Btf && !kbtf.typed_programs {
            bail!("the kernel exposes no BTF of its own to check typed programs with");
        }
        if mech == Mechanism::Btf && crate::kernel::features::tp_btf_refuses_void_pointers(kbtf) {
            bail!(
                "its verifier refuses a typed read of kmalloc's `const void *ptr`, \
                 which Linux 6.13 accepts"
            );
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
                Role::Interrupt => cfg.tells_interrupts(),
                Role::Switch => cfg.own_process_by_switch(),
            };
            if !wanted {
                continue;
            }
            let tp = hook.tracepoint;
            if mech.has_hook(hook, kbtf, tracefs.as_ref()) {
                enabled.push(hook);
            } else if hook.until.is_some() {
                // Newer kernels fire these events as another hook's.
            } else if hook.role == Role::Switch {
                // Each event's tgid tells kheap's own instead.
            } else if cfg.live.is_some() && hook.role.is_event() {
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
        let live_store = cfg.live_store(table);
        let kmalloc_caches = configure(&mut open, cfg, live_store, kbtf, kallsyms, lat_starts)?;
        if let Err(why) = &kmalloc_caches {
            skipped.push(why.clone());
        }
        if let Some(why) = kfree_caches_missing(cfg, kbtf) {
            skipped.push(why);
        }
        let labels = label_ranges(cfg, kallsyms)?;
        // Programs that hook a function's entry besides its return.
        let entry_programs: Vec<String> = enabled
            .iter()
            .filter_map(|h| h.entry_program(fallback?))
            .collect();
        if let Some(rodata) = open.maps.rodata_data.as_deref_mut() {
            rodata.cfg.backing_ranges = labels.page;
            rodata.cfg.vmap_ranges = labels.vmap;
            rodata.cfg.given_stacks = u8::from(!entry_programs.is_empty());
            rodata.cfg.own_process_by_switch =
                u8::from(enabled.iter().any(|h| h.role == Role::Switch));
        }
        if entry_programs.is_empty() {
            open.maps
                .vmap_entries
                .set_max_entries(1)
                .context("sizing the vmap entry map")?;
        }
        // Exactly the programs of the chosen mechanism and hooks load; any
        // other program left in the object would fail the whole load.
        let log_level = crate::kernel::load_log_level();
        for mut prog in open.open_object_mut().progs_mut() {
            let name = prog.name().to_string_lossy().into_owned();
            let on = if name == "clock" || name == "asked_cache" {
                cfg.live.is_some()
            } else if entry_programs.contains(&name) {
                true
            } else {
                enabled.iter().any(|h| {
                    program_name(h, mech, fallback) == name
                        || h.closing_program().is_some_and(|c| c == name)
                })
            };
            prog.set_autoload(on);
            if on {
                prog.set_log_level(log_level);
            }
        }
        let kernel_memory = super::budget::loaded_footprint(&open, lat_starts.is_some())?;
        let skel =
            crate::kernel::load_skel(open).context("loading the BPF programs into the kernel")?;
        let site_slots = MappedArray::new(&skel.maps.site_slots)?;
        let mut tracer = Tracer {
            skel,
            links: Vec::new(),
            cfg: cfg.clone(),
            mech,
            fallback,
            programs: Vec::new(),
            attached: Vec::new(),
            skipped,
            kmalloc_caches: kmalloc_caches.unwrap_or_else(|why| why),
            kfree_caches: kfree_caches_traced(cfg, kbtf),
            kernel_memory,
            stack_cache: RefCell::default(),
            slot_sites: RefCell::default(),
            site_slots,
            slab_sysfs: RefCell::default(),
            live_table: None,
            asked: RefCell::default(),
            clock0: types::clock_sample::default(),
            ended: None,
            _tracefs: tracefs,
        };
        if cfg.live.is_some() {
            tracer.clock0 = tracer.clock()?;
        }
        if live_store.buckets > 0 {
            let maps = &tracer.skel.maps;
            tracer.live_table = Some(LiveTable {
                // Writable: serve ages objects out of it.
                buckets: MappedArray::writable(&maps.live_buckets)?,
                slots: MappedArray::new(&maps.live_slots)?,
            });
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
        // One line for the interrupt brackets, where the first is attached.
        let mut brackets: Option<(usize, Vec<&str>)> = None;
        for hook in enabled {
            let tp = hook.tracepoint;
            if let (Some(close), Some(name)) = (hook.closed_by, hook.closing_program()) {
                let prog = tracer
                    .program_named(&name)
                    .with_context(|| format!("no program {name}"))?;
                let link = prog
                    .attach_raw_tracepoint(close)
                    .with_context(|| format!("attaching to {close}"))?;
                tracer.links.push(link);
                tracer.programs.push((close, name));
            }
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
            tracer
                .programs
                .push((tp, program_name(hook, mech, fallback)));
            if hook.role == Role::Switch {
                tracer.await_own_switch()?;
            }
            if hook.role == Role::Interrupt {
                let at = tracer.attached.len();
                let kind = tp.strip_suffix("_entry").unwrap_or(tp);
                brackets.get_or_insert((at, Vec::new())).1.push(kind);
                continue;
            }
            let how = match (hook.function, fallback) {
                (Some(f), Some(via)) => format!("{} on {f}", via.name()),
                _ => hook.only.unwrap_or(mech).name().to_string(),
            };
            tracer.attached.push(format!("{tp}: {how}"));
        }
        if let Some((at, kinds)) = brackets {
            tracer.attached.insert(
                at,
                format!(
                    "interrupts: {} on the entries and exits of {}",
                    Mechanism::Raw.name(),
                    kinds.join("/")
                ),
            );
        }
        Ok(tracer)
    }

    /// The loaded program of one hook, for this tracer's mechanism.
    pub(super) fn program(&self, hook: &Hook) -> Option<&ProgramMut<'obj>> {
        self.program_named(&program_name(hook, self.mech, self.fallback))
    }

    pub(super) fn program_named(&self, name: &str) -> Option<&ProgramMut<'obj>> {
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
            &p.own_switch_btf,
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
            &p.softirq_exit_raw,
            &p.irq_handler_exit_raw,
            &p.local_timer_exit_raw,
            &p.irq_work_exit_raw,
            &p.call_function_exit_raw,
            &p.call_function_single_exit_raw,
            &p.softirq_entry_raw,
            &p.irq_handler_entry_raw,
            &p.local_timer_entry_raw,
            &p.irq_work_entry_raw,
            &p.call_function_entry_raw,
            &p.call_function_single_entry_raw,
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

    /// Sleeps until the thread attaching has been switched in under the
    /// sched_switch program's watch: until then, the CPU it runs on does
    /// not know that it runs kheap (bpf/kheap/own_process.c). kheap's other
    /// threads are asleep, and known when they are switched in.
    fn await_own_switch(&self) -> Result<()> {
        let key = 0u32.to_ne_bytes();
        for _ in 0..1000 {
            // A sleep switches this thread out, and back in under the
            // program's watch.
            std::thread::sleep(std::time::Duration::from_micros(20));
            let per_cpu = self
                .skel
                .maps
                .own_process_on_cpu
                .lookup_percpu(&key, MapFlags::ANY)
                .context("reading which CPU runs kheap")?
                .unwrap_or_default();
            // This thread runs the lookup: its CPU says so once it has
            // been switched in since the attach.
            if per_cpu.iter().any(|v| v.iter().any(|&b| b != 0)) {
                return Ok(());
            }
        }
        bail!(
            "the sched_switch program never saw kheap switched in: its own allocations \
             could not be told apart (run with a filter, e.g. --by process, to test each event's process instead)"
        )
    }

    /// Detaches every program now, in the reverse of the attach order (the
    /// task switches last: kheap's own events are known until the end);
    /// the maps stay readable.
    pub fn detach(&mut self) {
        self.drop_links();
        if self.cfg.live.is_some() {
            self.ended = self.clock().ok();
        }
    }
}

/// Whether loading failed because the verifier stopped before checking
/// every path (its instruction limit: E2BIG).
fn verifier_gave_up(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<libbpf_rs::Error>())
        .any(|e| e.kind() == libbpf_rs::ErrorKind::TooBig)
}

fn configure(
    open: &mut OpenKheapSkel<'_>,
    cfg: &Config,
    live_store: LiveStore,
    kbtf: &KernelBtf,
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
    c.task_btf = u8::from(kbtf.typed_programs && kbtf.has_helper("get_current_task_btf"));
    c.slab_account_mask = kbtf.slab_account_mask;
    c.by_cgroup = u8::from(cfg.by_cgroup);
    c.filter.cgroups = u8::from(!cfg.cgroups.is_empty());
    c.capture_stacks = u8::from(cfg.stack_sample_every > 0);
    c.stack_sample_mask = cfg.stack_sample_every.saturating_sub(1);
    c.by_process = u8::from(cfg.by_process);
    c.stack_owners = u8::from(cfg.stacks_by_owner());
    c.filter.pids = u8::from(!cfg.pids.is_empty());
    c.tests_context = u8::from(cfg.tests_context());
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
    rodata.slab_page_shift = page_shift();
    // The same page lookup names the cache of kmem_cache events before 6.1,
    // which pass none (bpf/kmem_classic.bpf.h, cache_events_pass_cache).
    let resolution = kmalloc_cache_resolution(kbtf, kallsyms);
    let kmalloc_caches = match resolution {
        Err(why) if kbtf.cache_events_pass_cache => Err(why),
        Err(why) => Err(format!(
            "{why}; this kernel's kmem_cache events (before 6.1) name no cache either, so \
             those caches show as their object size"
        )),
        Ok(None) => Ok("the object's slab, named by the kernel (bpf_get_kmem_cache)".to_string()),
        Ok(Some(PageBases::Variables {
            direct_map,
            vmemmap,
        })) => {
            rodata.direct_map_base_addr = direct_map;
            rodata.vmemmap_base_addr = vmemmap;
            Ok(
                "the object's slab, found through its page (page_offset_base and vmemmap_base \
                from /proc/kallsyms)"
                    .to_string(),
            )
        }
        Ok(Some(PageBases::Values(b))) => {
            let bss = open
                .maps
                .bss_data
                .as_deref_mut()
                .context("the BPF object has no .bss section")?;
            bss.direct_map_base = b.direct_map;
            bss.vmemmap_base = b.vmemmap;
            Ok(format!(
                "the object's slab, found through its page (bases derived from memstart_addr \
                 and mem_section, checked against the kmalloc caches' own slabs: direct map \
                 {:#x}, vmemmap {:#x})",
                b.direct_map, b.vmemmap
            ))
        }
    };
    if kmalloc_caches.is_ok() {
        open.maps
            .rodata_data
            .as_deref_mut()
            .context("the BPF object has no read-only data section")?
            .resolve_kmalloc_caches = 1;
    }
    let rodata = open
        .maps
        .rodata_data
        .as_deref_mut()
        .context("the BPF object has no read-only data section")?;
    let cpus = possible_cpus()?;
    rodata.site_slot_mask = cfg.site_slots(cpus) - 1;
    rodata.kmalloc_memo_mask = Config::kmalloc_memo_slots(cpus) - 1;
    let c = &mut rodata.cfg;
    c.kfree_caches = u8::from(kfree_caches_traced(cfg, kbtf));
    if let Some(live) = cfg.live {
        c.track_live = 1;
        c.ptr_sample_mask = live.sample_every.max(1) - 1;
    }
    c.live_buckets = live_store.buckets;
    if let Some(fd) = lat_starts {
        c.latency_active = 1;
        open.maps.lat_starts.reuse_fd(fd)?;
    }
    super::budget::size_maps(open, cfg, live_store, cpus, lat_starts.is_some())?;
    Ok(kmalloc_caches)
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

/// log2 of the page size, for the page allocator's bytes (PAGE_SIZE << order).
fn page_shift() -> u8 {
    crate::sys::page_size().trailing_zeros() as u8
}

/// Whether kfree events name their cache in this run (`Config::kfree_caches`
/// where the kfunc can; leaks counts no frees per cache).
fn kfree_caches_traced(cfg: &Config, kbtf: &KernelBtf) -> bool {
    cfg.kfree_caches && cfg.live.is_none() && kbtf.kmem_cache_kfunc
}

/// Why a run that asked for kfree's frees per cache counts them in the
/// totals only, said in the report's header rather than left as a row
/// with no frees that looks like a leak.
fn kfree_caches_missing(cfg: &Config, kbtf: &KernelBtf) -> Option<String> {
    if !cfg.kfree_caches || cfg.live.is_some() || kfree_caches_traced(cfg, kbtf) {
        return None;
    }
    Some(format!(
        "kfree: frees counted in the totals only, not per cache ({KFREE_CACHES_NEED})"
    ))
}

/// What a kernel needs for kfree's frees to be counted per cache.
pub const KFREE_CACHES_NEED: &str =
    "this kernel has no bpf_get_kmem_cache kfunc: Linux 6.13+ with its own BTF";
