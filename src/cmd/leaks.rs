//! `kheap leaks`: trace like record, then show what is still allocated of
//! what was allocated while tracing (retained) beside what was allocated
//! and freed (transient). Snapshots of the outstanding set can be written
//! while it runs (--snapshot-every, SIGUSR1) and compared with `kheap diff`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::contract::Kind;
use crate::kernel::features;
use crate::kernel::kmem::{Config, LiveConfig, Tracer};
use crate::kernel::storage::ObjectStorage;
use crate::leaks::render::{self as leak_render, LeakGroupBy, LeaksFormat};
use crate::model::snapshot::Snapshot;
use crate::model::{Source, Sources};
use crate::render::Format;
use crate::report::budget::{self, BudgetRow};
use crate::report::meminfo::{account, comparable, Geometry, MemInfo};
use crate::report::Report;
use crate::session::args::ReportViews;
use crate::session::status::StatusLine;
use crate::session::{
    final_read, install_stop_handler, kmem_config, learn_cgroups, run_info, start_tracing,
    stop_tracing, wait_for_end_every, FinalRead, Targets,
};
use crate::signals::install_snapshot_handler;

mod args;
mod readings;
mod reports;
mod snapshots;

pub use args::LeaksArgs;
use readings::Readings;
use reports::Reports;
use snapshots::Snapshots;

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
    // Its read of the live objects also names merged caches' objects while
    // frees are still seen (kmem's `asked`): a second read of the object
    // table here would be pages kheap allocates while the accounting still
    // measures free memory.
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
    let width = crate::render::table::output_width(out.output());
    let table = |r: &Report| leak_render::table(r, args.by, hidden, 3, width);
    let views = ReportViews {
        kind: Kind::Leaks,
        table: &table,
        folded: leak_render::folded,
        flame_samples: crate::render::outstanding_flame_samples,
        title: "kheap leaks",
        bytes_word: "outstanding",
    };
    args.report.emit(format, report, views)
}
