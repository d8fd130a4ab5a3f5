//! `--latency`: time spent inside the slab allocator's entry points, per call
//! site. Attaches fentry/fexit where the kernel allows it, kprobe/kretprobe
//! otherwise, to the allocator functions this kernel has (resolved from its
//! own symbol list: `__kmalloc` became `__kmalloc_noprof` in 6.10).

use std::collections::{HashMap, HashSet};
use std::mem::MaybeUninit;

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, OpenObject};

use crate::kernel::features;
use crate::kernel::maps;
use crate::kernel::storage::ObjectStorage;
use crate::model::Hist;
use crate::model::LatencyRow;
use crate::symbolize::{label_frame, Frame, Symbolize};

#[allow(clippy::all, dead_code, unused_imports, non_camel_case_types)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/latency.skel.rs"));
}
use skel::{types, LatencySkel, LatencySkelBuilder, OpenLatencySkel};

unsafe impl plain::Plain for types::lat_key {}
unsafe impl plain::Plain for types::lat_stats {}
unsafe impl plain::Plain for types::lat_counters {}

impl std::ops::AddAssign for types::lat_stats {
    fn add_assign(&mut self, o: Self) {
        self.count += o.count;
        self.total_ns += o.total_ns;
        for (a, b) in self.hist.iter_mut().zip(o.hist) {
            *a += b;
        }
    }
}

impl std::ops::AddAssign for types::lat_counters {
    fn add_assign(&mut self, o: Self) {
        self.missed_start += o.missed_start;
        self.map_full += o.map_full;
    }
}

/// Allocator entry points, each with its names across kernel versions
/// (newest first). One fentry/fexit slot pair in the BPF object per entry.
pub const ALLOCATOR_FUNCTIONS: [&[&str]; 6] = [
    &["__kmalloc_noprof", "__kmalloc"],
    &["__kmalloc_node_noprof", "__kmalloc_node"],
    &["__kmalloc_cache_noprof", "kmalloc_trace"],
    &["__kmalloc_cache_node_noprof", "kmalloc_node_trace"],
    &["kmem_cache_alloc_noprof", "kmem_cache_alloc"],
    &["kmem_cache_alloc_node_noprof", "kmem_cache_alloc_node"],
];

/// The name each allocator entry point has on this kernel (None: absent).
pub fn resolve_functions(kernel_functions: &HashSet<String>) -> Vec<Option<&'static str>> {
    ALLOCATOR_FUNCTIONS
        .iter()
        .map(|names| {
            names
                .iter()
                .copied()
                .find(|n| kernel_functions.contains(*n))
        })
        .collect()
}

/// Function names from a kallsyms text (text symbols of the kernel proper).
pub fn kallsyms_functions(kallsyms: &str) -> HashSet<String> {
    kallsyms
        .lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            let (_addr, kind, name) = (parts.next()?, parts.next()?, parts.next()?);
            let module = parts.next();
            (module.is_none() && matches!(kind, "T" | "t")).then(|| name.to_string())
        })
        .collect()
}

/// Which probes `--latency` uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LatencyProbe {
    /// fentry/fexit where the kernel allows them, else kprobe/kretprobe
    Auto,
    Fentry,
    Kprobe,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    Fentry,
    Kprobe,
}

impl Mechanism {
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Fentry => "fentry/fexit",
            Mechanism::Kprobe => "kprobe/kretprobe",
        }
    }
}

pub struct LatencySession<'obj> {
    skel: LatencySkel<'obj>,
    links: Vec<Link>,
    pub mechanism: Mechanism,
    pub functions: Vec<&'static str>,
}

impl<'obj> LatencySession<'obj> {
    /// Attaches with the best mechanism this kernel allows, or explains in
    /// one line why it allows none.
    pub fn start(
        storage: &'obj mut ObjectStorage,
        want: LatencyProbe,
    ) -> Result<LatencySession<'obj>> {
        let mut slots = storage.slots();
        let mut slot = || slots.next().context("no object storage left");
        let kallsyms =
            std::fs::read_to_string("/proc/kallsyms").context("reading /proc/kallsyms")?;
        let resolved = resolve_functions(&kallsyms_functions(&kallsyms));
        if resolved.iter().all(Option::is_none) {
            bail!(
                "no known slab allocator function found in /proc/kallsyms: --latency cannot attach"
            );
        }
        if want == LatencyProbe::Kprobe {
            if !features::has_kprobes() {
                bail!("--latency-probe kprobe: this kernel has no kprobes (CONFIG_KPROBES is off)");
            }
            return Self::start_with(slot()?, &resolved, Mechanism::Kprobe);
        }
        let fentry_err = match Self::start_with(slot()?, &resolved, Mechanism::Fentry) {
            Ok(s) => return Ok(s),
            Err(e) => e,
        };
        let fentry_err = format!("{fentry_err:#}").replace('\n', " ");
        if want == LatencyProbe::Fentry {
            bail!("--latency-probe fentry: this kernel refuses fentry ({fentry_err})");
        }
        if features::has_kprobes() {
            return Self::start_with(slot()?, &resolved, Mechanism::Kprobe);
        }
        bail!(
            "this kernel cannot time the allocator: it has no kprobes (CONFIG_KPROBES is off) and refuses fentry ({fentry_err}); --latency needs one of them"
        )
    }

    /// For `kheap doctor`: the resolved allocator functions, and whether
    /// fentry programs load on this kernel (tried, then dropped at once).
    pub fn probe() -> Result<(Vec<Option<&'static str>>, Result<()>)> {
        let mut storage = ObjectStorage::default();
        let slot = storage.slots().next().context("no object storage left")?;
        let kallsyms =
            std::fs::read_to_string("/proc/kallsyms").context("reading /proc/kallsyms")?;
        let resolved = resolve_functions(&kallsyms_functions(&kallsyms));
        let fentry = LatencySession::start_with(slot, &resolved, Mechanism::Fentry).map(drop);
        Ok((resolved, fentry))
    }

    fn start_with(
        slot: &'obj mut MaybeUninit<OpenObject>,
        resolved: &[Option<&'static str>],
        mech: Mechanism,
    ) -> Result<LatencySession<'obj>> {
        let mut open = LatencySkelBuilder::default()
            .open(slot)
            .context("opening the latency BPF object")?;
        let functions: Vec<&'static str> = resolved.iter().flatten().copied().collect();
        configure(&mut open, resolved, mech)?;
        let skel = open
            .load()
            .with_context(|| format!("loading {} programs", mech.name()))?;
        let mut s = LatencySession {
            skel,
            links: Vec::new(),
            mechanism: mech,
            functions,
        };
        s.attach(resolved)?;
        Ok(s)
    }

    fn attach(&mut self, resolved: &[Option<&'static str>]) -> Result<()> {
        let p = &self.skel.progs;
        match self.mechanism {
            Mechanism::Kprobe => {
                for f in resolved.iter().flatten() {
                    self.links.push(
                        p.lat_enter_kprobe
                            .attach_kprobe(false, f)
                            .with_context(|| format!("kprobe on {f}"))?,
                    );
                    self.links.push(
                        p.lat_exit_kretprobe
                            .attach_kprobe(true, f)
                            .with_context(|| format!("kretprobe on {f}"))?,
                    );
                }
            }
            Mechanism::Fentry => {
                let slots = fentry_slots(&self.skel);
                for (i, f) in resolved.iter().enumerate() {
                    if f.is_some() {
                        self.links.push(slots[i].0.attach()?);
                        self.links.push(slots[i].1.attach()?);
                    }
                }
            }
        }
        Ok(())
    }

    /// The per-task entry map the record session must share (fd reuse).
    pub fn starts_map(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.skel.maps.lat_starts.as_fd()
    }

    pub fn detach(&mut self) {
        self.links.clear();
    }

    pub fn read(&self) -> Result<LatencyData> {
        let m = &self.skel.maps;
        let entries = maps::read_percpu_hash::<types::lat_key, types::lat_stats, _>(&m.latencies)?
            .into_iter()
            .map(|(k, v)| LatencyEntry {
                call_site: k.call_site,
                func_ip: k.func_ip,
                count: v.count,
                total_ns: v.total_ns,
                hist: Hist(v.hist),
            })
            .collect();
        let c: types::lat_counters = maps::read_percpu_slot0(&m.lat_counters)?;
        Ok(LatencyData {
            entries,
            missed_start: c.missed_start,
            map_full: c.map_full,
        })
    }
}

fn configure(
    open: &mut OpenLatencySkel<'_>,
    resolved: &[Option<&'static str>],
    mech: Mechanism,
) -> Result<()> {
    let kprobe = mech == Mechanism::Kprobe;
    open.progs.lat_enter_kprobe.set_autoload(kprobe);
    open.progs.lat_exit_kretprobe.set_autoload(kprobe);
    let p = &mut open.progs;
    let mut slots = [
        (&mut p.lat_enter_fentry0, &mut p.lat_exit_fexit0),
        (&mut p.lat_enter_fentry1, &mut p.lat_exit_fexit1),
        (&mut p.lat_enter_fentry2, &mut p.lat_exit_fexit2),
        (&mut p.lat_enter_fentry3, &mut p.lat_exit_fexit3),
        (&mut p.lat_enter_fentry4, &mut p.lat_exit_fexit4),
        (&mut p.lat_enter_fentry5, &mut p.lat_exit_fexit5),
    ];
    for (i, (enter, exit)) in slots.iter_mut().enumerate() {
        let target = resolved.get(i).copied().flatten().filter(|_| !kprobe);
        enter.set_autoload(target.is_some());
        exit.set_autoload(target.is_some());
        if let Some(t) = target {
            enter.set_attach_target(0, Some(t.to_string()))?;
            exit.set_attach_target(0, Some(t.to_string()))?;
        }
    }
    Ok(())
}

type Slot<'a, 'obj> = (
    &'a libbpf_rs::ProgramMut<'obj>,
    &'a libbpf_rs::ProgramMut<'obj>,
);

fn fentry_slots<'a, 'obj>(skel: &'a LatencySkel<'obj>) -> [Slot<'a, 'obj>; 6] {
    let p = &skel.progs;
    [
        (&p.lat_enter_fentry0, &p.lat_exit_fexit0),
        (&p.lat_enter_fentry1, &p.lat_exit_fexit1),
        (&p.lat_enter_fentry2, &p.lat_exit_fexit2),
        (&p.lat_enter_fentry3, &p.lat_exit_fexit3),
        (&p.lat_enter_fentry4, &p.lat_exit_fexit4),
        (&p.lat_enter_fentry5, &p.lat_exit_fexit5),
    ]
}

/// Raw latency map contents, before symbolization.
#[derive(Clone, Debug, Default)]
pub struct LatencyData {
    pub entries: Vec<LatencyEntry>,
    pub missed_start: u64,
    pub map_full: u64,
}

#[derive(Clone, Debug)]
pub struct LatencyEntry {
    pub call_site: u64,
    pub func_ip: u64,
    pub count: u64,
    pub total_ns: u64,
    pub hist: Hist,
}

/// Symbolizes and merges entries per (call site, allocator function),
/// slowest in total first.
pub fn rows(data: &LatencyData, syms: &dyn Symbolize) -> Vec<LatencyRow> {
    let mut addrs: Vec<u64> = data
        .entries
        .iter()
        .flat_map(|e| [e.call_site, e.func_ip])
        .collect();
    addrs.sort_unstable();
    addrs.dedup();
    let frames: HashMap<u64, Frame> = addrs.iter().copied().zip(syms.symbolize(&addrs)).collect();
    let mut merged: HashMap<(String, String), LatencyRow> = HashMap::new();
    for e in &data.entries {
        let site = frames
            .get(&e.call_site)
            .cloned()
            .unwrap_or_else(|| Frame::unknown(e.call_site));
        let alloc = frames
            .get(&e.func_ip)
            .map(|f| f.name().to_string())
            .unwrap_or_default();
        let (function, call_site) = if e.call_site == 0 {
            ("[caller not found]".to_string(), String::new())
        } else {
            let label = label_frame(std::slice::from_ref(&site)).unwrap_or(&site);
            (label.name().to_string(), site.display())
        };
        let row = merged
            .entry((call_site.clone(), alloc.clone()))
            .or_insert_with(|| LatencyRow {
                function,
                call_site,
                allocator: alloc,
                ..Default::default()
            });
        let mut h = Hist::from_buckets(&row.hist);
        h += e.hist;
        row.hist = h.buckets();
        row.count += e.count;
        row.total_ns += e.total_ns;
    }
    let mut out: Vec<LatencyRow> = merged
        .into_values()
        .map(|mut r| {
            r.avg_ns = if r.count == 0 {
                0.0
            } else {
                (r.total_ns as f64 / r.count as f64).round()
            };
            r
        })
        .collect();
    out.sort_by_key(|r| std::cmp::Reverse(r.total_ns));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Bucket;
    use crate::report::tests::FixtureSymbols;

    fn names(list: &[&str]) -> HashSet<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn resolves_renamed_allocator_functions() {
        // 6.1: no _noprof, kmalloc_trace for cache-backed kmalloc.
        let v61 = names(&[
            "__kmalloc",
            "__kmalloc_node",
            "kmalloc_trace",
            "kmalloc_node_trace",
            "kmem_cache_alloc",
            "kmem_cache_alloc_node",
        ]);
        assert_eq!(
            resolve_functions(&v61),
            vec![
                Some("__kmalloc"),
                Some("__kmalloc_node"),
                Some("kmalloc_trace"),
                Some("kmalloc_node_trace"),
                Some("kmem_cache_alloc"),
                Some("kmem_cache_alloc_node")
            ]
        );
        // 6.10+: _noprof names; the old ones are gone.
        let v618 = names(&[
            "__kmalloc_noprof",
            "__kmalloc_node_noprof",
            "__kmalloc_cache_noprof",
            "kmem_cache_alloc_noprof",
            "kmem_cache_alloc_node_noprof",
        ]);
        let r = resolve_functions(&v618);
        assert_eq!(r[0], Some("__kmalloc_noprof"));
        assert_eq!(r[3], None);
        assert_eq!(r[4], Some("kmem_cache_alloc_noprof"));
    }

    #[test]
    fn kallsyms_text_symbols_only() {
        let k = "ffffffff81648020 T __kmalloc_noprof\nffffffff82000000 D some_data\nffffffffc0000000 t helper\t[mod]\n";
        let f = kallsyms_functions(k);
        assert!(f.contains("__kmalloc_noprof"));
        assert!(!f.contains("some_data") && !f.contains("helper"));
    }

    #[test]
    fn rows_merge_and_label_sites() {
        let syms = FixtureSymbols(vec![(0x2000, "__kmalloc_noprof"), (0x3000, "load_msg")]);
        let mut h = Hist::default();
        h.record(300);
        let e = |ns| LatencyEntry {
            call_site: 0x3010,
            func_ip: 0x2000,
            count: 1,
            total_ns: ns,
            hist: h,
        };
        let data = LatencyData {
            entries: vec![e(300), e(500)],
            ..Default::default()
        };
        let r = rows(&data, &syms);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].function, "load_msg");
        assert_eq!(r[0].allocator, "__kmalloc_noprof");
        assert_eq!((r[0].count, r[0].avg_ns), (2, 400.0));
        assert_eq!(
            r[0].hist[0],
            Bucket {
                lo: 256,
                hi: 512,
                count: 2
            }
        );
    }
}
