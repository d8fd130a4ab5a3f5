//! `kheap slab` without tracing: the static report, sampling over `-d`, and
//! `--watch`. The traced run is wired in by the caller, which hands its
//! [`TracedRun`](crate::slab::TracedRun) to [`print_report`].

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::args::SlabArgs;
use crate::cli::TableOrJson;
use crate::output::emit;
use crate::output::Sink;
use crate::render::table::output_width;
use crate::signals::sleep_unless_stopped;
use crate::slab::render::{report_json, report_table, watch_json, watch_table};
use crate::slab::report::{build_report, ReportInput};
use crate::slab::watch::{diff, series};

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
