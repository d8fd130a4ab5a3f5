//! `kheap record`: trace for a while (or for a command's life), then print
//! who allocated what.

use std::time::Instant;

use anyhow::Result;
use clap::Args;

use crate::cgroup::CgroupNames;
use crate::contract::Kind;
use crate::kernel::features;
use crate::kernel::kmem::{Config, Tracer};
use crate::kernel::latency::{LatencyProbe, LatencySession};
use crate::kernel::storage::ObjectStorage;
use crate::render::{self, Format, GroupBy, SortBy};
use crate::report::{self, BuildOptions, Report};
use crate::session::args::{ReportArgs, ReportViews};
use crate::session::status::StatusLine;
use crate::session::{
    final_read, install_stop_handler, kmem_config, learn_cgroups, start_tracing, stop_tracing,
    wait_for_end, FinalRead, Targets,
};
use crate::symbolize::KernelSymbols;
use crate::sys::cgroup2_mount;

/// `--latency-probe`: [`LatencyProbe`] as the command line spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LatencyProbeArg {
    /// fentry/fexit where the kernel allows them, else kprobe/kretprobe
    Auto,
    Fentry,
    Kprobe,
}

impl From<LatencyProbeArg> for LatencyProbe {
    fn from(a: LatencyProbeArg) -> LatencyProbe {
        match a {
            LatencyProbeArg::Auto => LatencyProbe::Auto,
            LatencyProbeArg::Fentry => LatencyProbe::Fentry,
            LatencyProbeArg::Kprobe => LatencyProbe::Kprobe,
        }
    }
}

#[derive(Args, Debug)]
pub struct RecordArgs {
    #[command(flatten)]
    pub report: ReportArgs<Format>,
    /// Group rows by
    #[arg(long, value_enum, default_value_t = GroupBy::Site)]
    pub by: GroupBy,
    /// Order rows by
    #[arg(long, value_enum, default_value_t = SortBy::Bytes)]
    pub sort: SortBy,
    /// Also time each allocation inside the allocator, per call site
    /// (needs fentry or kprobes)
    #[arg(long)]
    pub latency: bool,
    /// How --latency probes the allocator
    #[arg(long, value_enum, default_value_t = LatencyProbeArg::Auto, requires = "latency")]
    pub latency_probe: LatencyProbeArg,
    /// Don't trace frees (saves the cost of the kfree/kmem_cache_free events)
    #[arg(long)]
    pub no_frees: bool,
}

/// The kernel tracer's settings for this run.
fn kernel_config(args: &RecordArgs, targets: &Targets) -> Config {
    Config {
        by_process: args.by == GroupBy::Process,
        by_cgroup: args.by == GroupBy::Cgroup,
        // Each stack row says who made it (JSON, pprof labels).
        stack_owners: true,
        trace_frees: !args.no_frees,
        ..kmem_config(
            &args.report.trace,
            targets,
            crate::cli::DEFAULT_STACK_SAMPLE,
        )
    }
}

pub fn run(args: RecordArgs) -> Result<i32> {
    args.report.trace.filters.check()?;
    if args.report.output.format == Format::Pprof {
        crate::output::check_binary_destination(args.report.output.output(), "pprof")?;
    }
    features::check_privileges("record")?;
    features::check_btf()?;
    args.report.output.check()?;
    args.report.json.check()?;
    install_stop_handler();

    let mut targets = Targets::start(&args.report.trace.filters.targets)?;
    let cfg = kernel_config(&args, &targets);
    // Latency first: the record object shares its per-task entry map.
    let mut latency_storage = ObjectStorage::default();
    let mut latency = if args.latency {
        Some(LatencySession::start(
            &mut latency_storage,
            args.latency_probe.into(),
        )?)
    } else {
        None
    };
    let mut storage = ObjectStorage::default();
    let mut session = Tracer::start(&cfg, &mut storage, latency.as_ref().map(|l| l.starts_map()))?;
    if let Some(l) = &latency {
        session.attached.push(format!(
            "latency: {} on {}",
            l.mechanism.name(),
            l.functions.join(", ")
        ));
    }
    start_tracing(
        "kernel heap allocations",
        &session.attached,
        args.report.trace.duration,
        &mut targets,
        "; Ctrl-C to stop",
    )?;
    let start = Instant::now();
    let mut cgroup_names = CgroupNames::new(cgroup2_mount().ok());
    let mut status = StatusLine::new();
    let ended = wait_for_end(args.report.trace.duration, &mut targets, |elapsed| {
        learn_cgroups(&mut cgroup_names, &session);
        status.show(elapsed, || session.progress());
    });
    drop(status); // erases the status line before the report
    let duration_s = stop_tracing(&mut session, &mut cgroup_names, start)?;
    if let Some(l) = latency.as_mut() {
        l.detach();
    }
    let FinalRead {
        exit_code,
        snapshot: snap,
        run,
    } = final_read(&session, ended, &mut targets, &args.report.trace.filters)?;
    drop(session);
    let latency_data = latency.map(|l| l.read()).transpose()?;

    let syms = KernelSymbols::new(None);
    let mut report = report::build(
        &snap,
        &syms,
        BuildOptions {
            stack_sample_every: cfg.stack_sample_every,
            duration_s,
            run,
        },
    );
    report.name_cgroups(&mut cgroup_names);
    if let Some(data) = &latency_data {
        report.latency = crate::latency::rows(data, &syms);
        report.lost.latency_unmatched = data.missed_start;
        report.lost.latency_nested = data.nested;
        report.lost.map_full += data.map_full;
    }
    write_report(report, &args)?;
    Ok(exit_code)
}

fn write_report(mut report: Report, args: &RecordArgs) -> Result<()> {
    let out = &args.report.output;
    args.report.json.write(Kind::Record, &report, |r| {
        render::apply_top(r, args.by, args.sort, None);
    })?;
    let hidden = render::apply_top(&mut report, args.by, args.sort, out.rows());
    let width = render::table::output_width(out.output());
    let table = |r: &Report| crate::record::view::table(r, args.by, hidden, 3, width);
    let views = ReportViews {
        kind: Kind::Record,
        table: &table,
        folded: render::folded,
        flame_samples: render::flame_samples,
        title: "kheap record",
        bytes_word: "allocated",
    };
    args.report.emit(out.format, report, views)
}
