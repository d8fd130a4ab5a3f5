//! `kheap slab` without tracing: the static report, sampling over `-d`, and
//! `--watch`. The traced run is wired in by the caller, which hands its
//! [`TracedRun`](super::traced::TracedRun) to [`print_report`].

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::signals::sleep_unless_stopped;

use super::render::{report_json, report_table, watch_json, watch_table};
use super::report::{build_report, ReportInput, SortKey};
use super::slabinfo::PROC_SLABINFO;
use super::snapshot::{read_static, StaticSnapshot};
use super::sysfs::SYS_KERNEL_SLAB;
use super::watch::{diff, series};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    #[default]
    Table,
    Json,
}

/// Which slab caches hold memory, how fast they grow, and what they waste.
#[derive(Clone, Debug, clap::Args)]
pub struct SlabArgs {
    /// Run for SECS seconds (tracing, or sampling the static state when not
    /// tracing) and report growth over the run
    #[arg(short = 'd', long = "duration", value_parser = crate::cli::parse_duration, value_name = "SECS")]
    pub duration: Option<Duration>,
    /// Order of the rows
    #[arg(long, value_enum, default_value_t = SortKey::Size)]
    pub sort: SortKey,
    /// Show at most ROWS caches
    #[arg(short = 'n', long = "rows", value_name = "ROWS", default_value_t = 20)]
    pub rows: usize,
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub format: OutputFormat,
    /// Re-read every SECS seconds and show per-cache changes, like slabtop
    /// with deltas (until interrupted, or for -d SECS)
    #[arg(long, value_parser = crate::cli::parse_duration, value_name = "SECS")]
    pub watch: Option<Duration>,
    /// Trace only allocations made by this process (repeatable)
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Leave the command and what it started running when kheap stops
    #[arg(long)]
    pub keep_running: bool,
    /// Run this command and trace its allocations until it exits
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
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
    /// One static read from the configured sources.
    pub fn read_static(&self) -> Result<StaticSnapshot> {
        read_static(&self.slabinfo_path, &self.sysfs_path)
    }
}

/// Formats and prints a report built from `input`.
pub fn print_report(args: &SlabArgs, input: ReportInput) -> Result<()> {
    let report = build_report(input, args.sort, args.rows);
    let text = match args.format {
        OutputFormat::Table => report_table(&report),
        OutputFormat::Json => report_json(&report) + "\n",
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// The untraced command: one read, sampling over `-d`, or `--watch`.
pub fn run_static(args: &SlabArgs) -> Result<()> {
    if let Some(every) = args.watch {
        return watch(args, every);
    }
    let Some(total) = args.duration else {
        let snap = args.read_static()?;
        return print_report(
            args,
            ReportInput {
                after: Some(&snap),
                ..Default::default()
            },
        );
    };
    // Sample about ten times so steady growth can be told from a blip.
    let interval = (total / 10).clamp(Duration::from_millis(200), Duration::from_secs(10));
    let start = Instant::now();
    let mut samples = vec![(0.0, args.read_static()?)];
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
    let clear = args.format == OutputFormat::Table && std::io::stdout().is_terminal();
    let mut prev = args.read_static()?;
    let mut prev_at = Instant::now();
    loop {
        if args.duration.is_some_and(|d| start.elapsed() >= d) {
            return Ok(());
        }
        if !sleep_unless_stopped(every) {
            return Ok(());
        }
        let cur = args.read_static()?;
        let now = Instant::now();
        let elapsed = now.duration_since(prev_at).as_secs_f64();
        let deltas = diff(&prev, &cur);
        let text = match args.format {
            OutputFormat::Table => {
                let mut t = String::new();
                if clear {
                    t.push_str("\x1b[2J\x1b[H");
                }
                t.push_str(&watch_table(&deltas, elapsed, args.rows));
                for n in &cur.notes {
                    t.push_str(&format!("note: {n}\n"));
                }
                t
            }
            OutputFormat::Json => {
                watch_json(&deltas, start.elapsed().as_secs_f64(), elapsed, args.rows) + "\n"
            }
        };
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())?;
        out.flush()?;
        prev = cur;
        prev_at = now;
    }
}
