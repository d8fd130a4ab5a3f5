//! The flags every report-writing subcommand shares besides `-o` and
//! `--format`: `--keep-allocator-frames` and `--json FILE`; and the group
//! of flags of the kmem commands that write stack reports (record, leaks).

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use serde::Serialize;

use crate::cli::{OutputArgs, OutputFormat, TraceArgs};
use crate::contract::{self, Kind};
use crate::render::{flame, Format};
use crate::report::Report;

/// `--keep-allocator-frames`: pprof profiles and flame graphs leave the
/// allocator's own entry frames (`__kmalloc*`, `kmem_cache_alloc*`,
/// `*_noprof`, …) out of every kernel stack unless asked, so that the leaf
/// of a stack, pprof's "flat" function, is the code that asked for memory.
#[derive(Args, Debug, Clone, Copy, Default)]
pub struct FrameArgs {
    /// Keep the allocator's own entry frames (__kmalloc*,
    /// kmem_cache_alloc*, *_noprof, …) at the top of each stack in pprof
    /// and svg output (by default they are left out, so that a profile's
    /// flat view names the callers)
    #[arg(long)]
    pub keep_allocator_frames: bool,
}

impl FrameArgs {
    /// The report as pprof and svg output show it.
    pub fn apply(self, report: &mut crate::report::Report) {
        if !self.keep_allocator_frames {
            crate::render::drop_allocator_frames(report);
        }
    }
}

/// `--json FILE`: the run's JSON report besides the output --format asks
/// for, so one run gives, say, a pprof profile to look at and the numbers
/// to check it against.
#[derive(Args, Debug, Clone, Default)]
pub struct JsonCopy {
    /// Also write the whole JSON report (all rows, whatever --format and -r say) to FILE
    #[arg(long = "json", value_name = "FILE")]
    pub path: Option<PathBuf>,
}

impl JsonCopy {
    /// Checked before tracing, as -o is.
    pub fn check(&self) -> Result<()> {
        match &self.path {
            Some(p) => crate::output::check_writable(p, "--json"),
            None => Ok(()),
        }
    }

    /// Writes `report` as `--format json` would without -n: `all_rows`
    /// orders its rows (and keeps them all).
    pub fn write<T: Serialize + Clone>(
        &self,
        kind: Kind,
        report: &T,
        all_rows: impl FnOnce(&mut T),
    ) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let mut full = report.clone();
        all_rows(&mut full);
        crate::output::write_atomic(path, &contract::pretty(kind, &full))
    }
}

/// What `record` and `leaks` share, in this order on their command lines:
/// what to trace, where the report goes and in which format (`F`), the JSON
/// copy, the allocator frames, and what sizes an SVG's frames.
#[derive(Args, Debug)]
pub struct ReportArgs<F: OutputFormat> {
    #[command(flatten)]
    pub trace: TraceArgs,
    #[command(flatten)]
    pub output: OutputArgs<F>,
    #[command(flatten)]
    pub json: JsonCopy,
    #[command(flatten)]
    pub frames: FrameArgs,
    /// What sizes the frames of --format svg
    #[arg(long, value_enum, default_value_t)]
    pub weight: crate::render::flame::Weight,
}

/// How one command shows its stack report in the formats every report has:
/// its table (after `-r`/`-n` cut the rows), its folded lines, and its
/// flame graph's samples, title and the word for what the bytes are.
pub struct ReportViews<'a> {
    pub kind: Kind,
    pub table: &'a dyn Fn(&Report) -> String,
    pub folded: fn(&Report) -> String,
    pub flame_samples: fn(&Report) -> Vec<flame::Sample>,
    pub title: &'static str,
    pub bytes_word: &'static str,
}

impl<F: OutputFormat> ReportArgs<F> {
    /// Writes `report` to `-o` (or stdout) in `format`: what `record` and
    /// `leaks` do alike once each has ordered and cut its rows. pprof and
    /// svg leave the allocator's frames out unless asked
    /// (`--keep-allocator-frames`).
    pub fn emit(&self, format: Format, mut report: Report, views: ReportViews) -> Result<()> {
        let to = self.output.output();
        let text = match format {
            Format::Table => (views.table)(&report),
            Format::Json => contract::pretty(views.kind, &report),
            Format::Folded => (views.folded)(&report),
            Format::Pprof => {
                self.frames.apply(&mut report);
                let profile = crate::render::pprof::from_report(&report).encode_gzip();
                return crate::output::emit_bytes(&profile, to);
            }
            Format::Svg => {
                self.frames.apply(&mut report);
                flame::titled(
                    &(views.flame_samples)(&report),
                    self.weight,
                    views.title,
                    views.bytes_word,
                )
            }
        };
        crate::output::emit(&text, to)
    }
}
