//! Loading the malloc BPF object, attaching its uprobes to allocator
//! libraries, and reading the maps back. Links are RAII: dropping the
//! session (on any error path too) detaches everything.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use libbpf_rs::skel::{OpenSkel, Skel};
use libbpf_rs::{Link, MapCore, MapFlags, UprobeOpts};

use crate::allocators::PreloadSites;
use crate::allocators::{self, Layout, Probe};
use crate::kernel::malloc_skel::{types, MallocSkel, MallocSkelBuilder, OpenMallocSkel};
use crate::kernel::maps;
use crate::kernel::skel::{c_str, from_bytes};
use crate::kernel::storage::ObjectStorage;
use crate::model::malloc::{AllocatorCode, Events, Key, Snapshot};
use crate::symbolize::user::{kernel_file, Vma};

/// One library whose allocator functions are probed.
pub struct ProbedLibrary {
    pub path: PathBuf,
    pub probes: Vec<Probe>,
    pub missing: Vec<&'static str>,
    file_key: (u64, u64),
    /// The file as the BPF side names it: (kernel device, inode).
    pub kernel_file: (u32, u64),
}

impl ProbedLibrary {
    /// `path: malloc, calloc, …, free@+3` for the header.
    pub fn describe(&self) -> String {
        let names: Vec<String> = self
            .probes
            .iter()
            .map(|p| {
                if p.skip > 0 {
                    format!("{}@+{}", p.label, p.skip)
                } else {
                    p.label.clone()
                }
            })
            .collect();
        let mut s = format!("{}: {}", self.path.display(), names.join(", "));
        if !self.missing.is_empty() {
            s.push_str(&format!(" (not exported: {})", self.missing.join(", ")));
        }
        s
    }
}

pub struct MallocSession<'obj> {
    skel: MallocSkel<'obj>,
    links: Vec<Link>,
    pub libraries: Vec<ProbedLibrary>,
    track_live: bool,
    probes_at_entry: bool,
    /// The path for kernels before 5.17 (`features::malloc_legacy`): one
    /// program per function (slot_N) instead of attach cookies.
    legacy: bool,
    /// The preload library, once its sites are probed: (kernel device,
    /// inode) of its file.
    preload: Option<(u32, u64)>,
    /// The kernel memory of the run's BPF maps (the block store and the
    /// stack-copy ring too), as the kernel counts it.
    pub kernel_memory: u64,
}

/// Stated apart from the budget: the outstanding-block store, which
/// `--max-outstanding` sizes (as leaks' object store), and with
/// --exact-stacks the ring the stack copies travel through to be unwound
/// (128 MiB, `user_stack.rs` says why). The default ring (8 MiB) counts in
/// the budget.
fn apart(stack_sample_every: u32) -> &'static [&'static str] {
    match stack_sample_every {
        1 => &["live", "user_stacks"],
        _ => &["live"],
    }
}

/// malloc's budget on `cpus` possible CPUs: the counting modes'.
pub fn budget(cpus: u32) -> crate::model::kernel_memory::Budget {
    crate::model::kernel_memory::Budget::new(crate::model::kernel_memory::COUNTING_BASE, cpus)
}

/// Sizes the maps and the stack ring for a run (`start`, and `footprint`
/// before anything loads).
fn size_maps(
    open: &mut OpenMallocSkel<'_>,
    track_live: bool,
    max_live: u32,
    stack_sample_every: u32,
    legacy: bool,
) -> Result<()> {
    // The block map is preallocated (~60 bytes a block): keep a token
    // entry when it is not used.
    open.maps
        .live
        .set_max_entries(if track_live { max_live } else { 1 })
        .context("sizing the outstanding-block map")?;
    if legacy {
        // No task storage (5.11): thread states in a preallocated hash
        // keyed by thread id (bpf/malloc.bpf.c deletes a thread's entry
        // when it exits).
        let threads = &mut open.maps.threads;
        threads.set_type(libbpf_rs::MapType::Hash)?;
        threads.set_map_flags(0)?;
        threads
            .set_max_entries(crate::kernel::features::MALLOC_LEGACY_THREADS)
            .context("sizing the thread map")?;
    }
    crate::kernel::user_stack::configure(open, stack_sample_every)
}

/// The legacy path's program `NAME_legacy` (`slot_N` for a slot's), or
/// None on the default path.
fn legacy_program<'a>(
    skel: &'a MallocSkel<'_>,
    legacy: bool,
    name: &str,
) -> Result<Option<libbpf_rs::ProgramMut<'a>>> {
    if !legacy {
        return Ok(None);
    }
    let name = if name.starts_with("slot_") {
        name.to_string()
    } else {
        format!("{name}_legacy")
    };
    skel.object()
        .progs_mut()
        .find(|prog| prog.name() == name.as_str())
        .map(Some)
        .with_context(|| format!("the BPF object has no program {name}"))
}

/// Whether this kernel takes malloc's legacy path.
fn legacy_path() -> Result<bool> {
    Ok(crate::kernel::features::malloc_legacy(crate::kernel::features::kernel_btf()?).is_some())
}

/// How slot `i`'s program reads its arguments on the legacy path: the
/// numbers of `enum malloc_layout` in bpf/malloc.h (0: a free, whose
/// programs need no slot).
fn layout_code(layout: Layout) -> u8 {
    match layout {
        Layout::Free | Layout::OuterFree => 0,
        Layout::Size => 1,
        Layout::Calloc => 2,
        Layout::AlignSize => 3,
        Layout::PosixMemalign => 4,
        Layout::Realloc => 5,
        Layout::Reallocarray => 6,
        Layout::RustRealloc => 7,
    }
}

/// The allocator programs of the default path. The legacy path has its
/// own (`NAME_legacy`, and `slot_N` instead of those that read the attach
/// cookie): only one set is loaded. The process-tracking programs serve
/// both.
const DEFAULT_PROGRAMS: [&str; 12] = [
    "size_arg0",
    "calloc_entry",
    "align_size_args",
    "posix_memalign_entry",
    "realloc_entry",
    "reallocarray_entry",
    "rust_realloc_entry",
    "alloc_return",
    "preload_alloc",
    "free_entry",
    "outer_free_entry",
    "preload_free",
];

/// Chooses the programs of the path and, on the legacy one, tells each
/// slot's program its layout.
fn choose_programs(open: &mut OpenMallocSkel<'_>, legacy: bool) {
    let mut layouts = [0u8; allocators::slot_count()];
    for (i, l) in layouts.iter_mut().enumerate() {
        *l = layout_code(allocators::slot(i).layout);
    }
    for mut prog in open.open_object_mut().progs_mut() {
        let name = prog.name().to_string_lossy().into_owned();
        if DEFAULT_PROGRAMS.contains(&name.as_str()) {
            prog.set_autoload(!legacy);
        } else if name.ends_with("_legacy") {
            prog.set_autoload(legacy);
        } else if let Some(i) = name.strip_prefix("slot_") {
            let i: usize = i.parse().expect("slot programs are numbered");
            prog.set_autoload(legacy && layouts[i] != 0);
        }
    }
    if legacy {
        let rodata = open
            .maps
            .rodata_data
            .as_deref_mut()
            .expect("the BPF object has read-only data");
        rodata.slot_layouts = layouts;
    }
}

/// The kernel memory a malloc run of these settings takes on this machine
/// (what `apart` names apart).
pub fn footprint(
    track_live: bool,
    max_live: u32,
    stack_sample_every: u32,
) -> Result<crate::model::kernel_memory::Footprint> {
    footprint_on(
        track_live,
        max_live,
        stack_sample_every,
        legacy_path()?,
        crate::kernel::footprint::possible_cpus()?,
    )
}

/// `footprint` on a machine of `cpus` possible CPUs (the budget test).
fn footprint_on(
    track_live: bool,
    max_live: u32,
    stack_sample_every: u32,
    legacy: bool,
    cpus: u32,
) -> Result<crate::model::kernel_memory::Footprint> {
    let mut slot = std::mem::MaybeUninit::uninit();
    let mut open = crate::kernel::features::open_skel(MallocSkelBuilder::default(), &mut slot)?;
    size_maps(&mut open, track_live, max_live, stack_sample_every, legacy)?;
    measure_on(&open, stack_sample_every, cpus)
}

/// Refuses, before anything loads or starts, an outstanding-block store
/// (`--outstanding`, sized by `--max-outstanding`) that this machine cannot
/// give: its map is preallocated, so a run asking for more than it can have
/// would take the memory the machine's own work needs the moment it loads.
/// The limit is leaks' object store's: a quarter of MemAvailable, and what
/// RLIMIT_MEMLOCK leaves where the kernel charges maps to it.
pub fn check_store(max_live: u32, stack_sample_every: u32) -> Result<()> {
    store_check(max_live, stack_sample_every, None)
}

/// `check_store`, against `limit` where one is given (the tests).
fn store_check(max_live: u32, stack_sample_every: u32, limit: Option<(u64, &str)>) -> Result<()> {
    let legacy = legacy_path()?;
    let mut slot = std::mem::MaybeUninit::uninit();
    let mut open = crate::kernel::features::open_skel(MallocSkelBuilder::default(), &mut slot)?;
    // (the store's bytes, every other map's)
    let mut sized = |n: u32| -> Option<(u64, u64)> {
        size_maps(&mut open, true, n, stack_sample_every, legacy).ok()?;
        let f = measure(&open, stack_sample_every).ok()?;
        let store = f
            .maps
            .iter()
            .filter(|(name, _)| name == "live")
            .map(|(_, bytes)| bytes)
            .sum::<u64>();
        Some((store, f.total + f.apart - store))
    };
    let (_, rest) = sized(max_live).context("sizing the outstanding-block store")?;
    let (flag, what) = ("--max-outstanding", "the outstanding-block store");
    let bytes_at = |n| sized(n).map(|(store, _)| store);
    match limit {
        Some(limit) => {
            crate::kernel::footprint::check_store_within(flag, what, max_live, limit, bytes_at)
        }
        None => crate::kernel::footprint::check_store(flag, what, max_live, rest, bytes_at),
    }
}

/// The footprint of the object as sized: the maps `apart` names apart.
fn measure(
    open: &OpenMallocSkel<'_>,
    stack_sample_every: u32,
) -> Result<crate::model::kernel_memory::Footprint> {
    measure_on(
        open,
        stack_sample_every,
        crate::kernel::footprint::possible_cpus()?,
    )
}

fn measure_on(
    open: &OpenMallocSkel<'_>,
    stack_sample_every: u32,
    cpus: u32,
) -> Result<crate::model::kernel_memory::Footprint> {
    let shapes = crate::kernel::footprint::map_shapes(open.open_object(), &[]);
    Ok(crate::model::kernel_memory::Footprint::of(
        &shapes,
        cpus,
        apart(stack_sample_every),
    ))
}

impl<'obj> MallocSession<'obj> {
    /// Loads the programs, fills the PID filter and starts following forks.
    /// No library is probed yet: see `probe_library`.
    /// `probes_at_entry` keeps every probe on its function's first
    /// instruction (for scripts/bench-malloc, which measures what
    /// `allocators::probe_skip` saves).
    /// `max_live` sizes the outstanding-block map (--max-outstanding).
    /// With `cgroups` (v2 ids), only tasks in those cgroups or below them
    /// count.
    /// `stack_sample_every`: how often a copy of the user stack is sent to
    /// be unwound (see `crate::kernel::user_stack::configure`).
    pub fn start(
        storage: &'obj mut ObjectStorage,
        pids: &[u32],
        cgroups: &[u64],
        track_live: bool,
        max_live: u32,
        probes_at_entry: bool,
        stack_sample_every: u32,
    ) -> Result<MallocSession<'obj>> {
        if let Some(why) =
            crate::kernel::features::malloc_unsupported(crate::kernel::features::kernel_btf()?)
        {
            anyhow::bail!(why);
        }
        let legacy = legacy_path()?;
        // Preemption off where the kernel has the kfuncs (bpf/malloc.h,
        // no_preempt; bpf/stack_store.bpf.h says why the helpers those
        // programs call are static functions there).
        let no_preempt =
            crate::kernel::features::malloc_preemption_off(crate::kernel::features::kernel_btf()?);
        let slot = storage.slots().next().context("no object storage left")?;
        let mut open = crate::kernel::features::open_skel(MallocSkelBuilder::default(), slot)
            .context("opening the BPF object")?;
        let rodata = open
            .maps
            .rodata_data
            .as_deref_mut()
            .expect("the BPF object has read-only data");
        rodata.cfg.track_live = track_live as u8;
        rodata.cfg.cgroups = u8::from(!cgroups.is_empty());
        rodata.cfg.legacy = u8::from(legacy);
        rodata.cfg.no_preempt = u8::from(no_preempt);
        choose_programs(&mut open, legacy);
        size_maps(&mut open, track_live, max_live, stack_sample_every, legacy)?;
        let footprint = measure(&open, stack_sample_every)?;
        let kernel_memory = footprint.total + footprint.apart;
        let skel =
            crate::kernel::load_skel(open).context("loading the BPF programs into the kernel")?;
        if legacy {
            // The slot programs hand every call to this one (bpf/malloc.bpf.c).
            let fd = skel.progs.slot_call_legacy.as_fd().as_raw_fd();
            skel.maps
                .slot_call
                .update(&0u32.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY)
                .context("handing the slot programs' calls to slot_call_legacy")?;
        }
        let mut s = MallocSession {
            skel,
            links: Vec::new(),
            libraries: Vec::new(),
            track_live,
            probes_at_entry,
            legacy,
            preload: None,
            kernel_memory,
        };
        for &pid in pids {
            s.skel
                .maps
                .pid_filter
                .update(&pid.to_ne_bytes(), &[1u8], MapFlags::ANY)
                .context("adding a PID to the filter map")?;
        }
        for &id in cgroups {
            s.skel
                .maps
                .cgroup_filter
                .update(&id.to_ne_bytes(), &[1u8], MapFlags::ANY)
                .context("adding a cgroup to the filter map")?;
        }
        let progs = &s.skel.progs;
        for (prog, tp) in [
            (&progs.fork_btf, "sched_process_fork"),
            (&progs.exec_btf, "sched_process_exec"),
            (&progs.exit_btf, "sched_process_exit"),
        ] {
            let link = prog
                .attach()
                .with_context(|| format!("attaching to {tp} (tp_btf)"))?;
            s.links.push(link);
        }
        Ok(s)
    }

    /// Whether this library file is probed already.
    pub fn has_library(&self, path: &Path) -> bool {
        let key = std::fs::metadata(path).map(|m| (m.dev(), m.ino())).ok();
        self.libraries.iter().any(|l| Some(l.file_key) == key)
    }

    /// Attaches the allocator probes to one library file, for every process
    /// (uprobes live on the file; the PID filter picks the processes). A
    /// file already probed (under any of its names) is left alone: probing
    /// it twice would count every call twice.
    /// Returns whether any function was probed in it.
    pub fn probe_library(&mut self, path: &Path) -> Result<bool> {
        if self.has_library(path) {
            return Ok(false);
        }
        let meta = std::fs::metadata(path)
            .with_context(|| format!("cannot use {} as allocator library", path.display()))?;
        let mut symbols = allocators::lookup_symbols(path)?;
        let file_key = (meta.dev(), meta.ino());
        let kernel_file = kernel_file(&meta);
        if self.preload.is_some() {
            symbols = allocators::without_interposed(symbols);
        }
        let planned = allocators::plan(&symbols);
        if self.preload.is_some() && planned.is_err() {
            // Only the C family, which the preload library reports: kept,
            // with no probes, as looked at.
            self.libraries.push(ProbedLibrary {
                path: path.to_path_buf(),
                probes: Vec::new(),
                missing: Vec::new(),
                file_key,
                kernel_file,
            });
            return Ok(false);
        }
        let (mut plan, missing) =
            planned.with_context(|| format!("{} is not an allocator library", path.display()))?;
        // free is probed only to follow blocks (--outstanding): without
        // it, a malloc+free pair costs one probe hit instead of two.
        if !self.track_live {
            plan.retain(|p| !p.layout.is_free());
        }
        if self.probes_at_entry {
            for p in &mut plan {
                p.skip = 0;
            }
        }
        for p in &plan {
            self.attach_probe(path, p)
                .with_context(|| format!("attaching to {} in {}", p.label, path.display()))?;
        }
        self.libraries.push(ProbedLibrary {
            path: path.to_path_buf(),
            probes: plan,
            missing,
            file_key,
            kernel_file,
        });
        Ok(true)
    }

    /// Probes the sites of the preload library (`crate::malloc::preload`)
    /// for every process that maps it; from then on, libraries are probed
    /// without the C family that library reports (see
    /// `allocators::without_interposed`). Call before `probe_library`.
    pub fn probe_preload(&mut self, path: &Path, sites: PreloadSites) -> Result<()> {
        let meta =
            std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
        let progs = &self.skel.progs;
        let legacy_alloc = legacy_program(&self.skel, self.legacy, "preload_alloc")?;
        let legacy_free = legacy_program(&self.skel, self.legacy, "preload_free")?;
        let alloc = legacy_alloc.as_ref().unwrap_or(&progs.preload_alloc);
        let free = legacy_free.as_ref().unwrap_or(&progs.preload_free);
        let (allocs, frees) = sites.all();
        for offset in allocs {
            let link = alloc
                .attach_uprobe_with_opts(-1, path, offset as usize, UprobeOpts::default())
                .with_context(|| {
                    format!("attaching to an allocation site of {}", path.display())
                })?;
            self.links.push(link);
        }
        // free is followed only for --outstanding, as with the C library.
        if self.track_live {
            for offset in frees {
                let link = free
                    .attach_uprobe_with_opts(-1, path, offset as usize, UprobeOpts::default())
                    .with_context(|| format!("attaching to a free site of {}", path.display()))?;
                self.links.push(link);
            }
        }
        self.preload = Some(kernel_file(&meta));
        Ok(())
    }

    /// Whether the preload library's sites are probed.
    pub fn preloaded(&self) -> bool {
        self.preload.is_some()
    }

    /// The libraries with functions probed (not those left unprobed
    /// because the preload library reports their whole family).
    pub fn probed_libraries(&self) -> impl Iterator<Item = &ProbedLibrary> {
        self.libraries.iter().filter(|l| !l.probes.is_empty())
    }

    fn attach_probe(&mut self, path: &Path, p: &Probe) -> Result<()> {
        let progs = &self.skel.progs;
        let default_entry = match p.layout {
            Layout::Size => &progs.size_arg0,
            Layout::Calloc => &progs.calloc_entry,
            Layout::AlignSize => &progs.align_size_args,
            Layout::PosixMemalign => &progs.posix_memalign_entry,
            Layout::Realloc => &progs.realloc_entry,
            Layout::Reallocarray => &progs.reallocarray_entry,
            Layout::Free => &progs.free_entry,
            Layout::OuterFree => &progs.outer_free_entry,
            Layout::RustRealloc => &progs.rust_realloc_entry,
        };
        // Without cookies, one program per function (its slot's).
        let legacy_entry = match p.layout {
            Layout::Free => legacy_program(&self.skel, self.legacy, "free_entry")?,
            Layout::OuterFree => legacy_program(&self.skel, self.legacy, "outer_free_entry")?,
            _ => legacy_program(&self.skel, self.legacy, &format!("slot_{}", p.cookie))?,
        };
        let entry = legacy_entry.as_ref().unwrap_or(default_entry);
        let legacy_return = legacy_program(&self.skel, self.legacy, "alloc_return")?;
        let alloc_return = legacy_return.as_ref().unwrap_or(&progs.alloc_return);
        // The legacy path's kernels have no cookies: its slot programs
        // know their function.
        let cookie = if self.legacy { 0 } else { p.cookie as u64 };
        let opts = |retprobe| UprobeOpts {
            cookie,
            retprobe,
            ..Default::default()
        };
        // The return probe first: every call whose entry is seen then has
        // its return seen too, so no call is left pending forever.
        // Past a skipped instruction the return address is still at the
        // stack pointer, which is all a return probe needs.
        let offset = (p.file_offset + p.skip) as usize;
        if self.track_live && !p.layout.is_free() {
            self.links
                .push(alloc_return.attach_uprobe_with_opts(-1, path, offset, opts(true))?);
        }
        self.links
            .push(entry.attach_uprobe_with_opts(-1, path, offset, opts(false))?);
        Ok(())
    }

    /// Processes traced now: the given ones and their descendants.
    pub fn traced_pids(&self) -> Vec<u32> {
        self.skel
            .maps
            .pid_filter
            .keys()
            .map(|k| from_bytes::<u32>(&k))
            .collect()
    }

    /// How many times each traced process has exec'd (absent: never).
    pub fn exec_counts(&self) -> HashMap<u32, u32> {
        self.skel
            .maps
            .execs
            .keys()
            .filter_map(|k| {
                let v = self.skel.maps.execs.lookup(&k, MapFlags::ANY).ok()??;
                Some((from_bytes::<u32>(&k), from_bytes::<u32>(&v)))
            })
            .collect()
    }

    /// Programs traced processes exec'd: ((kernel device, inode), path as
    /// passed to execve, possibly relative).
    pub fn exec_paths(&self) -> Result<Vec<((u32, u64), PathBuf)>> {
        Ok(
            maps::read_hash_entries::<types::file_id, types::exec_path, _>(
                &self.skel.maps.exec_paths,
            )?
            .into_iter()
            .map(|(k, v)| ((k.dev, k.ino), PathBuf::from(c_str(&v.path))))
            .collect(),
        )
    }

    /// Row labels by attach cookie: aliases joined (`aligned_alloc|memalign`).
    pub fn func_names(&self) -> Vec<String> {
        let mut names: Vec<String> = (0..allocators::slot_count())
            .map(|i| allocators::slot(i).label)
            .collect();
        for l in &self.libraries {
            for p in &l.probes {
                names[p.cookie as usize] = p.label.clone();
            }
        }
        names
    }

    /// The code of every probed function: calls made from there are the
    /// allocator's own.
    pub fn allocator_code(&self) -> Vec<AllocatorCode> {
        let preload = self.preload.map(|file| AllocatorCode {
            file,
            start: 0,
            end: u64::MAX,
        });
        self.libraries
            .iter()
            .flat_map(|l| {
                l.probes.iter().map(|p| AllocatorCode {
                    file: l.kernel_file,
                    start: p.file_offset,
                    end: p.file_offset + p.size.max(1),
                })
            })
            .chain(preload)
            .collect()
    }

    pub(crate) fn user_stacks_map(&self) -> &libbpf_rs::Map<'obj> {
        &self.skel.maps.user_stacks
    }

    pub fn user_stack_events(&self) -> Result<crate::model::malloc::UnwindEvents> {
        crate::kernel::user_stack::events(&self.skel.maps.user_stack_counters)
    }

    pub fn detach(&mut self) {
        self.links.clear();
    }

    pub fn snapshot(&self) -> Result<Snapshot> {
        let m = &self.skel.maps;
        let mut snap = Snapshot::default();
        for (k, v) in maps::read_counts::<types::malloc_key, types::malloc_stats, _>(&m.sites)? {
            let key = Key::from(&k);
            if key.stack_id >= 0 && !snap.stacks.contains_key(&key.stack_id) {
                if let Some(frames) =
                    maps::read_stack(&m.stack_traces, &key.stack_id.to_ne_bytes())?
                {
                    snap.stacks.insert(key.stack_id, frames);
                }
            }
            snap.sites.insert(key, v.into());
        }
        if self.track_live {
            let mut live: HashMap<Key, (u64, u64)> = HashMap::new();
            for (_, a) in maps::read_hash_entries::<types::live_key, types::live_alloc, _>(&m.live)?
            {
                let e = live.entry((&a.key).into()).or_default();
                e.0 += 1;
                e.1 += a.size;
            }
            snap.live = Some(live);
        }
        let c: types::malloc_counters = maps::read_percpu_slot0(&m.counters)?;
        snap.events = Events {
            frees: c.frees,
            frees_null: c.frees_null,
            frees_untracked: c.frees_untracked,
            failed: c.failed,
            lost_stacks: c.lost_stacks,
            map_full_sites: c.map_full_sites,
            map_full_live: c.map_full_live,
            map_full_vmas: c.map_full_vmas,
            vma_lookup_failed: c.vma_lookup_failed,
            caller_unreadable: c.caller_unreadable,
            nested: c.nested,
            no_thread_state: c.no_thread_state,
        };
        Ok(snap)
    }

    /// The status line's counters: one read of the per-CPU counters slot,
    /// never a walk of the maps. Fill is the sites map's (its entries are
    /// counted as they are created); the --outstanding block map is not
    /// counted cheaply, and is shown as lost when it fills.
    pub fn progress(&self) -> Result<crate::model::progress::Counters> {
        let m = &self.skel.maps;
        let c: types::malloc_counters = maps::read_percpu_slot0(&m.counters)?;
        Ok(crate::model::progress::Counters {
            events: c.allocs,
            lost_stacks: c.lost_stacks,
            // As the report's lost.map_full.
            not_aggregated: c.map_full_sites + c.map_full_live + c.map_full_vmas,
            // The report counts none: a uprobe's program is never skipped
            // for another running on its CPU.
            skipped: 0,
            maps: vec![crate::model::progress::MapFill {
                name: "sites",
                entries: c.sites_created,
                capacity: m.sites.max_entries().into(),
            }],
        })
    }

    /// The mappings recorded for stack frames, per address space, sorted.
    pub fn vmas(&self) -> Result<HashMap<u64, Vec<Vma>>> {
        let mut out: HashMap<u64, Vec<Vma>> = HashMap::new();
        for (k, v) in
            maps::read_hash_entries::<types::vma_key, types::vma_info, _>(&self.skel.maps.vmas)?
        {
            out.entry(k.mm).or_default().push(Vma {
                start: k.start,
                end: v.end,
                pgoff: v.pgoff,
                dev: v.dev,
                ino: v.ino,
                name: c_str(&v.name),
            });
        }
        for v in out.values_mut() {
            v.sort_by_key(|v| v.start);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store over the limit is refused in one line that names what fits
    /// (the largest, rounded down); that passes, and a tenth more does not.
    /// (The object is opened and sized, not loaded: no root needed.)
    /// Issue 45: malloc keeps to the counting modes' budget at any CPU
    /// count, its stack-copy ring included, on either path (`--exact-stacks`'
    /// ring and `--outstanding`'s store are apart, as leaks' store is).
    #[test]
    fn malloc_keeps_to_its_budget_on_any_cpu_count() {
        for legacy in [false, true] {
            let mut at = Vec::new();
            for cpus in [1, 2, 32, 128, 192, 256] {
                let f = footprint_on(
                    false,
                    1,
                    crate::kernel::user_stack::DEFAULT_SAMPLE_EVERY,
                    legacy,
                    cpus,
                )
                .unwrap();
                let b = budget(cpus);
                assert!(
                    f.total <= b.bytes,
                    "legacy {legacy}, {cpus} CPUs: {} > {}: {:?}",
                    f.total,
                    b.bytes,
                    f.maps
                );
                // The ring is counted, not apart.
                assert!(f
                    .maps
                    .iter()
                    .any(|(n, b)| n == "user_stacks" && *b > 8 << 20));
                // Apart: only the token entry of the unused block store.
                let live = f.maps.iter().find(|(n, _)| n == "live").unwrap().1;
                assert!(f.apart == live && live < 64 << 10, "{:?}", f.maps);
                at.push(f.total);
            }
            // Something was measured: the stack map and the ring alone are
            // megabytes.
            assert!(at[0] > 16 << 20, "{at:?}");
        }
        // With every call copied, the larger ring is stated apart.
        let exact = footprint_on(false, 1, 1, false, 2).unwrap();
        assert!(exact.apart > 128 << 20, "{:?}", exact.maps);
    }

    #[test]
    fn an_outstanding_store_over_the_limit_is_refused_with_what_fits() {
        let limit = Some((64 << 20, "a test's limit"));
        let err = format!("{:#}", store_check(1 << 24, 64, limit).unwrap_err());
        assert!(
            err.starts_with("--max-outstanding 16777216: the outstanding-block store would take "),
            "{err}"
        );
        let (_, fits) = err
            .split_once("(a test's limit); at most --max-outstanding ")
            .unwrap_or_else(|| panic!("{err}"));
        let fits: u32 = fits.strip_suffix(" fits here").unwrap().parse().unwrap();
        // Blocks of tens of bytes: hundreds of thousands in 64 MiB.
        assert!((100_000..1 << 24).contains(&fits), "{err}");
        // Rounded down to two significant digits, at most a tenth below
        // the largest that fits.
        assert_eq!(fits, crate::model::kernel_memory::round_suggestion(fits));
        store_check(fits, 64, limit).unwrap();
        assert!(store_check(fits / 10 * 11 + 1, 64, limit).is_err());
    }
}
