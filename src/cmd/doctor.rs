//! `kheap doctor`: what this kernel offers and how kheap will attach.

use anyhow::Result;

use crate::kernel::attach::kmem_hooks;
use crate::kernel::attach::source_mechanism;
use crate::kernel::features::{self, KernelBtf, Tracefs};
use crate::kernel::hooks::source_hooks;
use crate::model::Source;
use crate::render::table::{new_table, output_width, render};

const CANNOT_TELL: &str = "cannot tell without root";

/// What a non-root doctor can say of a tracefs it cannot read, from the
/// mount table: mounted or not is a fact; what is inside is not known.
fn unreadable_tracefs(mounts: &str) -> String {
    let point = mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_, point, fstype) = (f.next()?, f.next()?, f.next()?);
        (fstype == "tracefs").then(|| point.to_string())
    });
    match point {
        Some(p) => format!("mounted at {p}; its events: {CANNOT_TELL}"),
        None => "not mounted (kheap mounts it itself when run as root)".to_string(),
    }
}

/// `kheap doctor`'s options.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DoctorArgs {
    /// Check with this BTF file as the kernel's (as record --btf would)
    #[arg(long, value_name = "FILE")]
    pub btf: Option<std::path::PathBuf>,
}

pub fn run(args: DoctorArgs) -> Result<i32> {
    if let Some(btf) = &args.btf {
        features::use_btf_file(btf)?;
    }
    let mut rows = Rows::default();
    let access = access_rows(&mut rows);
    // Held to the end: a tracefs mounted for this check is unmounted when
    // dropped.
    let tracefs = tracefs_rows(&mut rows, &access);
    source_rows(&mut rows, access.kbtf);
    probe_rows(&mut rows, &access);
    accounting_rows(&mut rows, access.kbtf);
    attach_rows(&mut rows, &access);
    rows.add(
        "leaks keeps objects in",
        leaks_object_store(access.privileged),
    );
    for (mode, memory) in kernel_memory_rows() {
        rows.add(&format!("kernel memory: {mode}"), memory);
    }
    let mut t = new_table(&["feature", "status"], &[1], output_width(None));
    for (feature, status) in rows.0 {
        t.add_row(vec![feature, status]);
    }
    crate::output::print(&(render(t) + "\n"))?;
    drop(tracefs);
    Ok(0)
}

/// Doctor's table: one row per feature, in the order they are checked.
#[derive(Default)]
struct Rows(Vec<(String, String)>);

impl Rows {
    fn add(&mut self, feature: &str, status: String) {
        self.0.push((feature.to_string(), status));
    }
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_string()
}

/// What the other checks depend on: root (or the capabilities) and the
/// kernel's BTF.
struct Access {
    privileged: bool,
    btf_ok: bool,
    /// The kernel's BTF, when it could be read.
    kbtf: Option<&'static KernelBtf>,
}

/// The kernel, the privileges, BTF, and whether `kheap malloc` runs.
fn access_rows(rows: &mut Rows) -> Access {
    rows.add("kernel", features::kernel_release());
    let privileged = features::check_privileges("doctor");
    rows.add(
        "privileges",
        match &privileged {
            Ok(()) => "ok (root or CAP_BPF+CAP_PERFMON)".into(),
            Err(e) => format!("insufficient: {e}"),
        },
    );
    let btf = features::check_btf();
    let btf_ok = btf.is_ok();
    rows.add(
        "BTF",
        match &btf {
            Ok(()) => format!("yes: {}", features::btf_origin()),
            Err(e) => format!("no: {e:#}"),
        },
    );
    rows.add(
        "kheap malloc",
        match features::kernel_btf()
            .ok()
            .and_then(features::malloc_unsupported)
        {
            Some(why) => format!("unavailable: {why}"),
            None if btf_ok => match features::kernel_btf().ok() {
                Some(k) if features::malloc_preemption_off(k) => {
                    "yes; its uprobe programs run with preemption off (bpf_preempt_disable)".into()
                }
                Some(k) => features::malloc_kernel_note(k)
                    .map_or_else(|| "yes".into(), |note| format!("yes: {note}")),
                None => "yes".into(),
            },
            None => "unknown (no BTF)".into(),
        },
    );
    Access {
        privileged: privileged.is_ok(),
        btf_ok,
        kbtf: if btf_ok {
            features::kernel_btf().ok()
        } else {
            None
        },
    }
}

/// Where tracefs is, and each kmem tracepoint as a classic tracepoint and
/// as tp_btf. Returns the tracefs, which unmounts when dropped if this
/// check mounted it.
fn tracefs_rows(rows: &mut Rows, access: &Access) -> Result<Tracefs, String> {
    let tracefs = if access.privileged {
        Tracefs::ensure_mounted().map_err(|e| e.to_string())
    } else {
        Tracefs::find().map(Tracefs::unmounted_view).ok_or_else(|| {
            unreadable_tracefs(&std::fs::read_to_string("/proc/self/mounts").unwrap_or_default())
        })
    };
    rows.add(
        "tracefs",
        match &tracefs {
            Ok(t) if t.mounted_here() => {
                format!("{} (mounted by kheap for this check)", t.path.display())
            }
            Ok(t) => t.path.display().to_string(),
            Err(e) => e.clone(),
        },
    );
    for tp in kmem_hooks().map(|h| h.tracepoint) {
        // Without root an unreadable tracefs says nothing about its events.
        let classic = match &tracefs {
            Ok(t) => yes_no(t.has_event("kmem", tp)),
            Err(_) if !access.privileged => CANNOT_TELL.to_string(),
            Err(_) => yes_no(false),
        };
        let btf = access
            .kbtf
            .is_some_and(|k| k.btf_tracepoints.iter().any(|t| t == tp));
        rows.add(
            &format!("kmem:{tp}"),
            format!("tracepoint: {classic}, tp_btf: {}", yes_no(btf)),
        );
    }
    tracefs
}

/// How each `--source` would attach, and its hooks.
fn source_rows(rows: &mut Rows, kbtf: Option<&KernelBtf>) {
    // Every source but kmalloc, whose tracepoints are the kmem rows.
    for source in Source::ALL.into_iter().filter(|&s| s != Source::Kmalloc) {
        let hooks: Vec<String> = source_hooks(source)
            .map(|h| {
                let have =
                    kbtf.is_some_and(|k| k.btf_tracepoints.iter().any(|t| t == h.tracepoint));
                format!("{}:{} {}", h.system, h.tracepoint, yes_no(have))
            })
            .collect();
        let how = match kbtf.map(|k| source_mechanism(source, k)) {
            Some(Ok(None)) => "raw_tp".to_string(),
            Some(Ok(Some(via))) => {
                let functions: Vec<&str> =
                    source_hooks(source).filter_map(|h| h.function).collect();
                format!(
                    "{} on {} (no tracepoints on this kernel)",
                    via.name(),
                    functions.join(", ")
                )
            }
            Some(Err(why)) => format!("unavailable: {why}"),
            None => "unavailable: no kernel BTF".to_string(),
        };
        rows.add(
            &format!("--source {source}"),
            format!("{how} ({})", hooks.join(", ")),
        );
    }
}

/// kprobes, what `record --latency` would probe (asked of the kernel only
/// as root), and uprobes.
fn probe_rows(rows: &mut Rows, access: &Access) {
    rows.add("kprobes", yes_no(features::has_kprobes()));
    if access.privileged {
        latency_rows(rows, access.kbtf);
    }
    rows.add("uprobes", yes_no(features::has_uprobes()));
}

/// The allocator functions `record --latency` times, whether fentry
/// loads, and the mechanism it would use.
fn latency_rows(rows: &mut Rows, kbtf: Option<&KernelBtf>) {
    let (resolved, fentry) = match crate::kernel::latency::LatencySession::probe() {
        Ok(probed) => probed,
        Err(e) => return rows.add("allocator functions", format!("unknown: {e}")),
    };
    let names: Vec<String> = resolved
        .iter()
        .zip(crate::latency::ALLOCATOR_FUNCTIONS)
        .map(|(r, names)| r.map_or(format!("({} absent)", names[0]), str::to_string))
        .collect();
    rows.add("allocator functions", names.join(", "));
    rows.add(
        "fentry/fexit",
        match &fentry {
            Ok(()) => "yes (loaded a test program)".into(),
            Err(e) => format!("no: {}", format!("{e:#}").replace('\n', " ")),
        },
    );
    let unsupported = kbtf.and_then(crate::kernel::latency::unsupported);
    let latency = if let Some(why) = unsupported {
        format!("unavailable: {why}")
    } else if fentry.is_ok() {
        "fentry/fexit".into()
    } else if features::has_kprobes() {
        "kprobe/kretprobe".into()
    } else {
        "unavailable (no kprobes, fentry refused)".into()
    };
    rows.add("kheap record --latency will use", latency);
}

/// The memory cgroup accounting flags, and the cgroup hierarchy.
fn accounting_rows(rows: &mut Rows, kbtf: Option<&KernelBtf>) {
    if let Some(k) = kbtf {
        rows.add(
            "__GFP_ACCOUNT",
            format!("{:#x} (from kernel BTF)", k.gfp_account_mask),
        );
        rows.add(
            "SLAB_ACCOUNT",
            format!(
                "{:#x} (from kernel BTF or the pre-6.9 value)",
                k.slab_account_mask
            ),
        );
    }
    rows.add(
        "cgroups",
        crate::cgroup::doctor_line(&std::fs::read_to_string("/proc/mounts").unwrap_or_default()),
    );
}

/// How `kheap record` attaches, how kmalloc's caches are named and how
/// kfree's frees are counted. Measured, not inferred: loads and attaches
/// the record object the way `kheap record` would, then detaches at once.
fn attach_rows(rows: &mut Rows, access: &Access) {
    let unknown = "unknown (needs root and BTF to try)".to_string();
    let (mode, kmalloc_caches, kfree_caches) = if access.privileged && access.btf_ok {
        let mut storage = crate::kernel::storage::ObjectStorage::default();
        // As top and slab ask: kfree's frees per cache where the kernel can.
        let config = crate::kernel::kmem::Config {
            kfree_caches: true,
            ..Default::default()
        };
        let started = crate::kernel::kmem::Tracer::start(&config, &mut storage, None);
        let measured = match started {
            Ok(s) => {
                // kmalloc's mechanism: the first hook attached may be one
                // that is typed on every kernel (sched_switch).
                let how = s
                    .attached
                    .iter()
                    .find_map(|a| a.strip_prefix("kmalloc: "))
                    .unwrap_or("");
                let mut mode = format!("{how} (loaded and attached for this check)");
                let (kfree_notes, notes): (Vec<&String>, Vec<&String>) = s
                    .skipped
                    .iter()
                    .filter(|n| **n != s.kmalloc_caches)
                    .partition(|n| n.starts_with("kfree: "));
                for note in notes {
                    mode.push_str(&format!("; {note}"));
                }
                let kfree_caches = match kfree_notes.first() {
                    _ if s.kfree_caches => "per cache (the bpf_get_kmem_cache kfunc)".into(),
                    Some(why) => why.trim_start_matches("kfree: ").to_string(),
                    None => "in the totals only".into(),
                };
                (mode, s.kmalloc_caches.clone(), kfree_caches)
            }
            Err(e) => (
                format!("nothing: {}", format!("{e:#}").replace('\n', " ")),
                unknown.clone(),
                unknown,
            ),
        };
        measured
    } else {
        (unknown.clone(), unknown.clone(), unknown)
    };
    rows.add("kheap record attaches with", mode);
    rows.add("kmalloc caches named by", kmalloc_caches);
    rows.add("kfree frees (top, slab)", kfree_caches);
}

/// The kernel memory each mode's maps take on this machine, with default
/// flags, as the kernel counts it (`model::kernel_memory`), against
/// kheap's budget: measured from the objects as they would load, without
/// loading them.
fn kernel_memory_rows() -> Vec<(&'static str, String)> {
    use crate::kernel::kmem::{self, Config, LiveConfig};
    use crate::model::human_size;
    // What record asks for: sampled stacks keyed by who made them.
    let record = Config {
        stack_owners: true,
        ..Config::default()
    };
    let leaks = Config {
        live: Some(LiveConfig::default()),
        ..record.clone()
    };
    let modes: [(&str, Config, bool); 5] = [
        ("record, top, slab -d, serve", record.clone(), false),
        (
            "  with --by process",
            Config {
                by_process: true,
                ..record.clone()
            },
            false,
        ),
        (
            "  with --by cgroup",
            Config {
                by_cgroup: true,
                ..record.clone()
            },
            false,
        ),
        ("  with --latency", record.clone(), true),
        ("leaks, slab -d --sort growth", leaks, false),
    ];
    let line = |total: u64, cpus: u32, budget: u64, apart: Option<String>| {
        let mut line = format!(
            "{} on {cpus} possible CPUs (budget {})",
            human_size(total),
            human_size(budget)
        );
        if let Some(apart) = apart {
            line.push_str(&format!(", and {apart}"));
        }
        line
    };
    let mut rows = Vec::new();
    for (mode, cfg, latency) in modes {
        let memory = match kmem::footprint(&cfg, latency) {
            Ok(f) => line(
                f.total,
                f.cpus,
                kmem::budget(&cfg, f.cpus).bytes,
                cfg.live.map(|l| {
                    format!(
                        "{} for the object store (--max-objects {})",
                        human_size(f.apart),
                        l.max_objects
                    )
                }),
            ),
            Err(e) => format!("unknown: {e:#}"),
        };
        rows.push((mode, memory));
    }
    let malloc =
        crate::kernel::malloc::footprint(false, 1, crate::kernel::user_stack::DEFAULT_SAMPLE_EVERY);
    let memory = match malloc {
        Ok(f) => {
            let ring = f
                .maps
                .iter()
                .find(|(name, _)| name == "user_stacks")
                .map_or(0, |(_, bytes)| *bytes);
            format!(
                "{}, its {} stack-copy ring included (--exact-stacks takes a {} ring \
                 instead, and --outstanding a block store, apart)",
                line(
                    f.total,
                    f.cpus,
                    crate::kernel::malloc::budget(f.cpus).bytes,
                    None
                ),
                human_size(ring),
                human_size(u64::from(crate::kernel::user_stack::RING_BYTES_EXACT)),
            )
        }
        Err(e) => format!("unknown: {e:#}"),
    };
    rows.push(("malloc", memory));
    rows
}

/// Where `kheap leaks` keeps the objects it tracks on this kernel
/// (bpf/kheap/live_objects.c): asking the verifier takes root.
fn leaks_object_store(privileged: bool) -> String {
    let tracing_refused = features::kernel_btf()
        .ok()
        .is_some_and(|k| features::kmem_unsupported(k).is_some());
    if tracing_refused {
        "nothing: leaks does not run on this kernel (see 'kheap record attaches with')".into()
    } else if !privileged {
        "unknown (needs root to ask the verifier)".into()
    } else if crate::kernel::skel::full_object_fits() {
        "a table of 8-slot buckets taken with cmpxchg, spilling into a hash map (a hash map \
         alone where this kernel's verifier gives up on the table's program: the run's header \
         says so)"
            .into()
    } else if !crate::sys::kernel_has_own_btf() {
        "a hash map: the kernel has no BTF of its own, and kheap loads its object for older \
         kernels (about twice leaks' cost per object)"
            .into()
    } else {
        "a hash map: no BPF atomics before 5.12 (about twice leaks' cost per object)".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_tracefs_is_not_called_missing() {
        let mounted = "tracefs /sys/kernel/tracing tracefs rw,nosuid 0 0\nproc /proc proc rw 0 0\n";
        let s = unreadable_tracefs(mounted);
        assert!(s.starts_with("mounted at /sys/kernel/tracing"), "{s}");
        assert!(s.contains(CANNOT_TELL), "{s}");
        let s = unreadable_tracefs("proc /proc proc rw 0 0\n");
        assert!(s.starts_with("not mounted"), "{s}");
    }
}
