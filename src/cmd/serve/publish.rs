//! One read of the daemon: the maps read (never from an HTTP thread), the
//! deltas added to the cumulative series, idle map entries aged out, the
//! metric families and profiles built and swapped in for the HTTP threads,
//! and the --snapshot-when conditions checked.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;

use super::daemon::{Attached, Daemon};
use crate::model::live::{objects_to_age_out, Outstanding, OutstandingRead};
use crate::model::snapshot::Snapshot;
use crate::model::{SiteKey, Source};
use crate::report::meminfo::MemInfo;
use crate::report::overhead::self_usage;
use crate::report::trigger::{oom_kills, Reading as TriggerReading};
use crate::serve::families::{
    self, Health, MeminfoSlab, OutstandingInput, OutstandingSite, SlabInput,
};
use crate::serve::profile::Which;
use crate::serve::routes::Published;
use crate::serve::series::SiteDelta;
use crate::serve::triggers;
use crate::serve::{cgroups, processes};
use crate::session::stop_requested;
use crate::symbolize::Symbolize;
use crate::sys::slab_sysfs::{SlabSysfs, SYS_KERNEL_SLAB};
use crate::sys::slabinfo::{read_slabinfo, SlabinfoRow, PROC_SLABINFO};
use crate::sys::{process_name, process_start};
use std::path::Path;

impl Daemon {
    /// The `site` label of a site: its function, or the whole allocator
    /// (`[page]`) for sources whose events carry no call site.
    pub(super) fn site_name(&self, k: &SiteKey) -> String {
        if let Some(name) = k.whole_allocator() {
            return name;
        }
        let addr = k.call_site;
        self.syms
            .symbolize(&[addr])
            .into_iter()
            .next()
            .map(|f| f.name().to_string())
            .unwrap_or_else(|| format!("{addr:#x}"))
    }

    /// One interval: reads the maps (never from an HTTP thread), adds the
    /// deltas to the cumulative state, ages out idle map entries, and
    /// publishes the metric families and the profiles' rows.
    pub(super) fn read_and_publish(&mut self, att: &mut Attached) -> Result<()> {
        let t0 = Instant::now();
        // Live objects first, then the totals: events keep arriving, and
        // this order keeps every site's allocations >= its outstanding.
        let due = att
            .live
            .as_ref()
            .is_none_or(|(_, at)| at.elapsed() >= self.args.outstanding_interval);
        if due || stop_requested() {
            if let Some(read) = att.tracer.outstanding()? {
                let read = self.age_out(att, read)?;
                att.live = Some((read, Instant::now()));
            }
        }
        let live = att.live.as_ref().map(|(read, _)| read);
        let snap: Snapshot = att.tracer.counts_snapshot()?;
        if att.cfg.by_cgroup {
            // Before the rows are named: a cgroup seen now is walked for
            // while it still exists.
            self.cgroup_names.learn(att.tracer.cgroup_ids()?);
        }
        let read_duration_s = t0.elapsed().as_secs_f64();
        let site_entries = snap.sites.len();
        let stack_entries = snap.stacks.len();
        let cgroup_entries = snap.cgroups.len();
        let process_entries = snap.procs.len();
        let delta = att.tracker.interval(snap);
        let sites: Vec<SiteDelta> = delta
            .sites
            .iter()
            .map(|(k, s)| SiteDelta {
                site: self.site_name(k),
                cache: k.cache.name(),
                source: k.cache.source(),
                counted_elsewhere: k.cache.counted_elsewhere(),
                stats: *s,
            })
            .collect();
        let frees: Vec<(String, u64)> = delta
            .cache_frees
            .iter()
            .map(|(c, n)| (c.name(), *n))
            .collect();
        self.state.add_interval(&sites, &frees);
        let mut source_frees: Vec<(Source, u64)> =
            delta.source_frees.iter().map(|(&s, &n)| (s, n)).collect();
        if att.cfg.sources.contains(Source::Kmalloc) {
            source_frees.push((Source::Kmalloc, delta.slab_frees()));
        }
        self.state.add_source_frees(&source_frees);
        if att.cfg.by_cgroup {
            self.cgroups
                .add_interval(cgroups::by_values(&delta.cgroups, &self.cgroup_names));
        }
        // While live objects are tracked the kernel counts them instead
        // of the per-process map: processes are read from the objects.
        let count_processes = att.cfg.by_process && att.cfg.live.is_none();
        if count_processes {
            let running = |pid| Some((process_name(pid)?, process_start(pid)?));
            let rows = self.process_names.by_values(&delta.procs, &running);
            self.processes.add_interval(rows);
            self.process_names
                .retire_exited(&mut self.processes, &process_start);
        }
        self.profile.add_interval(&delta, &self.syms);
        self.totals.events += delta.events;
        self.totals.bpf_run += delta.bpf_run;
        self.totals.reads += 1;

        let cfg = &att.cfg;
        let mut map_fill = vec![("sites", site_entries as f64 / cfg.max_sites.max(1) as f64)];
        if cfg.stack_sample_every > 0 {
            map_fill.push((
                "stacks",
                stack_entries as f64 / cfg.max_stacks.max(1) as f64,
            ));
        }
        if cfg.by_cgroup {
            map_fill.push((
                "cgroups",
                cgroup_entries as f64 / att.tracer.cgroup_capacity().max(1) as f64,
            ));
        }
        if count_processes {
            map_fill.push((
                "processes",
                process_entries as f64 / att.tracer.process_capacity().max(1) as f64,
            ));
        }
        let outstanding = live.map(|l| {
            if let Some(lc) = cfg.live {
                map_fill.push(("live", l.objects() as f64 / lc.max_objects.max(1) as f64));
            }
            self.outstanding_sites(l)
        });
        let aged_out = self.named_sites(self.totals.objects_aged_out.iter());
        let tracked_since_s = att
            .tracked_since
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());

        if self.args.idle_intervals > 0 {
            let idle = att.tracker.idle_keys(self.args.idle_intervals);
            if !idle.is_empty() {
                let removed = att.tracer.remove_idle(&idle)?;
                self.totals.aged_out += removed.map_entries() as u64;
                att.tracker.forget(&removed);
                if !removed.cgroups.is_empty() {
                    let keep = att.tracer.cgroup_ids()?.into_iter().collect();
                    self.cgroup_names.retain(&keep);
                }
            }
        }

        let totals = &self.totals;
        let bpf = att.bpf_stats.then_some(totals.bpf_run);
        let e = &totals.events;
        let mut events_lost = vec![
            ("map_full_sites", e.map_full_sites),
            ("map_full_stacks", e.map_full_stacks),
            ("map_full_caches", e.map_full_caches),
            ("alloc_failed", e.alloc_failed),
            ("lost_stack", e.lost_stack_other),
            ("kmalloc_cache_stale", e.kmalloc_cache_stale),
        ];
        if let Some(l) = live {
            events_lost.push(("map_full_live", l.map_full_live));
        }
        if cfg.by_cgroup {
            events_lost.push(("map_full_cgroups", e.map_full_cgroups));
        }
        if count_processes {
            events_lost.push(("map_full_processes", e.map_full_procs));
        }
        let process_outstanding = live.filter(|_| cfg.by_process).map(|l| {
            let names = &self.process_names;
            processes::outstanding_rows(&l.by_process, self.args.process_series, &|pid| {
                names.name_of(pid, &process_name)
            })
        });
        let usage = self_usage();
        let health = Health {
            bpf_run_time_ns: bpf.map(|b| b.run_time_ns),
            bpf_runs: bpf.map(|b| b.run_cnt),
            bpf_recursion_misses: e.recursion_misses,
            events_lost,
            stack_collisions: e.lost_stack_collision,
            map_fill,
            aged_out: totals.aged_out,
            read_duration_s,
            reads: totals.reads,
            cpu_seconds: usage.cpu_ns as f64 / 1e9,
            rss_bytes: resident_bytes(),
            site_label_sets: self.state.remembered() as u64,
            profile_stacks: self.profile.stacks_held() as u64,
            profile_stacks_folded: self.profile.stacks_folded,
            meminfo_slab: meminfo_slab(),
        };
        // A kernel without slabinfo still serves everything else.
        let slab = read_slabinfo(std::path::Path::new(PROC_SLABINFO)).ok();
        let merged = match (
            slab.as_deref(),
            self.slab_sysfs.current(Path::new(SYS_KERNEL_SLAB)),
        ) {
            (Some(rows), Some(fs)) => merged_caches(rows, fs),
            _ => Vec::new(),
        };
        let (root_only, mut fams): (Vec<_>, Vec<_>) = families::build(
            &self.state,
            cfg.by_cgroup.then_some(&self.cgroups),
            count_processes.then_some(&self.processes),
            process_outstanding.as_deref(),
            outstanding.as_deref().map(|sites| OutstandingInput {
                sites,
                aged_out: &aged_out,
                tracked_since_s,
            }),
            slab.as_deref().map(|rows| SlabInput {
                rows,
                page_size: crate::sys::page_size(),
                merged: &merged,
            }),
            &health,
        )
        .into_iter()
        .partition(|f| families::from_slabinfo(&f.name));
        let fired = self.check_triggers(outstanding.as_deref());
        fams.extend(triggers::families(&self.triggers));
        let profile = self.profile.snapshot(
            live.map(|l| &l.groups),
            self.started.elapsed().as_secs_f64(),
        );
        let published = Arc::new(Published::new(fams, root_only, profile, self.args.interval));
        *self.shared.current.write().unwrap() = published.clone();
        for i in fired {
            self.write_trigger_snapshot(i, &published);
        }
        return_free_memory();
        Ok(())
    }

    /// Ages the live-object store out (`model::live::objects_to_age_out`:
    /// from three quarters full, its oldest objects down to half) and
    /// returns the read of what it then holds; `read` as it is when the
    /// store is below the mark. What is forgotten is counted by site, and
    /// the store holds every object allocated since the youngest of them.
    fn age_out(&mut self, att: &mut Attached, read: OutstandingRead) -> Result<OutstandingRead> {
        let Some(lc) = att.cfg.live else {
            return Ok(read);
        };
        let n = objects_to_age_out(read.objects(), lc.max_objects.into());
        if n == 0 {
            return Ok(read);
        }
        let aged = att.tracer.age_out_oldest(n)?;
        // None if every one was freed (or its slot retaken) meanwhile.
        if aged.objects() > 0 {
            att.tracked_since = SystemTime::now() - Duration::from_nanos(aged.youngest_age_ns);
        }
        for (site, o) in aged.by_site {
            *self.totals.objects_aged_out.entry(site).or_default() += o;
        }
        Ok(att.tracer.outstanding()?.unwrap_or(read))
    }

    /// Checks the --snapshot-when conditions against this read: SUnreclaim
    /// now, the OOM kills so far, the sites' outstanding bytes as last read.
    /// Returns the indexes of those that fired.
    fn check_triggers(&mut self, outstanding: Option<&[OutstandingSite]>) -> Vec<usize> {
        if self.triggers.is_empty() {
            return Vec::new();
        }
        let vmstat = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
        let mut sites: HashMap<&str, u64> = HashMap::new();
        for o in outstanding.unwrap_or_default() {
            *sites.entry(&o.site).or_default() += o.bytes;
        }
        let sites: Vec<(String, u64)> =
            sites.into_iter().map(|(s, b)| (s.to_string(), b)).collect();
        let reading = TriggerReading {
            sunreclaim_bytes: MemInfo::sunreclaim_now(),
            oom_kills: oom_kills(&vmstat),
            sites: &sites,
        };
        triggers::check(&mut self.triggers, &reading, SystemTime::now())
    }

    /// Says that a condition fired and, with --snapshot-dir, writes the
    /// profiles of this read beside each other; a write that fails is said
    /// and the daemon goes on.
    fn write_trigger_snapshot(&self, i: usize, published: &Published) {
        let w = &self.triggers[i];
        let Some(dir) = &self.args.snapshot_dir else {
            eprintln!("kheap: --snapshot-when {} fired", w.trigger.text);
            return;
        };
        let stem = format!(
            "snapshot-{}-{}",
            w.trigger.slug(),
            crate::clock::compact_utc(w.last_fired.unwrap_or_else(SystemTime::now))
        );
        let mut kinds = vec![(Which::Alloc, "alloc")];
        if published.profile.inuse {
            kinds.push((Which::Inuse, "inuse"));
        }
        let mut written = Vec::new();
        for (which, name) in kinds {
            let path = dir.join(format!("{stem}-{name}.pb.gz"));
            match crate::output::write_bytes_atomic(&path, published.pprof(which)) {
                Ok(()) => written.push(path.display().to_string()),
                Err(e) => eprintln!("kheap: warning: --snapshot-when {}: {e:#}", w.trigger.text),
            }
        }
        eprintln!(
            "kheap: --snapshot-when {} fired: {}",
            w.trigger.text,
            written.join(", ")
        );
    }

    /// Outstanding objects per (site, cache) name: the stacks of a site
    /// summed (the gauges carry no stacks).
    fn outstanding_sites(&self, l: &OutstandingRead) -> Vec<OutstandingSite> {
        self.named_sites(l.groups.iter().map(|((site, _), o)| (site, o)))
    }

    /// Objects and bytes per (site, cache) name.
    fn named_sites<'k>(
        &self,
        groups: impl Iterator<Item = (&'k SiteKey, &'k Outstanding)>,
    ) -> Vec<OutstandingSite> {
        let mut by: HashMap<&SiteKey, (u64, u64)> = HashMap::new();
        for (site, o) in groups {
            let e = by.entry(site).or_default();
            e.0 += o.objects;
            e.1 += o.bytes_alloc;
        }
        by.into_iter()
            .map(|(k, (objects, bytes))| OutstandingSite {
                site: self.site_name(k),
                cache: k.cache.name(),
                source: k.cache.source(),
                objects,
                bytes,
            })
            .collect()
    }
}

/// (cache, merged name) for every cache of `/proc/slabinfo` that SLUB
/// merged other caches into (from the /sys/kernel/slab symlinks).
fn merged_caches(rows: &[SlabinfoRow], fs: &SlabSysfs) -> Vec<(String, String)> {
    rows.iter()
        .flat_map(|r| {
            fs.aliases_of(&r.name)
                .into_iter()
                .map(|alias| (r.name.clone(), alias))
        })
        .collect()
}

/// The kernel's slab memory from /proc/meminfo; None where it names
/// neither line.
fn meminfo_slab() -> Option<MeminfoSlab> {
    let m = MemInfo::parse(&std::fs::read_to_string("/proc/meminfo").ok()?);
    let (reclaimable, unreclaimable) = (m.line("SReclaimable"), m.line("SUnreclaim"));
    (reclaimable > 0 || unreclaimable > 0).then_some(MeminfoSlab {
        reclaimable,
        unreclaimable,
    })
}

/// Gives the pages freed by the interval's transient buffers (map reads,
/// the last families) back to the kernel, so RSS follows what is held.
fn return_free_memory() {
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Current resident memory (not the peak getrusage gives).
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map(|pages| pages * crate::sys::page_size())
        .unwrap_or(0)
}
