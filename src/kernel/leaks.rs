//! Loading bpf/leaks.bpf.c and reading what it tracks. Links are RAII:
//! dropping the session (on any exit path, errors included) detaches
//! everything.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd};

use anyhow::{bail, Context, Result};
use libbpf_rs::query::{ProgInfoIter, ProgInfoQueryOptions};
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, ProgramInput, ProgramMut};

use crate::kernel::attach::{self, program_name, AttachMode, Mechanism};
use crate::kernel::features::{self, KernelBtf, Tracefs};
use crate::kernel::kmem::cache_id;
use crate::kernel::maps;
use crate::kernel::skel::leaks::{types, LeaksSkel, LeaksSkelBuilder, OpenLeaksSkel};
use crate::kernel::skel::{c_str, from_bytes};
use crate::model::live::{jiffies_to_ns, nearest_hz, LeakEvents, LeakInput, LiveObject, Unseen};
use crate::model::snapshot::{EventCounters, Snapshot};
use crate::model::SiteKey;

/// What a leaks run traces and how.
#[derive(Clone, Debug)]
pub struct LeaksConfig {
    pub min_size: u64,
    pub max_size: Option<u64>,
    pub pids: Vec<u32>,
    pub follow_children: bool,
    pub comm: Option<String>,
    /// 1: every address; N (a power of two): addresses whose hash picks
    /// about one in N.
    pub sample_every: u32,
    /// 1: every stack; N (a power of two): about one allocation in N; 0: none.
    pub stack_sample_every: u32,
    /// Capacity of the object map.
    pub max_objects: u32,
    pub max_sites: u32,
    pub attach: AttachMode,
}

impl Default for LeaksConfig {
    fn default() -> Self {
        LeaksConfig {
            min_size: 0,
            max_size: None,
            pids: Vec::new(),
            follow_children: false,
            comm: None,
            sample_every: 1,
            stack_sample_every: 256,
            max_objects: 262_144,
            max_sites: 8192,
            attach: AttachMode::Auto,
        }
    }
}

/// The hooks, in attach order: allocations are only tracked once both free
/// hooks are attached, so no tracked object's free can be missed at start.
const HOOKS: [&str; 5] = [
    "kfree",
    "kmem_cache_free",
    "sched_process_fork",
    "kmalloc",
    "kmem_cache_alloc",
];

pub struct LeaksSession {
    skel: LeaksSkel<'static>,
    links: Vec<Link>,
    cfg: LeaksConfig,
    /// The clock when the programs were loaded, to measure the tick rate.
    clock0: types::clock_sample,
    /// Hook → how it is attached ("kmalloc: tp_btf").
    pub attached: Vec<String>,
    /// Hooks not attached, with the reason.
    pub skipped: Vec<String>,
    mech: Mechanism,
    // Held so a tracefs kheap mounted itself stays mounted while attached.
    _tracefs: Option<Tracefs>,
}

impl LeaksSession {
    /// Opens, configures, loads and attaches, with the same strategy as
    /// `record` (tp_btf, then raw_tp, then classic tracepoints).
    pub fn start(cfg: &LeaksConfig) -> Result<LeaksSession> {
        features::check_btf()?;
        let kbtf = features::kernel_btf()?;
        let (mut session, refused) =
            attach::start_first(cfg.attach, |mech| Self::start_with(cfg, &kbtf, mech))?;
        session.skipped.extend(refused);
        Ok(session)
    }

    fn start_with(cfg: &LeaksConfig, kbtf: &KernelBtf, mech: Mechanism) -> Result<LeaksSession> {
        let tracefs = if mech.needs_tracefs() {
            Some(Tracefs::ensure_mounted()?)
        } else {
            None
        };
        let available = |tp: &str| mech.has_hook(tp, kbtf, tracefs.as_ref());
        // Without every free hook, everything would look leaked.
        for tp in features::KMEM_TRACEPOINTS {
            if !available(tp) {
                bail!("kheap leaks needs the kmem:{tp} tracepoint, which this kernel lacks");
            }
        }
        // The skeleton borrows its object storage for its whole life; a run
        // opens at most two, so leaking the storage is the simple, safe owner.
        let storage: &'static mut MaybeUninit<OpenObject> =
            Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = LeaksSkelBuilder::default()
            .open(storage)
            .context("opening the BPF object")?;
        configure(&mut open, cfg, kbtf)?;
        let follow = cfg.follow_children && available("sched_process_fork");
        if cfg.follow_children && !follow {
            eprintln!("kheap: warning: sched_process_fork is not available; children of the command are not followed");
        }
        let enabled: Vec<&str> = HOOKS
            .into_iter()
            .filter(|&tp| tp != "sched_process_fork" || follow)
            .collect();
        // Exactly the programs of the chosen mechanism and hooks load.
        for mut prog in open.open_object_mut().progs_mut() {
            let name = prog.name().to_string_lossy().into_owned();
            if name != "clock" {
                prog.set_autoload(enabled.iter().any(|tp| program_name(tp, mech) == name));
            }
        }
        let skel = open
            .load()
            .context("loading the BPF programs into the kernel")?;
        let mut session = LeaksSession {
            skel,
            links: Vec::new(),
            cfg: cfg.clone(),
            clock0: types::clock_sample::default(),
            mech,
            attached: Vec::new(),
            skipped: Vec::new(),
            _tracefs: tracefs,
        };
        session.clock0 = session.clock()?;
        for &pid in &cfg.pids {
            session.add_pid(pid)?;
        }
        for tp in enabled {
            let link = session
                .prog(tp)
                .with_context(|| format!("no {} program for {tp}", mech.name()))?
                .attach()
                .with_context(|| format!("attaching to {tp}"))?;
            session.links.push(link);
            session.attached.push(format!("{tp}: {}", mech.name()));
        }
        Ok(session)
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
    /// since the session started (at least 200 ms, waited for if need be),
    /// snapped to the nearest rate Linux offers.
    fn tick_rate(&self, now: &types::clock_sample) -> Result<(u64, types::clock_sample)> {
        const MIN_NS: u64 = 200_000_000;
        let mut now = *now;
        let elapsed = now.ns.saturating_sub(self.clock0.ns);
        if elapsed < MIN_NS {
            std::thread::sleep(std::time::Duration::from_nanos(MIN_NS - elapsed));
            now = self.clock()?;
        }
        let hz = nearest_hz(
            now.jiffies.saturating_sub(self.clock0.jiffies),
            now.ns.saturating_sub(self.clock0.ns),
        );
        Ok((hz, now))
    }

    pub fn add_pid(&self, pid: u32) -> Result<()> {
        self.skel
            .maps
            .pid_filter
            .update(&pid.to_ne_bytes(), &[1u8], MapFlags::ANY)
            .context("adding a PID to the filter map")
    }

    /// Detaches every program now; the maps stay readable.
    pub fn detach(&mut self) {
        self.links.clear();
    }

    /// Reads every map: allocation and free totals per site, sampled stacks
    /// and every tracked object with its age now. `kind` labels the report
    /// ("snapshot" while running, "leaks" at the end).
    pub fn snapshot(&self, kind: &str) -> Result<Snapshot> {
        let m = &self.skel.maps;
        let names: HashMap<u64, String> =
            maps::read_hash::<u64, types::cache_name, _>(&m.cache_names)?
                .into_iter()
                .map(|(k, v)| (k, c_str(&v.name)))
                .collect();
        let key = |k: &types::site_key| SiteKey {
            call_site: k.call_site,
            cache: cache_id(k.cache, k.kmalloc_size, k.kmalloc_accounted != 0, &names),
        };
        // Objects first: ages are measured against the clock read right
        // after, and a free racing the read only makes totals slightly stale.
        let live = read_live(&m.live)?;
        let (hz, now) = self.tick_rate(&self.clock()?)?;
        let now = now.jiffies;

        let mut snap = Snapshot::default();
        for (k, v) in maps::read_percpu_hash::<types::site_key, types::alloc_stats, _>(&m.sites)? {
            snap.sites.insert(key(&k), v.into());
        }
        for (k, v) in maps::read_percpu_hash::<types::stack_key, types::alloc_stats, _>(&m.stacks)?
        {
            let id = k.stack_id;
            if let std::collections::hash_map::Entry::Vacant(e) = snap.stack_frames.entry(id) {
                if let Some(frames) = maps::read_stack(&m.stack_traces, id as u32)? {
                    e.insert(frames);
                }
            }
            snap.stacks.insert((key(&k.site), id), v.into());
        }
        let mut unseen = HashMap::new();
        for (k, u) in maps::read_percpu_hash::<types::site_key, types::site_unseen, _>(&m.unseen)? {
            unseen.insert(
                key(&k),
                Unseen {
                    count: u.count,
                    bytes_alloc: u.bytes_alloc,
                },
            );
        }
        let c: types::leak_counters = maps::read_percpu_slot0(&m.counters)?;
        snap.events = EventCounters {
            // Tracked frees are derived from the sites (see LeakInput).
            frees: c.frees_untracked,
            frees_null: c.frees_null,
            alloc_failed: c.alloc_failed,
            stack_samples: c.stack_samples,
            lost_stack_collision: c.lost_stack_collision,
            lost_stack_other: c.lost_stack_other,
            map_full_sites: c.map_full_sites,
            map_full_stacks: c.map_full_stacks,
            map_full_procs: 0,
            map_full_caches: 0,
        };
        let mut comms = HashMap::new();
        for o in &live {
            comms.entry(o.tgid).or_insert_with(|| {
                std::fs::read_to_string(format!("/proc/{}/comm", o.tgid))
                    .map(|c| c.trim_end().to_string())
                    .unwrap_or_default()
            });
        }
        snap.leaks = Some(LeakInput {
            live: live
                .iter()
                .map(|o| LiveObject {
                    site: key(&o.site),
                    stack_id: (o.stack_id >= 0).then_some(o.stack_id as i64),
                    bytes_req: o.bytes_req as u64,
                    bytes_alloc: o.bytes_alloc as u64,
                    age_ns: jiffies_to_ns(now.saturating_sub(o.ts), hz),
                    tgid: o.tgid,
                })
                .collect(),
            unseen,
            events: LeakEvents {
                frees_null: c.frees_null,
                frees_untracked: c.frees_untracked,
                reused_live: c.reused_live,
                map_full_live: c.map_full_live,
                map_busy: c.map_busy,
            },
            sample_every: self.cfg.sample_every.max(1),
            min_age_ns: 0,
            max_objects: self.cfg.max_objects,
            recursion_misses: self.recursion_misses(),
            kind: kind.to_string(),
            comms,
        });
        Ok(snap)
    }

    /// The loaded program of one hook, for this session's mechanism.
    fn prog(&self, tp: &str) -> Option<ProgramMut<'_>> {
        let name = program_name(tp, self.mech);
        self.skel
            .object()
            .progs_mut()
            .find(|p| p.name() == name.as_str())
    }

    /// Per attached program: events the kernel skipped because a BPF
    /// program was already running on the CPU (bpf_prog_info's
    /// recursion_misses).
    pub fn recursion_misses(&self) -> Vec<(String, u64)> {
        let ours: Vec<(u32, &str)> = HOOKS
            .iter()
            .filter_map(|tp| prog_id(&self.prog(tp)?).map(|id| (id, *tp)))
            .collect();
        let mut out: Vec<(String, u64)> =
            ProgInfoIter::with_query_opts(ProgInfoQueryOptions::default())
                .filter_map(|info| {
                    ours.iter()
                        .find(|(id, _)| *id == info.id)
                        .map(|(_, tp)| (tp.to_string(), info.recursion_misses))
                })
                .collect();
        out.sort();
        out
    }
}

/// Every tracked object, in batches of 4096 (one syscall per batch).
fn read_live<M: MapCore>(map: &M) -> Result<Vec<types::live_obj>> {
    let batched = map.lookup_batch(4096, MapFlags::ANY, MapFlags::ANY);
    match batched {
        Ok(iter) => Ok(iter
            .map(|(_, v)| from_bytes::<types::live_obj>(&v))
            .collect()),
        // Kernels without batch ops on hash maps: one lookup per key.
        Err(_) => Ok(maps::read_hash::<u64, types::live_obj, _>(map)?
            .into_values()
            .collect()),
    }
}

/// The kernel id of a loaded program, from its fd's fdinfo.
fn prog_id(prog: &ProgramMut<'_>) -> Option<u32> {
    let fd = prog.as_fd().as_raw_fd();
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("prog_id:"))
        .and_then(|v| v.trim().parse().ok())
}

fn configure(open: &mut OpenLeaksSkel<'static>, cfg: &LeaksConfig, kbtf: &KernelBtf) -> Result<()> {
    let rodata = open
        .maps
        .rodata_data
        .as_deref_mut()
        .context("the BPF object has no read-only data section")?;
    let c = &mut rodata.cfg;
    c.min_size = cfg.min_size;
    c.max_size = cfg.max_size.unwrap_or(0);
    c.gfp_account_mask = kbtf.gfp_account_mask;
    c.ptr_sample_mask = cfg.sample_every.max(1) - 1;
    c.capture_stacks = u8::from(cfg.stack_sample_every > 0);
    c.stack_sample_mask = cfg.stack_sample_every.saturating_sub(1);
    c.filter_pids = u8::from(!cfg.pids.is_empty());
    if let Some(comm) = &cfg.comm {
        c.filter_comm = 1;
        for (dst, src) in c.comm.iter_mut().zip(comm.bytes().take(15)) {
            *dst = src as i8;
        }
    }
    open.maps.live.set_max_entries(cfg.max_objects)?;
    open.maps.sites.set_max_entries(cfg.max_sites)?;
    open.maps.unseen.set_max_entries(cfg.max_sites)?;
    open.maps.stacks.set_max_entries(cfg.max_sites)?;
    open.maps.stack_traces.set_max_entries(cfg.max_sites)?;
    Ok(())
}
