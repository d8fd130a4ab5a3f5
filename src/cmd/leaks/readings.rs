//! `kheap leaks`'s readings while it runs: the timeline of outstanding
//! memory and the --snapshot-when triggers those readings fire.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::cgroup::CgroupNames;
use crate::kernel::kmem::Tracer;
use crate::model::live::Outstanding;
use crate::model::snapshot::Snapshot;
use crate::model::{CgroupSlot, Source};
use crate::report;
use crate::report::meminfo::MemInfo;
use crate::report::timeline::{
    MemLines, SeriesKey, SeriesLabel, Timeline, TimelineBuilder, TriggerMark, DEFAULT_MAX_POINTS,
};
use crate::report::trigger::{oom_kills, Condition, Reading as TriggerReading, Trigger};
use crate::symbolize::{KernelSymbols, Symbolize};

use super::args::LeaksArgs;
use super::reports::Reports;
use super::snapshots::Snapshots;

/// The timeline's readings and the --snapshot-when triggers they fire.
pub(super) struct Readings {
    timeline: TimelineBuilder,
    interval: Duration,
    /// When the next reading is due (time since the wait began).
    next: Duration,
    start: Instant,
    by_cgroup: bool,
    /// Tracked objects stand for this many (--sample).
    sample: u32,
    triggers: Vec<Trigger>,
    /// What the triggers read beyond the timeline's own lines: vmstat only
    /// for an OOM trigger, the sites' names only for a site trigger.
    wants_oom: bool,
    wants_sites: bool,
    fired: Vec<TriggerMark>,
    /// Each call site's name, symbolized once.
    site_names: HashMap<(u64, Source), String>,
}

impl Readings {
    /// The timeline, empty, and the triggers, counting growth from now
    /// whenever the first reading comes.
    pub(super) fn start(args: &LeaksArgs, by_cgroup: bool, start: Instant) -> Readings {
        let mut triggers = args.snapshot_when.clone();
        let at_start = TriggerReading {
            sunreclaim_bytes: MemInfo::sunreclaim_now(),
            oom_kills: oom_kills(&std::fs::read_to_string("/proc/vmstat").unwrap_or_default()),
            sites: &[],
        };
        for t in &mut triggers {
            t.start_from(&at_start);
        }
        Readings {
            timeline: TimelineBuilder::new(
                args.interval.as_secs_f64(),
                args.timeline_sites.into(),
                DEFAULT_MAX_POINTS,
                args.sample,
            ),
            interval: args.interval,
            next: args.interval,
            start,
            by_cgroup,
            sample: args.sample,
            wants_oom: triggers.iter().any(|t| t.condition == Condition::Oom),
            wants_sites: triggers
                .iter()
                .any(|t| matches!(t.condition, Condition::SiteGrew { .. })),
            triggers,
            fired: Vec::new(),
            site_names: HashMap::new(),
        }
    }

    /// Whether a reading is due on this tick (then the next one is set).
    pub(super) fn due(&mut self, elapsed: Duration) -> bool {
        if elapsed < self.next {
            return false;
        }
        self.next += self.interval;
        true
    }

    /// One reading of the timeline, and the triggers it fires (each writes
    /// its snapshot): on the loop's tick, and once more at the end, so a
    /// condition met last (an OOM kill as the command ends) still fires.
    pub(super) fn read(
        &mut self,
        tracer: &Tracer,
        reports: &mut Reports,
        snapshots: &mut Snapshots,
    ) {
        let reading = read_timeline(
            &mut self.timeline,
            tracer,
            self.start,
            self.wants_oom,
            self.by_cgroup,
        );
        let Some(TimelineRead {
            t_s,
            series,
            meminfo,
            oom_kills,
        }) = reading.filter(|_| !self.triggers.is_empty())
        else {
            return;
        };
        let sites: Vec<(String, u64)> = if self.wants_sites {
            series
                .iter()
                .map(|(k, o)| {
                    let name = site_name(&mut self.site_names, k, &reports.syms);
                    (name, o.bytes_alloc * u64::from(self.sample))
                })
                .collect()
        } else {
            Vec::new()
        };
        let r = TriggerReading {
            sunreclaim_bytes: meminfo.sunreclaim_bytes,
            oom_kills,
            sites: &sites,
        };
        for t in self.triggers.iter_mut() {
            if t.check(&r) {
                eprintln!("kheap: {t_s:.1}s: --snapshot-when {} fired", t.text);
                let path = snapshots.on_trigger(t, tracer, reports);
                self.fired.push(TriggerMark {
                    t_s: (t_s * 1000.0).round() / 1000.0,
                    condition: t.text.clone(),
                    path: path.map(|p| p.display().to_string()),
                });
            }
        }
    }

    /// The report's timeline, its series named as the report names its
    /// sites.
    pub(super) fn finish(self, snap: &Snapshot, reports: &mut Reports) -> Timeline {
        finish_timeline(
            &self.timeline,
            snap,
            &reports.syms,
            &mut reports.cgroup_names,
            self.fired,
        )
    }
}

/// A call site's name as a site trigger's pattern matches it, symbolized
/// the first time it is asked for.
fn site_name(
    names: &mut HashMap<(u64, Source), String>,
    k: &SeriesKey,
    syms: &KernelSymbols,
) -> String {
    names
        .entry((k.call_site, k.source))
        .or_insert_with(|| {
            if k.call_site == 0 && k.source != Source::Kmalloc {
                format!("[{}]", k.source)
            } else {
                syms.symbolize(&[k.call_site])[0].name().to_string()
            }
        })
        .clone()
}

/// One reading of the timeline: when, what each series holds, the
/// /proc/meminfo lines and the OOM kills so far.
struct TimelineRead {
    t_s: f64,
    series: HashMap<SeriesKey, Outstanding>,
    meminfo: MemLines,
    oom_kills: u64,
}

/// Reads the outstanding objects by series into the timeline. A reading's
/// /proc lines are taken at its time, t_s, before the walk of the object
/// map: a trigger then fires at a time when its condition held (an OOM kill
/// read after a slow walk was stamped with the time the walk began, before
/// the kill). vmstat is read only for an OOM trigger (`wants_oom`).
fn read_timeline(
    timeline: &mut TimelineBuilder,
    session: &Tracer,
    start: Instant,
    wants_oom: bool,
    by_cgroup: bool,
) -> Option<TimelineRead> {
    let t_s = start.elapsed().as_secs_f64();
    let began = Instant::now();
    let meminfo = MemLines::read();
    let oom_kills = if wants_oom {
        oom_kills(&std::fs::read_to_string("/proc/vmstat").unwrap_or_default())
    } else {
        0
    };
    let read = session.outstanding_by_site(by_cgroup);
    let read_us = began.elapsed().as_micros() as u64;
    match read {
        Ok(Some(read)) => {
            let series = read
                .into_iter()
                .fold(HashMap::new(), |mut m, ((site, cgroup), o)| {
                    *m.entry(SeriesKey::of(&site, cgroup)).or_default() += o;
                    m
                });
            timeline.add(t_s, &series, meminfo, read_us);
            Some(TimelineRead {
                t_s,
                series,
                meminfo,
                oom_kills,
            })
        }
        Ok(None) => None,
        // A reading missed is a gap in the chart, said once per miss.
        Err(e) => {
            eprintln!("kheap: warning: timeline reading at {t_s:.1}s failed: {e:#}");
            None
        }
    }
}

/// The timeline with its series named as the report names its sites.
fn finish_timeline(
    timeline: &TimelineBuilder,
    snap: &Snapshot,
    syms: &KernelSymbols,
    cgroup_names: &mut CgroupNames,
    triggers: Vec<TriggerMark>,
) -> Timeline {
    let keys = timeline.series_keys();
    let labels = report::site_labels(snap, syms);
    cgroup_names.learn(keys.iter().filter_map(|k| match k.cgroup {
        Some(CgroupSlot::Cgroup(id)) => Some(id),
        _ => None,
    }));
    let label = |k: &SeriesKey| {
        let (function, call_site) = labels.get(&(k.call_site, k.source)).map_or_else(
            || (format!("{:#x}", k.call_site), format!("{:#x}", k.call_site)),
            |(label, cs)| (label.name().to_string(), cs.display()),
        );
        SeriesLabel {
            function,
            call_site,
            cgroup: match k.cgroup {
                Some(CgroupSlot::Cgroup(id)) => Some(cgroup_names.describe(id)),
                _ => None,
            },
        }
    };
    timeline.finish(&label, triggers)
}
