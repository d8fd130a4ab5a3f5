//! `kheap slab` without tracing: the static report, sampling over `-d`, and
//! `--watch`. The traced run is wired in by the caller, which hands its
//! [`TracedRun`](super::traced::TracedRun) to [`print_report`].

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::render::{report_json, report_table, watch_json, watch_table};
use super::report::{build_report, ReportInput, SortKey};
use super::snapshot::{read_static, StaticSnapshot};
use super::watch::{diff, series};
use crate::cli::{OutputArgs, TableOrJson, TraceArgs};
use crate::output::emit;
use crate::output::Sink;
use crate::render::table::output_width;
use crate::signals::sleep_unless_stopped;
use crate::sys::slab_sysfs::SYS_KERNEL_SLAB;
use crate::sys::slabinfo::PROC_SLABINFO;

/// `--sort`: [`SortKey`] as the command line spells it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SortArg {
    /// Slab memory.
    #[default]
    Size,
    /// Active objects.
    Objs,
    /// Rounding waste when traced, slab loss otherwise.
    Waste,
    /// Net growth: traced allocations minus frees, or the change between reads.
    Growth,
    /// Allocations per second (needs tracing).
    Rate,
}

impl From<SortArg> for SortKey {
    fn from(a: SortArg) -> SortKey {
        match a {
            SortArg::Size => SortKey::Size,
            SortArg::Objs => SortKey::Objs,
            SortArg::Waste => SortKey::Waste,
            SortArg::Growth => SortKey::Growth,
            SortArg::Rate => SortKey::Rate,
        }
    }
}

/// Which slab caches hold memory, how fast they grow, and what they waste.
#[derive(Clone, Debug, clap::Args)]
pub struct SlabArgs {
    // Traced mode (with -d, -p, -- CMD or any filter): who allocates into
    // each cache and what rounding wastes.
    #[command(flatten)]
    pub trace: TraceArgs,
    #[command(flatten)]
    pub output: OutputArgs<TableOrJson>,
    /// Order of the rows
    #[arg(long, value_enum, default_value_t = SortArg::Size)]
    pub sort: SortArg,
    /// Re-read every SECS seconds and show per-cache changes, like slabtop
    /// with deltas (until interrupted, or for -d SECS)
    #[arg(long, value_parser = crate::cli::parse_duration, allow_hyphen_values = true, value_name = "SECS")]
    pub watch: Option<Duration>,
    /// With -d, only sample /proc/slabinfo; don't trace allocations
    #[arg(long)]
    pub no_trace: bool,
    /// Read this file instead of /proc/slabinfo (for tests and captures)
    #[arg(long, hide = true, default_value = PROC_SLABINFO)]
    pub slabinfo_path: PathBuf,
    /// Read this directory instead of /sys/kernel/slab
    #[arg(long, hide = true, default_value = SYS_KERNEL_SLAB)]
    pub sysfs_path: PathBuf,
}

impl SlabArgs {
    /// Whether this run traces allocations: any tracing option says so,
    /// -d alone too unless --no-trace; --watch never does.
    pub fn traced(&self) -> Result<bool> {
        let tracing_options = self.trace.any();
        if tracing_options && (self.watch.is_some() || self.no_trace) {
            let with = if self.no_trace {
                "--no-trace"
            } else {
                "--watch"
            };
            bail!("-p, -- CMD, --comm, --min-size, --max-size, --attach and the stack options select traced allocations: they don't go with {with}");
        }
        let traced = (tracing_options || self.trace.duration.is_some())
            && self.watch.is_none()
            && !self.no_trace;
        if !traced && self.sort == SortArg::Rate {
            bail!("--sort rate needs traced allocations: add -d SECS, -p PID or -- CMD (without --no-trace or --watch)");
        }
        Ok(traced)
    }

    /// One static read from the configured sources.
    pub fn read_static(&self) -> Result<StaticSnapshot> {
        read_static(&self.slabinfo_path, &self.sysfs_path)
    }
}

/// Formats and prints a report built from `input`.
pub fn print_report(args: &SlabArgs, input: ReportInput) -> Result<()> {
    let rows = args.output.rows().unwrap_or(usize::MAX);
    let report = build_report(input, args.sort.into(), rows);
    let text = match args.output.format {
        TableOrJson::Table => report_table(&report, output_width(args.output.output())),
        TableOrJson::Json => report_json(&report),
    };
    emit(&text, args.output.output())
}

/// The untraced command: one read, sampling over `-d`, or `--watch`.
pub fn run_static(args: &SlabArgs) -> Result<()> {
    if let Some(every) = args.watch {
        return watch(args, every);
    }
    let Some(total) = args.trace.duration else {
        let snap = args.read_static()?;
        return print_report(args, ReportInput::of(&snap));
    };
    // Sample about ten times so steady growth can be told from a blip.
    let interval = (total / 10).clamp(Duration::from_millis(200), Duration::from_secs(10));
    let start = Instant::now();
    let mut samples = vec![(0.0, args.read_static()?)];
    // Like the traced run's line: a quiet terminal for -d seconds would look
    // hung, and a script can wait for this line before it signals.
    eprintln!(
        "kheap: sampling /proc/slabinfo for {}s (Ctrl-C ends it early, the report is still printed)",
        total.as_secs_f64()
    );
    // A signal ends the sampling early; the report covers what was sampled.
    while start.elapsed() < total {
        let left = total.saturating_sub(start.elapsed());
        let go_on = sleep_unless_stopped(interval.min(left));
        samples.push((start.elapsed().as_secs_f64(), args.read_static()?));
        if !go_on {
            break;
        }
    }
    let series = series(&samples);
    print_report(
        args,
        ReportInput {
            before: samples.first().map(|(_, s)| s),
            after: samples.last().map(|(_, s)| s),
            traced: None,
            series: &series,
        },
    )
}

fn watch(args: &SlabArgs, every: Duration) -> Result<()> {
    let start = Instant::now();
    let mut sink = Sink::create(args.output.output())?;
    let rows = args.output.rows().unwrap_or(usize::MAX);
    let clear = args.output.format == TableOrJson::Table
        && args.output.output.is_none()
        && std::io::stdout().is_terminal();
    let mut prev = args.read_static()?;
    let mut prev_at = Instant::now();
    loop {
        if args.trace.duration.is_some_and(|d| start.elapsed() >= d) {
            return Ok(());
        }
        if !sleep_unless_stopped(every) {
            return Ok(());
        }
        let cur = args.read_static()?;
        let now = Instant::now();
        let elapsed = now.duration_since(prev_at).as_secs_f64();
        let deltas = diff(&prev, &cur);
        let text = match args.output.format {
            TableOrJson::Table => {
                let mut t = String::new();
                if clear {
                    t.push_str("\x1b[2J\x1b[H");
                }
                t.push_str(&watch_table(
                    &deltas,
                    elapsed,
                    rows,
                    output_width(args.output.output()),
                ));
                for n in &cur.notes {
                    t.push_str(&format!("note: {n}\n"));
                }
                t
            }
            TableOrJson::Json => watch_json(&deltas, start.elapsed().as_secs_f64(), elapsed, rows),
        };
        if !sink.write(&text)? {
            return Ok(());
        }
        prev = cur;
        prev_at = now;
    }
}
