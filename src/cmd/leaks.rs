//! `kheap leaks`: trace like record, then show what is still allocated of
//! what was allocated while tracing (retained) beside what was allocated
//! and freed (transient). Snapshots of the outstanding set can be written
//! while it runs (--snapshot-every, SIGUSR1) and compared with `kheap diff`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Args;

use crate::cgroup::CgroupNames;
use crate::cli::{parse_duration, parse_sample, parse_tracked_objects};
use crate::contract::{self, Kind};
use crate::kernel::features;
use crate::kernel::kmem::{Config, LiveConfig, Tracer};
use crate::kernel::storage::ObjectStorage;
use crate::leaks::render::{self as leak_render, LeakGroupBy, LeaksFormat};
use crate::model::live::Outstanding;
use crate::model::snapshot::Snapshot;
use crate::model::{CgroupSlot, Source, Sources};
use crate::render::Format;
use crate::report::budget::{self, Budget, BudgetRow};
use crate::report::meminfo::{account, comparable, Geometry, MemInfo};
use crate::report::timeline::{
    MemLines, SeriesKey, SeriesLabel, Timeline, TimelineBuilder, TriggerMark, DEFAULT_MAX_POINTS,
};
use crate::report::trigger::{self, oom_kills, Condition, Reading as TriggerReading, Trigger};
use crate::report::{self, BuildOptions, Report, RunInfo};
use crate::session::args::ReportArgs;
use crate::session::status::StatusLine;
use crate::session::{
    final_read, install_stop_handler, kmem_config, learn_cgroups, run_info, start_tracing,
    stop_tracing, wait_for_end_every, FinalRead, Targets,
};
use crate::signals::{install_snapshot_handler, take_snapshot_request};
use crate::symbolize::{KernelSymbols, Symbolize};
use crate::sys::cgroup2_mount;

#[derive(Args, Debug)]
pub struct LeaksArgs {
    #[command(flatten)]
    pub report: ReportArgs<LeaksFormat>,
    /// Only count objects at least this old as outstanding
    #[arg(long, value_parser = parse_age, default_value = "0", value_name = "SECS")]
    pub min_age: f64,
    /// Group rows by
    #[arg(long, value_enum, default_value_t = LeakGroupBy::Site)]
    pub by: LeakGroupBy,
    /// Write a JSON snapshot of what is outstanding every SECS seconds (also on SIGUSR1)
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true, value_name = "SECS")]
    pub snapshot_every: Option<Duration>,
    /// Where snapshots go (snapshot-001.json, …; default: the current directory)
    #[arg(long, value_name = "DIR")]
    pub snapshot_dir: Option<PathBuf>,
    /// Track about one object in N, chosen by a hash of its address (a power of two); totals become estimates
    #[arg(long, value_parser = parse_sample, default_value = "1", value_name = "N")]
    pub sample: u32,
    /// Capacity of the object store (objects tracked at once; about 80 bytes of kernel memory each, 120 before 5.12)
    #[arg(long, value_parser = parse_tracked_objects, default_value = crate::cli::DEFAULT_TRACKED_OBJECTS, value_name = "N")]
    pub max_objects: u32,
    /// Read the timeline (outstanding bytes of the top sites, /proc/meminfo) every SECS seconds
    #[arg(long, value_parser = parse_interval, default_value = "1", value_name = "SECS")]
    pub interval: Duration,
    /// Sites the timeline keeps at each reading (the rest is "other")
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=100), default_value = "10", value_name = "N")]
    pub timeline_sites: u16,
    /// Write a snapshot (JSON; also pprof with --format pprof) into --snapshot-dir when COND holds at a reading: sunreclaim+=N, site:PATTERN+=N or oom (repeatable)
    #[arg(long, value_parser = trigger::parse, value_name = "COND")]
    pub snapshot_when: Vec<Trigger>,
    /// Exit with status 3 (and list the rows) when the run leaves more than BUDGET: 'outstanding > 1M', 'allocated[page] > 10M', 'outstanding{site=load_msg*} > 0' (repeatable; docs/design.md)
    #[arg(long, value_parser = parse_budget, value_name = "BUDGET")]
    pub fail_if: Vec<Budget>,
}

fn parse_budget(s: &str) -> Result<Budget, String> {
    budget::parse(s, true)
}

/// The timeline's interval: a reading walks the whole object map, so not
/// more often than ten times a second.
fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(100) {
        return Err(format!("'{s}': the interval must be at least 0.1 seconds"));
    }
    Ok(d)
}

/// Sites are exact regardless; long-lived objects pile up, so even a sparse
/// sample names the stacks that hold memory, and a stack costs ~3 us.
pub const LEAKS_STACK_SAMPLE: u32 = 256;

/// The kernel tracer's settings for this run: record's, plus live objects.
fn kernel_config(args: &LeaksArgs, targets: &Targets) -> Config {
    Config {
        live: Some(LiveConfig {
            sample_every: args.sample,
            max_objects: args.max_objects,
        }),
        by_cgroup: args.by == LeakGroupBy::Cgroup,
        // Tests every allocation's context, for the interrupt row.
        by_process: args.by == LeakGroupBy::Process,
        // Each stack row says who made it (JSON, pprof labels).
        stack_owners: true,
        ..kmem_config(&args.report.trace, targets, LEAKS_STACK_SAMPLE)
    }
}

/// `--min-age`: 0 or more seconds, capped like every other duration
/// (crate::cli::MAX_DURATION).
fn parse_age(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > crate::cli::MAX_DURATION.as_secs_f64() => Err(format!(
            "'{s}' seconds is too long: at most {} (7 days)",
            crate::cli::MAX_DURATION.as_secs()
        )),
        Ok(v) if v >= 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not a number of seconds")),
    }
}

/// What can be refused before anything is attached. Returns where
/// snapshots go.
fn check_args(args: &LeaksArgs) -> Result<PathBuf> {
    args.report.trace.filters.check()?;
    let stacks_only = match args.report.output.format {
        LeaksFormat::Common(Format::Folded) => Some("folded"),
        LeaksFormat::Common(Format::Svg) => Some("svg"),
        _ => None,
    };
    if let (Some(format), false) = (stacks_only, args.by == LeakGroupBy::Stack) {
        bail!("--format {format} shows stacks: use it with --by stack");
    }
    features::check_privileges("leaks")?;
    features::check_btf()?;
    // Checked before attaching when snapshots are asked for. Without them a
    // SIGUSR1 snapshot may still come: one that cannot be written is said
    // then, and costs nothing else (leaks also runs in read-only places).
    let snapshot_dir = args
        .snapshot_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("."));
    if args.snapshot_every.is_some()
        || args.snapshot_dir.is_some()
        || !args.snapshot_when.is_empty()
    {
        crate::output::check_dir_writable(&snapshot_dir, "--snapshot-dir")?;
    }
    args.report.output.check()?;
    args.report.json.check()?;
    if args.report.output.format == LeaksFormat::Common(Format::Pprof) {
        crate::output::check_binary_destination(args.report.output.output(), "pprof")?;
    }
    Ok(snapshot_dir)
}

pub fn run(args: LeaksArgs) -> Result<i32> {
    let snapshot_dir = check_args(&args)?;
    install_stop_handler();
    install_snapshot_handler();

    // Start: the tracer, and what the run is measured against.
    let mut targets = Targets::start(&args.report.trace.filters.targets)?;
    let cfg = kernel_config(&args, &targets);
    let mut storage = ObjectStorage::default();
    let mut session = Tracer::start(&cfg, &mut storage, None)?;
    let memory_at_start = MemoryAtStart::read(cfg.sources, &session)?;
    // The traced time runs from attach to detach: the command may well be
    // done while the symbols below load.
    let start = Instant::now();
    let mut readings = Readings::start(&args, cfg.by_cgroup, start);
    start_tracing(
        "kernel heap allocations and frees",
        &session.attached,
        args.report.trace.duration,
        &mut targets,
        "; Ctrl-C to stop, SIGUSR1 for a snapshot",
    )?;
    let mut reports = Reports::new(&args, &cfg);
    let run = run_info(&session, &session.skipped, &args.report.trace.filters);
    let mut snapshots = Snapshots::new(&args, snapshot_dir, run, start);

    // Tick: the timeline (and the triggers it fires), the snapshots due,
    // the status line.
    let mut status = StatusLine::new();
    let mut next_status = Duration::from_secs(1);
    let ended = wait_for_end_every(
        args.report.trace.duration,
        &mut targets,
        tick_period(&args),
        |elapsed| {
            learn_cgroups(&mut reports.cgroup_names, &session);
            if readings.due(elapsed) {
                readings.read(&session, &mut reports, &mut snapshots);
            }
            snapshots.on_tick(elapsed, &session, &mut reports);
            if elapsed >= next_status {
                next_status = elapsed + Duration::from_secs(1);
                status.show(elapsed, || session.progress());
            }
        },
    );
    drop(status); // erases the status line before the report

    // Finish: the level at the end, after the command's last frees; the
    // last read; the report.
    readings.read(&session, &mut reports, &mut snapshots);
    let duration_s = stop_tracing(&mut session, &mut reports.cgroup_names, start)?;
    // Only when compared: it reads /proc/zoneinfo and /proc/vmstat too.
    let meminfo_at_end = memory_at_start.meminfo.as_ref().map(|_| MemInfo::read());
    let FinalRead {
        exit_code,
        snapshot: mut snap,
        run,
    } = final_read(&session, ended, &mut targets, &args.report.trace.filters)?;
    drop(session);
    let mut report = reports.build(&mut snap, "leaks", duration_s, run);
    if let (Some(before), Some(after)) = (&memory_at_start.meminfo, &meminfo_at_end) {
        let filters = args.report.trace.filters.describe();
        let memory = MemoryChange {
            before,
            after,
            page_frees_before: memory_at_start.page_frees_untracked,
        };
        account_sources(&mut report, &snap, cfg.sources, &memory, &filters);
    }
    if let Some(l) = report.leaks.as_mut() {
        l.timeline = Some(readings.finish(&snap, &mut reports));
    }
    let rows = budget_rows(&report);
    let (exit_code, over) = budget::verdict(&args.fail_if, &rows, exit_code);
    write_report(report, &args)?;
    eprint!("{over}");
    Ok(exit_code)
}

/// How often the wait loop ticks: every second, or more often for a
/// shorter --interval or --snapshot-every.
fn tick_period(args: &LeaksArgs) -> Duration {
    args.snapshot_every
        .map_or(args.interval, |s| s.min(args.interval))
        .min(Duration::from_secs(1))
}

/// What the end of the run is compared with when sources beyond the slab
/// are traced: /proc/meminfo and the page frees the tracer could not match
/// to a tracked page, both read once the tracer is attached.
struct MemoryAtStart {
    meminfo: Option<MemInfo>,
    page_frees_untracked: u64,
}

impl MemoryAtStart {
    fn read(sources: Sources, tracer: &Tracer) -> Result<MemoryAtStart> {
        Ok(MemoryAtStart {
            meminfo: (!sources.is_default()).then(MemInfo::read),
            page_frees_untracked: if sources.contains(Source::Page) {
                tracer.page_bytes_freed_untracked()?
            } else {
                0
            },
        })
    }
}

/// Turns one read of the maps into a leaks report: the symbols, the
/// cgroups' paths learned while the run goes on, and the flags that shape
/// the rows. Snapshots and the final report are built alike.
struct Reports {
    syms: KernelSymbols,
    cgroup_names: CgroupNames,
    min_age_ns: u64,
    stack_sample_every: u32,
}

impl Reports {
    fn new(args: &LeaksArgs, cfg: &Config) -> Reports {
        Reports {
            syms: KernelSymbols::new(None),
            cgroup_names: CgroupNames::new(cgroup2_mount().ok()),
            min_age_ns: (args.min_age * 1e9) as u64,
            stack_sample_every: cfg.stack_sample_every,
        }
    }

    /// `kind` is "snapshot" or "leaks" (the report's `leaks.kind`).
    fn build(&mut self, snap: &mut Snapshot, kind: &str, duration_s: f64, run: RunInfo) -> Report {
        if let Some(l) = snap.leaks.as_mut() {
            l.min_age_ns = self.min_age_ns;
            l.kind = kind.to_string();
            l.cap_ages((duration_s * 1e9) as u64);
        }
        let mut report = report::build(
            snap,
            &self.syms,
            BuildOptions {
                stack_sample_every: self.stack_sample_every,
                duration_s,
                run,
            },
        );
        report.name_cgroups(&mut self.cgroup_names);
        report
    }
}

/// The snapshot files written while the run goes on: every
/// --snapshot-every, on SIGUSR1, and when a --snapshot-when trigger fires.
struct Snapshots {
    dir: PathBuf,
    every: Option<Duration>,
    /// When the next periodic snapshot is due (time since the wait began).
    next: Option<Duration>,
    /// Periodic and SIGUSR1 snapshots so far: their files' numbers.
    numbered: u32,
    /// A pprof profile beside each trigger's JSON (--format pprof).
    pprof_on_trigger: bool,
    run: RunInfo,
    start: Instant,
}

impl Snapshots {
    fn new(args: &LeaksArgs, dir: PathBuf, run: RunInfo, start: Instant) -> Snapshots {
        Snapshots {
            dir,
            every: args.snapshot_every,
            next: args.snapshot_every,
            numbered: 0,
            pprof_on_trigger: args.report.output.format == LeaksFormat::Common(Format::Pprof),
            run,
            start,
        }
    }

    /// A periodic snapshot when one is due, or one SIGUSR1 asked for.
    fn on_tick(&mut self, elapsed: Duration, tracer: &Tracer, reports: &mut Reports) {
        let secs = self.start.elapsed().as_secs_f64();
        let periodic = self.next.is_some_and(|n| elapsed >= n);
        if let (true, Some(next), Some(every)) = (periodic, &mut self.next, self.every) {
            // One snapshot for the snapshots a slow one made late.
            while *next <= elapsed {
                *next += every;
            }
        }
        if !(periodic || take_snapshot_request()) {
            return;
        }
        self.numbered += 1;
        let path = self.dir.join(format!("snapshot-{:03}.json", self.numbered));
        self.write(tracer, reports, path, secs, false);
    }

    /// The snapshot `trigger` fired: its name in the file's. Returns the
    /// JSON's path if written.
    fn on_trigger(
        &mut self,
        trigger: &Trigger,
        tracer: &Tracer,
        reports: &mut Reports,
    ) -> Option<PathBuf> {
        learn_cgroups(&mut reports.cgroup_names, tracer);
        let secs = self.start.elapsed().as_secs_f64();
        let path = self
            .dir
            .join(format!("snapshot-{}-{secs:.1}s.json", trigger.slug()));
        self.write(tracer, reports, path, secs, self.pprof_on_trigger)
    }

    /// Reads the maps and writes the snapshot at `path` (and its pprof
    /// profile with `with_pprof`), saying so on stderr. A snapshot that
    /// cannot be written is said and skipped: a full disk must not cost
    /// the final report.
    fn write(
        &self,
        tracer: &Tracer,
        reports: &mut Reports,
        path: PathBuf,
        secs: f64,
        with_pprof: bool,
    ) -> Option<PathBuf> {
        let written = tracer.snapshot().and_then(|mut snap| {
            let r = reports.build(&mut snap, "snapshot", secs, self.run.clone());
            write_json(&r, &path)?;
            if with_pprof {
                let profile = crate::render::pprof::from_report(&r).encode_gzip();
                crate::output::write_bytes_atomic(&path.with_extension("pb.gz"), &profile)?;
            }
            Ok(r)
        });
        match written {
            Ok(r) => {
                let l = r.leaks.as_ref().map(|l| &l.retention);
                eprintln!(
                    "kheap: {:.1}s: snapshot {} ({} objects, {} outstanding)",
                    secs,
                    path.display(),
                    l.map_or(0, |l| l.outstanding_count),
                    crate::model::human_size(l.map_or(0, |l| l.outstanding_bytes)),
                );
                Some(path)
            }
            Err(e) => {
                eprintln!(
                    "kheap: warning: snapshot {} not written: {}",
                    path.display(),
                    format!("{e:#}").replace('\n', " ")
                );
                None
            }
        }
    }
}

/// The timeline's readings and the --snapshot-when triggers they fire.
struct Readings {
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
    fn start(args: &LeaksArgs, by_cgroup: bool, start: Instant) -> Readings {
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
    fn due(&mut self, elapsed: Duration) -> bool {
        if elapsed < self.next {
            return false;
        }
        self.next += self.interval;
        true
    }

    /// One reading of the timeline, and the triggers it fires (each writes
    /// its snapshot): on the loop's tick, and once more at the end, so a
    /// condition met last (an OOM kill as the command ends) still fires.
    fn read(&mut self, tracer: &Tracer, reports: &mut Reports, snapshots: &mut Snapshots) {
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
    fn finish(self, snap: &Snapshot, reports: &mut Reports) -> Timeline {
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

/// /proc/meminfo at both ends of the run, and the untracked page frees
/// counted before it.
struct MemoryChange<'a> {
    before: &'a MemInfo,
    after: &'a MemInfo,
    page_frees_before: u64,
}

/// The report's comparison of what the sources hold with what /proc/meminfo
/// says changed (`leaks.accounting`), or why a run has none.
fn account_sources(
    report: &mut Report,
    snap: &Snapshot,
    sources: Sources,
    memory: &MemoryChange,
    filters: &[String],
) {
    let mut outstanding = report.outstanding_by_source(Geometry::read());
    if let (Some(l), true) = (&snap.leaks, sources.contains(Source::Page)) {
        let freed = l
            .events
            .page_bytes_freed_untracked
            .saturating_sub(memory.page_frees_before);
        outstanding.entry(Source::Page).or_default().freed_untracked =
            freed * u64::from(l.sample_every.max(1));
    }
    if let Some(l) = report.leaks.as_mut() {
        let (sources, skipped) = comparable(sources, filters);
        l.accounting_skipped = skipped;
        l.accounting = account(sources, &outstanding, memory.before, memory.after);
    }
}

/// What --fail-if is checked against: each site's outstanding and
/// allocated bytes.
fn budget_rows(report: &Report) -> Vec<BudgetRow> {
    report
        .sites
        .iter()
        .map(|r| BudgetRow {
            function: r.function.clone(),
            source: Some(r.source),
            outstanding_bytes: r.retention.as_ref().map_or(0, |x| x.outstanding_bytes),
            allocated_bytes: r.counts.bytes_alloc,
        })
        .collect()
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

fn write_json(r: &Report, path: &Path) -> Result<()> {
    crate::output::write_atomic(path, &contract::pretty(Kind::Leaks, r))
}

fn write_report(mut report: Report, args: &LeaksArgs) -> Result<()> {
    let out = &args.report.output;
    args.report.json.write(Kind::Leaks, &report, |r| {
        leak_render::apply_top(r, args.by, None);
    })?;
    // The chart names each series' owners from every stack row: drawn
    // before -r cuts the rows (a chart has no rows to cut).
    let format = match out.format {
        LeaksFormat::Html => {
            let page = crate::leaks::chart::html(
                &report,
                "kheap leaks: outstanding kernel memory over time",
            );
            return crate::output::emit(&page, out.output());
        }
        LeaksFormat::Common(format) => format,
    };
    let hidden = leak_render::apply_top(&mut report, args.by, out.rows());
    let text = match format {
        Format::Table => leak_render::table(
            &report,
            args.by,
            hidden,
            3,
            crate::render::table::output_width(out.output()),
        ),
        Format::Json => contract::pretty(Kind::Leaks, &report),
        Format::Folded => leak_render::folded(&report),
        Format::Pprof => {
            args.report.frames.apply(&mut report);
            let profile = crate::render::pprof::from_report(&report).encode_gzip();
            return crate::output::emit_bytes(&profile, out.output());
        }
        Format::Svg => crate::render::flame::titled(
            &crate::render::outstanding_flame_samples(&{
                args.report.frames.apply(&mut report);
                report
            }),
            args.report.weight,
            "kheap leaks",
            "outstanding",
        ),
    };
    crate::output::emit(&text, out.output())
}
