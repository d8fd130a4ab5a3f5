//! The kmem object's map sizes for a configuration (`size_maps`, which a
//! run's start uses too), their kernel memory, and the check, before
//! anything is loaded, that it keeps to kheap's budget on this machine
//! (`model::kernel_memory`): measured as the kernel counts them.

use std::mem::MaybeUninit;

use anyhow::{bail, Result};
use libbpf_rs::skel::OpenSkel;

use crate::kernel::footprint::{map_shapes, memlock_limit, possible_cpus};
use crate::kernel::skel::{full_object_fits, KheapSkelBuilder, OpenKheapSkel};
use crate::model::kernel_memory::{
    largest_fitting, Budget, Footprint, MapShape, TooBig, COUNTING_BASE, LEAKS_BASE,
};

use super::config::{Config, LiveStore, LIVE_WAYS};

/// leaks' object store: sized by `--max-objects` and stated apart from the
/// budget.
pub const OBJECT_STORE: [&str; 3] = ["live", "live_buckets", "live_slots"];

/// Maps the kmem object borrows from the latency object (`--latency`).
const FROM_LATENCY: [&str; 1] = ["lat_starts"];

/// The budget of a configuration on `cpus` CPUs: `--kernel-memory`, or
/// the mode's.
pub fn budget(cfg: &Config, cpus: u32) -> Budget {
    if let Some(bytes) = cfg.kernel_memory {
        return Budget { bytes, cpus };
    }
    let base = match cfg.live {
        Some(_) => LEAKS_BASE,
        None => COUNTING_BASE,
    };
    Budget::new(base, cpus)
}

/// The kernel memory a run of `cfg` takes on this machine (with the
/// latency object's maps when `latency`).
pub fn footprint(cfg: &Config, latency: bool) -> Result<Footprint> {
    footprint_at(cfg, latency, possible_cpus()?)
}

/// The same on a machine of `cpus` possible CPUs.
pub fn footprint_at(cfg: &Config, latency: bool, cpus: u32) -> Result<Footprint> {
    let mut slot = MaybeUninit::uninit();
    let mut open = open_for_sizing(&mut slot)?;
    measure(&mut open, cfg, cpus, latency)
}

/// The kernel memory of an object configured for a run, about to load:
/// every map of it (its object store too) and, with `latency`, the latency
/// object's.
pub(super) fn loaded_footprint(open: &OpenKheapSkel<'_>, latency: bool) -> Result<u64> {
    Ok(Footprint::of(&run_shapes(open, latency)?, possible_cpus()?, &[]).total)
}

fn open_for_sizing<'obj>(
    slot: &'obj mut MaybeUninit<libbpf_rs::OpenObject>,
) -> Result<OpenKheapSkel<'obj>> {
    crate::kernel::features::open_skel(KheapSkelBuilder::default(), slot)
}

fn measure(
    open: &mut OpenKheapSkel<'_>,
    cfg: &Config,
    cpus: u32,
    latency: bool,
) -> Result<Footprint> {
    let table = cfg.live.is_some() && full_object_fits();
    size_maps(open, cfg, cfg.live_store(table), cpus, latency)?;
    Ok(Footprint::of(
        &run_shapes(open, latency)?,
        cpus,
        &OBJECT_STORE,
    ))
}

/// The maps of a run: the kmem object's as configured (less what it
/// borrows) and, with `latency`, the latency object's.
fn run_shapes(open: &OpenKheapSkel<'_>, latency: bool) -> Result<Vec<MapShape>> {
    let borrowed: &[&str] = if latency { &FROM_LATENCY } else { &[] };
    let mut shapes = map_shapes(open.open_object(), borrowed);
    if latency {
        shapes.extend(crate::kernel::latency::map_shapes()?);
    }
    Ok(shapes)
}

/// The footprint of `cfg`, or the one line that says why it does not fit
/// and what would: the maps against kheap's budget (and RLIMIT_MEMLOCK
/// where the kernel charges it), the object store against the memory
/// available.
pub fn check(cfg: &Config, latency: bool) -> Result<Footprint> {
    let cpus = possible_cpus()?;
    let mut slot = MaybeUninit::uninit();
    let mut open = open_for_sizing(&mut slot)?;
    let found = measure(&mut open, cfg, cpus, latency)?;
    let budget = budget(cfg, cpus);
    let memlock = memlock_limit();
    let needed_mib = found.total.div_ceil(1 << 20);
    let (limit, what, or_else) = match memlock {
        Some(m) if m < budget.bytes => (
            m,
            "RLIMIT_MEMLOCK, which this kernel charges BPF maps to".to_string(),
            format!("or raise the limit (ulimit -l {})", needed_mib << 10),
        ),
        _ => (
            budget.bytes,
            match cfg.kernel_memory {
                Some(_) => "--kernel-memory".to_string(),
                None => format!("kheap's budget on this {cpus}-CPU machine"),
            },
            format!("or allow it with --kernel-memory {needed_mib}M"),
        ),
    };
    if found.total > limit {
        let fits = largest_fitting(1, cfg.max_sites, |n| {
            let smaller = Config {
                max_sites: n,
                max_stacks: n,
                ..cfg.clone()
            };
            measure(&mut open, &smaller, cpus, latency).is_ok_and(|f| f.total <= limit)
        });
        let too_big = TooBig {
            needed: found.total,
            limit,
            what,
        };
        bail!(
            "--max-entries {}: {too_big}; at most --max-entries {fits} fits here, {or_else}",
            cfg.max_sites
        );
    }
    if let Some(live) = cfg.live {
        crate::kernel::footprint::check_store(
            "--max-objects",
            "the object store",
            live.max_objects,
            found.total,
            |n| {
                let mut smaller = cfg.clone();
                if let Some(l) = smaller.live.as_mut() {
                    l.max_objects = n;
                }
                measure(&mut open, &smaller, cpus, latency)
                    .ok()
                    .map(|f| f.apart)
            },
        )?;
    }
    Ok(found)
}

/// Sizes the maps for a run: the part of the configuration that decides
/// the object's kernel memory (`footprint` reads it back before loading;
/// `start` sizes a run's object with it).
pub(super) fn size_maps(
    open: &mut OpenKheapSkel<'_>,
    cfg: &Config,
    live_store: LiveStore,
    cpus: u32,
    latency: bool,
) -> Result<()> {
    open.maps.sites.set_max_entries(cfg.max_sites)?;
    open.maps
        .site_slots
        .set_max_entries(cfg.site_slot_entries(cpus))?;
    open.maps
        .kmalloc_memo
        .set_max_entries(Config::kmalloc_memo_slots(cpus))?;
    open.maps.stacks.set_max_entries(cfg.max_stacks)?;
    // Stacks are stored before they are counted, and top deletes idle ones:
    // room for twice the stacks kept.
    open.maps
        .stack_traces
        .set_max_entries(cfg.max_stacks.saturating_mul(2))?;
    // Maps a mode does not use keep one entry (zero is refused).
    open.maps
        .live
        .set_max_entries(live_store.spill_entries.max(1))?;
    open.maps
        .live_buckets
        .set_max_entries(live_store.buckets.max(1))?;
    open.maps
        .live_slots
        .set_max_entries((live_store.buckets * LIVE_WAYS).max(1))?;
    open.maps.unseen.set_max_entries(match cfg.live {
        Some(_) => cfg.max_sites,
        None => 1,
    })?;
    if !cfg.by_cgroup {
        open.maps.cgroups.set_max_entries(1)?;
    }
    // leaks keeps its processes in the objects, not in `procs`.
    if !cfg.by_process || cfg.live.is_some() {
        open.maps.procs.set_max_entries(1)?;
    }
    // Process names: of process rows, and of the processes stacks are
    // keyed by.
    if !cfg.by_process && !cfg.stacks_by_owner() {
        open.maps.proc_comms.set_max_entries(1)?;
    }
    // PIDs of -p and of a command and its children: none asked.
    if cfg.pids.is_empty() && !cfg.follow_children {
        open.maps.pid_filter.set_max_entries(1)?;
    }
    // Only --latency's programs fill it (then it is the latency object's).
    if !latency {
        open.maps.lat_starts.set_max_entries(1)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every mode's maps, as a run sizes them, keep to the budget from a
    /// small machine to a 256-CPU one (the objects are opened, not loaded:
    /// no root needed).
    #[test]
    fn every_mode_keeps_to_its_budget_on_any_cpu_count() {
        let modes = [
            (
                "record",
                Config {
                    stack_owners: true,
                    ..Config::default()
                },
                false,
            ),
            (
                "by process",
                Config {
                    by_process: true,
                    stack_owners: true,
                    ..Config::default()
                },
                false,
            ),
            (
                "by cgroup",
                Config {
                    by_cgroup: true,
                    stack_owners: true,
                    ..Config::default()
                },
                false,
            ),
            (
                "latency",
                Config {
                    stack_owners: true,
                    ..Config::default()
                },
                true,
            ),
            (
                "leaks",
                Config {
                    live: Some(Default::default()),
                    stack_owners: true,
                    ..Config::default()
                },
                false,
            ),
            (
                "leaks by cgroup",
                Config {
                    live: Some(Default::default()),
                    by_cgroup: true,
                    stack_owners: true,
                    ..Config::default()
                },
                false,
            ),
        ];
        for (name, cfg, latency) in modes {
            let mut at = Vec::new();
            for cpus in [1, 2, 32, 128, 192, 256] {
                let f = footprint_at(&cfg, latency, cpus).unwrap();
                let b = budget(&cfg, cpus);
                assert!(
                    f.total <= b.bytes,
                    "{name} at {cpus} CPUs: {} > {}: {:?}",
                    f.total,
                    b.bytes,
                    &f.maps[..8]
                );
                at.push(f.total);
            }
            // Something was measured: the histograms' maps alone are
            // megabytes.
            assert!(at[0] > 8 << 20, "{name}: {at:?}");
            // What each CPU adds stays small (the site slots shrink as
            // the CPUs grow).
            assert!(at[5] - at[1] < 254 * (96 << 10), "{name}: {at:?}");
        }
    }

    #[test]
    fn leaks_gets_the_larger_budget() {
        let leaks = Config {
            live: Some(Default::default()),
            ..Config::default()
        };
        assert_eq!(budget(&leaks, 128).bytes, 64 << 20);
        assert_eq!(budget(&Config::default(), 128).bytes, 32 << 20);
    }
}
