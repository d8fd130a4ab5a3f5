//! `--latency`: time spent inside the slab allocator's entry points, per call
//! site. Attaches fentry/fexit where the kernel allows it, kprobe/kretprobe
//! otherwise, to the allocator functions this kernel has (resolved from its
//! own symbol list: `__kmalloc` became `__kmalloc_noprof` in 6.10).

use std::mem::MaybeUninit;

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::OpenSkel;
use libbpf_rs::{Link, OpenObject};

use crate::kernel::features;
use crate::kernel::maps;
use crate::kernel::storage::ObjectStorage;
pub use crate::latency::LatencyProbe;
use crate::latency::{kallsyms_functions, resolve_functions, LatencyData, LatencyEntry};
use crate::model::Hist;

skeleton!("latency");
use skel::{types, LatencySkel, LatencySkelBuilder, OpenLatencySkel};

plain_types!(types::lat_key, types::lat_stats, types::lat_counters);
impl_sum!(types::lat_stats { count, total_ns; hist });
impl_sum!(types::lat_counters {
    missed_start,
    map_full,
    nested
});

/// The latency object's maps as it loads them (`--latency`), for the
/// kernel-memory budget (`kmem::budget`).
pub fn map_shapes() -> Result<Vec<crate::model::kernel_memory::MapShape>> {
    let mut slot = std::mem::MaybeUninit::uninit();
    let open = crate::kernel::features::open_skel(LatencySkelBuilder::default(), &mut slot)?;
    Ok(crate::kernel::footprint::map_shapes(
        open.open_object(),
        &[],
    ))
}

/// Why `--latency` cannot run on this kernel, if it cannot: both
/// mechanisms' programs read the probed function's address with
/// bpf_get_func_ip.
pub fn unsupported(k: &crate::kernel::features::KernelBtf) -> Option<String> {
    (!k.has_helper("get_func_ip")).then(|| {
        format!(
            "--latency needs the BPF helper bpf_get_func_ip (Linux 5.15), which this kernel ({}) lacks",
            crate::kernel::features::kernel_release()
        )
    })
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
        let kallsyms = crate::sys::kallsyms_text()?;
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
            return Self::start_with(slot()?, &kallsyms, &resolved, Mechanism::Kprobe);
        }
        let fentry_err = match Self::start_with(slot()?, &kallsyms, &resolved, Mechanism::Fentry) {
            Ok(s) => return Ok(s),
            Err(e) => e,
        };
        let fentry_err = format!("{fentry_err:#}").replace('\n', " ");
        if want == LatencyProbe::Fentry {
            bail!("--latency-probe fentry: this kernel refuses fentry ({fentry_err})");
        }
        if features::has_kprobes() {
            return Self::start_with(slot()?, &kallsyms, &resolved, Mechanism::Kprobe);
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
        let kallsyms = crate::sys::kallsyms_text()?;
        let resolved = resolve_functions(&kallsyms_functions(&kallsyms));
        let fentry =
            LatencySession::start_with(slot, &kallsyms, &resolved, Mechanism::Fentry).map(drop);
        Ok((resolved, fentry))
    }

    fn start_with(
        slot: &'obj mut MaybeUninit<OpenObject>,
        kallsyms: &str,
        resolved: &[Option<&'static str>],
        mech: Mechanism,
    ) -> Result<LatencySession<'obj>> {
        if let Some(why) = unsupported(crate::kernel::features::kernel_btf()?) {
            anyhow::bail!("{why}");
        }
        let mut open = crate::kernel::features::open_skel(LatencySkelBuilder::default(), slot)
            .context("opening the latency BPF object")?;
        let functions: Vec<&'static str> = resolved.iter().flatten().copied().collect();
        configure(&mut open, kallsyms, resolved, mech)?;
        let skel = crate::kernel::load_skel(open)
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
                // The kretprobe first: probes on one address run newest
                // first, so the entry program then reads the return address
                // before the kretprobe replaces it with its trampoline (the
                // unwinder cannot recover it on a frame-pointer kernel). An
                // exit between the two attaches is counted as missed_start.
                for f in resolved.iter().flatten() {
                    self.links.push(
                        p.lat_exit_kretprobe
                            .attach_kprobe(true, f)
                            .with_context(|| format!("kretprobe on {f}"))?,
                    );
                    self.links.push(
                        p.lat_enter_kprobe
                            .attach_kprobe(false, f)
                            .with_context(|| format!("kprobe on {f}"))?,
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
        let entries = maps::read_counts::<types::lat_key, types::lat_stats, _>(&m.latencies)?
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
            nested: c.nested,
        })
    }
}

/// Where a kretprobe sends its function's return, by kernel: before 5.15,
/// from 5.15 (`__kretprobe_trampoline`), and since kretprobes use rethook.
const KRETPROBE_TRAMPOLINES: [&str; 3] = [
    "kretprobe_trampoline",
    "__kretprobe_trampoline",
    "arch_rethook_trampoline",
];

fn configure(
    open: &mut OpenLatencySkel<'_>,
    kallsyms: &str,
    resolved: &[Option<&'static str>],
    mech: Mechanism,
) -> Result<()> {
    let kprobe = mech == Mechanism::Kprobe;
    if kprobe {
        let trampoline = KRETPROBE_TRAMPOLINES
            .iter()
            .find_map(|name| crate::model::kallsyms::address_of(kallsyms, name));
        if let Some(rodata) = open.maps.rodata_data.as_deref_mut() {
            rodata.kretprobe_return = trampoline.unwrap_or(0);
        }
    }
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
