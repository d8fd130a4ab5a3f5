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
use crate::model::{CgroupSlot, Source};
use crate::render::Format;
use crate::report::budget::{self, Budget, BudgetRow};
use crate::report::meminfo::{account, comparable, Geometry, MemInfo};
use crate::report::timeline::{
    MemLines, SeriesKey, SeriesLabel, TimelineBuilder, TriggerMark, DEFAULT_MAX_POINTS,
};
use crate::report::trigger::{self, oom_kills, Condition, Reading as TriggerReading, Trigger};
use crate::report::{self, BuildOptions, Report, RunInfo};
use crate::session::args::ReportArgs;
use crate::session::status::StatusLine;
use crate::session::{
    install_stop_handler, kmem_config, name_command_process, run_info, start_tracing,
    wait_for_end_every, Targets,
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

    let mut targets = Targets::start(&args.report.trace.filters.targets)?;
    let cfg = kernel_config(&args, &targets);
    let mut storage = ObjectStorage::default();
    let mut session = Tracer::start(&cfg, &mut storage, None)?;
    // Sources beyond the slab are compared with /proc/meminfo over the run.
    let meminfo_before = (!cfg.sources.is_default()).then(MemInfo::read);
    let page_frees_before = if cfg.sources.contains(Source::Page) {
        session.page_bytes_freed_untracked()?
    } else {
        0
    };
    // The traced time runs from attach to detach: the command may well be
    // done while the symbols below load.
    let start = Instant::now();
    // Growth is counted from here, whenever the first reading comes.
    let mut triggers = args.snapshot_when.clone();
    let at_start = TriggerReading {
        sunreclaim_bytes: MemInfo::sunreclaim_now(),
        oom_kills: oom_kills(&std::fs::read_to_string("/proc/vmstat").unwrap_or_default()),
        sites: &[],
    };
    for t in &mut triggers {
        t.start_from(&at_start);
    }
    start_tracing(
        "kernel heap allocations and frees",
        &session.attached,
        args.report.trace.duration,
        &mut targets,
        "; Ctrl-C to stop, SIGUSR1 for a snapshot",
    )?;
    let syms = KernelSymbols::new(None);
    let info_of =
        |session: &Tracer| run_info(session, &session.skipped, &args.report.trace.filters);
    let info = info_of(&session);
    let build = |snap: &mut Snapshot, kind: &str, duration_s: f64, run: RunInfo| {
        if let Some(l) = snap.leaks.as_mut() {
            l.min_age_ns = (args.min_age * 1e9) as u64;
            l.kind = kind.to_string();
            l.cap_ages((duration_s * 1e9) as u64);
        }
        report::build(
            snap,
            &syms,
            BuildOptions {
                stack_sample_every: cfg.stack_sample_every,
                duration_s,
                run,
            },
        )
    };

    let mut snapshots = 0u32;
    let mut next_snapshot = args.snapshot_every;
    // Paths are learned while the run goes on: a cgroup removed before the
    // end keeps the path it had.
    let mut cgroup_names = CgroupNames::new(cgroup2_mount().ok());
    // Periodic and SIGUSR1 snapshots (trigger None), or one a trigger
    // fired (its name in the file's; a pprof profile beside it with
    // --format pprof). Returns the JSON's path if written.
    let mut snapshot_tick = |elapsed: Duration, trigger: Option<&Trigger>| -> Option<PathBuf> {
        if let Ok(ids) = session.cgroup_ids() {
            cgroup_names.learn(ids);
        }
        let secs = start.elapsed().as_secs_f64();
        let path = match trigger {
            Some(t) => snapshot_dir.join(format!("snapshot-{}-{secs:.1}s.json", t.slug())),
            None => {
                let periodic = next_snapshot.is_some_and(|n| elapsed >= n);
                if let (true, Some(next), Some(every)) =
                    (periodic, &mut next_snapshot, args.snapshot_every)
                {
                    // One snapshot for the snapshots a slow one made late.
                    while *next <= elapsed {
                        *next += every;
                    }
                }
                if !(periodic || take_snapshot_request()) {
                    return None;
                }
                snapshots += 1;
                snapshot_dir.join(format!("snapshot-{snapshots:03}.json"))
            }
        };
        let written = session.snapshot().and_then(|mut snap| {
            let mut r = build(&mut snap, "snapshot", secs, info.clone());
            r.name_cgroups(&mut cgroup_names);
            write_json(&r, &path)?;
            if trigger.is_some() && args.report.output.format == LeaksFormat::Common(Format::Pprof)
            {
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
            // A full disk must not cost the final report: say so, go on.
            Err(e) => {
                eprintln!(
                    "kheap: warning: snapshot {} not written: {}",
                    path.display(),
                    format!("{e:#}").replace('\n', " ")
                );
                None
            }
        }
    };
    let mut timeline = TimelineBuilder::new(
        args.interval.as_secs_f64(),
        args.timeline_sites.into(),
        DEFAULT_MAX_POINTS,
        args.sample,
    );
    let by_cgroup = cfg.by_cgroup;
    // What the triggers read beyond the timeline's own lines: vmstat only for
    // an OOM trigger, the sites' names only for a site trigger.
    let wants_oom = triggers.iter().any(|t| t.condition == Condition::Oom);
    let wants_sites = triggers
        .iter()
        .any(|t| matches!(t.condition, Condition::SiteGrew { .. }));
    let mut fired: Vec<TriggerMark> = Vec::new();
    let site_names = std::cell::RefCell::new(HashMap::<(u64, Source), String>::new());
    let site_name = |k: &SeriesKey| -> String {
        let mut names = site_names.borrow_mut();
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
    };
    let mut status = StatusLine::new();
    let mut next_second = Duration::from_secs(1);
    let mut next_reading = args.interval;
    // One reading of the timeline, and the triggers it fires (each writes
    // its snapshot through `snapshot`): on the loop's tick, and once more
    // at the end, so a condition met last (an OOM kill as the command
    // ends) still fires.
    let mut reading =
        |elapsed: Duration,
         snapshot: &mut dyn FnMut(Duration, Option<&Trigger>) -> Option<PathBuf>| {
            let reading = read_timeline(&mut timeline, &session, start, wants_oom, by_cgroup);
            let Some(TimelineRead {
                t_s,
                series: read,
                meminfo,
                oom_kills,
            }) = reading.filter(|_| !triggers.is_empty())
            else {
                return;
            };
            let sites: Vec<(String, u64)> = if wants_sites {
                read.iter()
                    .map(|(k, o)| (site_name(k), o.bytes_alloc * u64::from(args.sample)))
                    .collect()
            } else {
                Vec::new()
            };
            let r = TriggerReading {
                sunreclaim_bytes: meminfo.sunreclaim_bytes,
                oom_kills,
                sites: &sites,
            };
            for t in triggers.iter_mut() {
                if t.check(&r) {
                    eprintln!("kheap: {t_s:.1}s: --snapshot-when {} fired", t.text);
                    let path = snapshot(elapsed, Some(t));
                    fired.push(TriggerMark {
                        t_s: (t_s * 1000.0).round() / 1000.0,
                        condition: t.text.clone(),
                        path: path.map(|p| p.display().to_string()),
                    });
                }
            }
        };
    let ended = wait_for_end_every(
        args.report.trace.duration,
        &mut targets,
        // Snapshots and readings come on the loop's tick: every second, or
        // more often for a shorter --interval or --snapshot-every.
        args.snapshot_every
            .map_or(args.interval, |s| s.min(args.interval))
            .min(Duration::from_secs(1)),
        |elapsed| {
            if elapsed >= next_reading {
                next_reading += args.interval;
                reading(elapsed, &mut snapshot_tick);
            }
            snapshot_tick(elapsed, None);
            if elapsed >= next_second {
                next_second = elapsed + Duration::from_secs(1);
                status.show(elapsed, || session.progress());
            }
        },
    );
    drop(status); // erases the status line before the report
                  // The level at the end, after the command's last frees.
    reading(start.elapsed(), &mut snapshot_tick);
    let duration_s = start.elapsed().as_secs_f64();
    session.detach();
    // Before the command's own cgroup is removed with it (terminate).
    cgroup_names.learn(session.cgroup_ids()?);
    // Only when compared: it reads /proc/zoneinfo and /proc/vmstat too.
    let meminfo_after = meminfo_before.as_ref().map(|_| MemInfo::read());
    let exit_code = ended.report();
    targets.terminate();
    let mut snap = session.snapshot()?;
    if let Some(cmd) = &targets.command {
        name_command_process(&mut snap, cmd);
    }
    let info = info_of(&session);
    drop(session);
    let mut report = build(&mut snap, "leaks", duration_s, info);
    report.name_cgroups(&mut cgroup_names);
    if let (Some(before), Some(after)) = (&meminfo_before, &meminfo_after) {
        let filters = args.report.trace.filters.describe();
        let memory = MemoryChange {
            before,
            after,
            page_frees_before,
        };
        account_sources(&mut report, &snap, cfg.sources, &memory, &filters);
    }
    if let Some(l) = report.leaks.as_mut() {
        l.timeline = Some(finish_timeline(
            &timeline,
            &snap,
            &syms,
            &mut cgroup_names,
            fired,
        ));
    }
    let rows = budget_rows(&report);
    let (exit_code, over) = budget::verdict(&args.fail_if, &rows, exit_code);
    write_report(report, &args)?;
    eprint!("{over}");
    Ok(exit_code)
}

/// The timeline with its series named as the report names its sites.
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
    sources: crate::model::Sources,
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

fn finish_timeline(
    timeline: &TimelineBuilder,
    snap: &Snapshot,
    syms: &KernelSymbols,
    cgroup_names: &mut CgroupNames,
    triggers: Vec<TriggerMark>,
) -> crate::report::timeline::Timeline {
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
