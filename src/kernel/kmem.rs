//! Loading the BPF object and attaching it. Links are RAII: dropping the
//! session (on any exit path, errors included) detaches everything.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject};

use crate::kernel::attach::{self, program_name, Mechanism};
use crate::kernel::features::{self, KernelBtf, Tracefs};
use crate::kernel::maps;
use crate::kernel::skel::{c_str, from_bytes, types, KheapSkel, KheapSkelBuilder, OpenKheapSkel};
use crate::model::snapshot::{EventCounters, IdleKeys, ProgRunTime, Snapshot};
use crate::model::{CacheId, SiteKey};

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
    pub attach: AttachMode,
    pub max_sites: u32,
    pub max_stacks: u32,
    /// Attach the free tracepoints too (frees per cache, net counts).
    pub trace_frees: bool,
    /// With --latency: the latency object's `lat_starts` map, shared so
    /// call sites stay right while exit probes hide return addresses.
    pub latency_starts: Option<std::os::fd::RawFd>,
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
            attach: AttachMode::Auto,
            max_sites: 8192,
            max_stacks: 8192,
            trace_frees: true,
            latency_starts: None,
        }
    }
}

pub struct Session {
    skel: KheapSkel<'static>,
    links: Vec<Link>,
    /// File descriptors of the attached programs (owned by `skel`).
    attached_progs: Vec<RawFd>,
    /// Hook → how it is attached ("kmalloc: tp_btf").
    pub attached: Vec<String>,
    /// Hooks not attached, with the reason.
    pub skipped: Vec<String>,
    /// Every stack captured: the kernel counts events under their stack
    /// only, and sites are summed from stacks here.
    exact_stacks: bool,
    /// Stack traces already read, by id. An id keeps its frames until kheap
    /// deletes it (without BPF_F_REUSE_STACKID a colliding stack is dropped,
    /// not stored over it), so a refreshing view reads each stack once.
    stack_cache: RefCell<HashMap<i64, Vec<u64>>>,
    // Held so a tracefs kheap mounted itself stays mounted while attached.
    _tracefs: Option<Tracefs>,
}

impl Session {
    /// Opens, configures, loads and attaches. On kernels where the tp_btf
    /// programs fail to load in auto mode, retries with classic tracepoints.
    pub fn start(cfg: &Config) -> Result<Session> {
        features::check_btf()?;
        let kbtf = features::kernel_btf()?;
        let (mut session, refused) =
            attach::start_first(cfg.attach, |mech| Self::start_with(cfg, &kbtf, mech))?;
        // Shown in the report header: why a cheaper way was not used.
        session.skipped.extend(refused);
        Ok(session)
    }

    fn start_with(cfg: &Config, kbtf: &KernelBtf, mech: Mechanism) -> Result<Session> {
        // The skeleton borrows its object storage for its whole life; a run
        // opens at most two, so leaking the storage is the simple, safe owner.
        let storage: &'static mut MaybeUninit<OpenObject> =
            Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = KheapSkelBuilder::default()
            .open(storage)
            .context("opening the BPF object")?;

        let tracefs = if mech.needs_tracefs() {
            Some(Tracefs::ensure_mounted()?)
        } else {
            None
        };
        let available = |tp: &str| mech.has_hook(tp, kbtf, tracefs.as_ref());

        configure(&mut open, cfg, kbtf)?;
        let mut wanted: Vec<&str> = features::KMEM_TRACEPOINTS.to_vec();
        if !cfg.trace_frees {
            wanted.retain(|tp| !matches!(*tp, "kfree" | "kmem_cache_free"));
        }
        if cfg.follow_children {
            wanted.push("sched_process_fork");
        }
        let mut attached = Vec::new();
        let mut skipped = Vec::new();
        let mut enabled = Vec::new();
        for tp in HOOKS {
            if wanted.contains(&tp) && available(tp) {
                enabled.push(tp);
                attached.push(format!("{tp}: {}", mech.name()));
            } else if wanted.contains(&tp) {
                skipped.push(format!("{tp}: not available on this kernel"));
            }
        }
        // Exactly the programs of the chosen mechanism and hooks load; any
        // other program left in the object would fail the whole load.
        for mut prog in open.open_object_mut().progs_mut() {
            let name = prog.name().to_string_lossy().into_owned();
            let on = enabled.iter().any(|tp| program_name(tp, mech) == name);
            prog.set_autoload(on);
        }
        if !enabled.contains(&"kmalloc") && !enabled.contains(&"kmem_cache_alloc") {
            bail!("this kernel has neither the kmem:kmalloc nor the kmem:kmem_cache_alloc tracepoint: nothing to trace");
        }
        if cfg.follow_children && !enabled.contains(&"sched_process_fork") {
            eprintln!("kheap: warning: sched_process_fork is not available; children of the command are not followed");
        }

        let skel = open
            .load()
            .context("loading the BPF programs into the kernel")?;
        let mut session = Session {
            skel,
            links: Vec::new(),
            attached_progs: Vec::new(),
            attached,
            skipped,
            exact_stacks: cfg.stack_sample_every == 1,
            stack_cache: RefCell::default(),
            _tracefs: tracefs,
        };
        for &pid in &cfg.pids {
            session.add_pid(pid)?;
        }
        for tp in enabled {
            let (link, fd) = session
                .attach_one(tp, mech)
                .with_context(|| format!("attaching to kmem:{tp}"))?;
            session.links.push(link);
            session.attached_progs.push(fd);
        }
        Ok(session)
    }

    /// Attaches one hook's program; returns its link and program fd (for
    /// run-time statistics).
    fn attach_one(&self, tp: &str, mech: Mechanism) -> Result<(Link, RawFd)> {
        let name = program_name(tp, mech);
        let prog = self
            .skel
            .object()
            .progs_mut()
            .find(|p| p.name() == name.as_str())
            .with_context(|| format!("program {name} is missing from the BPF object"))?;
        let fd = prog.as_fd().as_raw_fd();
        Ok((prog.attach()?, fd))
    }

    /// Adds a process (tgid) to the set whose allocations are counted.
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

    /// Allocations counted so far (sites only: cheap enough for a status
    /// line every second).
    pub fn allocations_so_far(&self) -> Result<u64> {
        let sites = maps::read_percpu_hash::<types::site_key, types::alloc_stats, _>(
            &self.skel.maps.sites,
        )?;
        let stacks: u64 = if self.exact_stacks {
            maps::read_percpu_hash::<types::stack_key, types::alloc_stats, _>(
                &self.skel.maps.stacks,
            )?
            .iter()
            .map(|(_, v)| v.count)
            .sum()
        } else {
            0
        };
        Ok(sites.iter().map(|(_, v)| v.count).sum::<u64>() + stacks)
    }

    fn cache_names(&self) -> Result<HashMap<u64, String>> {
        Ok(
            maps::read_hash::<u64, types::cache_name, _>(&self.skel.maps.cache_names)?
                .into_iter()
                .map(|(k, v)| (k, c_str(&v.name)))
                .collect(),
        )
    }

    /// Reads and merges every map.
    pub fn snapshot(&self) -> Result<Snapshot> {
        let m = &self.skel.maps;
        let names = self.cache_names()?;
        let mut snap = Snapshot::default();
        // Two kernel caches can share a name: their entries are merged.
        for (k, v) in maps::read_percpu_hash::<types::site_key, types::alloc_stats, _>(&m.sites)? {
            *snap.sites.entry(site_key(&k, &names)).or_default() += v.into();
        }
        let mut stack_cache = self.stack_cache.borrow_mut();
        for (k, v) in maps::read_percpu_hash::<types::stack_key, types::alloc_stats, _>(&m.stacks)?
        {
            let id = k.stack_id;
            if let std::collections::hash_map::Entry::Vacant(e) = snap.stack_frames.entry(id) {
                if let Some(frames) = stack_cache.get(&id) {
                    e.insert(frames.clone());
                } else if let Some(frames) = maps::read_stack(&m.stack_traces, id as u32)? {
                    stack_cache.insert(id, frames.clone());
                    e.insert(frames);
                }
            }
            let site = site_key(&k.site, &names);
            if self.exact_stacks {
                *snap.sites.entry(site.clone()).or_default() += v.into();
            }
            *snap.stacks.entry((site, id)).or_default() += v.into();
        }
        let comms: HashMap<u32, String> =
            maps::read_hash::<u32, types::proc_info, _>(&m.proc_comms)?
                .into_iter()
                .map(|(k, v)| (k, c_str(&v.comm)))
                .collect();
        for (pid, v) in maps::read_percpu_hash::<u32, types::alloc_stats, _>(&m.procs)? {
            let comm = comms.get(&pid).cloned().unwrap_or_default();
            snap.procs.insert(pid, (comm, v.into()));
        }
        for (cache, v) in maps::read_percpu_hash::<u64, types::cache_frees, _>(&m.cache_frees)? {
            *snap
                .cache_frees
                .entry(cache_id(cache, 0, false, &names))
                .or_default() += v.frees;
        }
        let c: types::counters = maps::read_percpu_slot0(&m.counters)?;
        snap.events = EventCounters {
            frees: c.frees,
            frees_null: c.frees_null,
            alloc_failed: c.alloc_failed,
            stack_samples: c.stack_samples,
            lost_stack_collision: c.lost_stack_collision,
            lost_stack_other: c.lost_stack_other,
            map_full_sites: c.map_full_sites,
            map_full_stacks: c.map_full_stacks,
            map_full_procs: c.map_full_procs,
            map_full_caches: c.map_full_caches,
        };
        Ok(snap)
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
        let names = self.cache_names()?;

        let sites: HashSet<&SiteKey> = idle.sites.iter().collect();
        for raw in maps::keys(&m.sites)? {
            let k = site_key(&from_bytes::<types::site_key>(&raw), &names);
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
            let k = (site_key(&sk.site, &names), sk.stack_id);
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
            if let Some(frames) = maps::read_stack(&m.stack_traces, id as u32)? {
                removed.stack_frames.insert(id, frames);
            }
            // Already gone is fine: the kernel may reuse ids on collision.
            let _ = m.stack_traces.delete(&(id as u32).to_ne_bytes());
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

        let caches: HashSet<&CacheId> = idle.caches.iter().collect();
        for raw in maps::keys(&m.cache_frees)? {
            let id = cache_id(from_bytes::<u64>(&raw), 0, false, &names);
            if caches.contains(&id) {
                if let Some(v) = maps::take_percpu::<types::cache_frees, _>(&m.cache_frees, &raw)? {
                    *removed.cache_frees.entry(id).or_default() += v.frees;
                }
            }
        }
        Ok(removed)
    }

    /// Run time and run count of the attached programs, summed. They only
    /// advance while BPF run-time statistics are enabled
    /// (`enable_run_time_stats`).
    pub fn run_time(&self) -> Result<ProgRunTime> {
        let mut total = ProgRunTime::default();
        for &fd in &self.attached_progs {
            let mut info = libbpf_sys::bpf_prog_info::default();
            let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
            let ret = unsafe { libbpf_sys::bpf_prog_get_info_by_fd(fd, &mut info, &mut len) };
            if ret != 0 {
                bail!(
                    "reading BPF program info: {}",
                    std::io::Error::last_os_error()
                );
            }
            total.run_time_ns += info.run_time_ns;
            total.run_cnt += info.run_cnt;
            total.recursion_misses += info.recursion_misses;
        }
        Ok(total)
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

fn configure(open: &mut OpenKheapSkel<'static>, cfg: &Config, kbtf: &KernelBtf) -> Result<()> {
    let rodata = open
        .maps
        .rodata_data
        .as_deref_mut()
        .context("the BPF object has no read-only data section")?;
    let c = &mut rodata.cfg;
    c.min_size = cfg.min_size;
    c.max_size = cfg.max_size.unwrap_or(0);
    c.gfp_account_mask = kbtf.gfp_account_mask;
    c.capture_stacks = u8::from(cfg.stack_sample_every > 0);
    c.stack_sample_mask = cfg.stack_sample_every.saturating_sub(1);
    c.filter_pids = u8::from(!cfg.pids.is_empty());
    c.by_process = u8::from(cfg.by_process);
    if let Some(comm) = &cfg.comm {
        c.filter_comm = 1;
        for (dst, src) in c.comm.iter_mut().zip(comm.bytes().take(15)) {
            *dst = src as i8;
        }
    }
    if let Some(fd) = cfg.latency_starts {
        c.latency_active = 1;
        // Safety: the fd belongs to a LatencySession that outlives the load.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        open.maps.lat_starts.reuse_fd(fd)?;
    }
    open.maps.sites.set_max_entries(cfg.max_sites)?;
    open.maps.stacks.set_max_entries(cfg.max_stacks)?;
    // A stack whose hash lands in a bucket another stack holds is lost
    // (EEXIST, counted) every time it recurs: twice the buckets of the
    // stacks we keep halves those collisions, for 4 MiB more kernel memory.
    open.maps
        .stack_traces
        .set_max_entries(cfg.max_stacks.saturating_mul(2))?;
    Ok(())
}

/// The tracepoints kheap hooks, in attach order.
const HOOKS: [&str; 5] = [
    "kmalloc",
    "kmem_cache_alloc",
    "kfree",
    "kmem_cache_free",
    "sched_process_fork",
];

fn site_key(k: &types::site_key, names: &HashMap<u64, String>) -> SiteKey {
    SiteKey {
        call_site: k.call_site,
        cache: cache_id(k.cache, k.kmalloc_size, k.kmalloc_accounted != 0, names),
    }
}

/// Names the cache of a key: kmalloc size classes carry no pointer; classic
/// tracepoints without a cache name key by `(object size << 1) | 1`.
pub fn cache_id(
    cache: u64,
    kmalloc_size: u32,
    accounted: bool,
    names: &HashMap<u64, String>,
) -> CacheId {
    if cache == 0 {
        return CacheId::Kmalloc {
            size: kmalloc_size as u64,
            accounted,
        };
    }
    if let Some(n) = names.get(&cache) {
        return CacheId::Named(n.clone());
    }
    if cache < (1 << 32) && cache & 1 == 1 {
        return CacheId::ObjectSize(cache >> 1);
    }
    CacheId::Named(format!("cache@{cache:#x}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_keys_name_their_cache() {
        let mut names = HashMap::new();
        names.insert(0xffff888100042c00, "dentry".to_string());
        assert_eq!(
            cache_id(0, 4096, true, &names),
            CacheId::Kmalloc {
                size: 4096,
                accounted: true
            }
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
            cache_id(0xffff888100042d00, 0, false, &names),
            CacheId::Named("cache@0xffff888100042d00".into())
        );
    }
}
