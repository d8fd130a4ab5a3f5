//! `kheap diff BEFORE AFTER`: which sites, stacks or caches grew or shrank
//! between two kheap JSON reports.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};

use crate::diff::{self, DiffBy};
use crate::render::table::output_width;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DiffFormat {
    Table,
    Json,
}

#[derive(Args, Debug)]
pub struct DiffArgs {
    /// The earlier report (JSON from kheap record/leaks, or a snapshot)
    pub before: PathBuf,
    /// The later report
    pub after: PathBuf,
    /// Compare per
    #[arg(long, value_enum, default_value_t = DiffBy::Site)]
    pub by: DiffBy,
    /// Rows to show in the table
    #[arg(short = 'n', long = "top", default_value = "20", value_name = "N")]
    pub top: usize,
    #[arg(long, value_enum, default_value_t = DiffFormat::Table)]
    pub format: DiffFormat,
}

pub fn run(args: DiffArgs) -> Result<i32> {
    let read = |p: &PathBuf| -> Result<_> {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        diff::parse_report(&text, &p.display().to_string())
    };
    let (before, after) = (read(&args.before)?, read(&args.after)?);
    let d = diff::diff(&before, &after, args.by);
    let text = match args.format {
        DiffFormat::Table => diff::table(&d, args.by, args.top, output_width(None)),
        DiffFormat::Json => serde_json::to_string_pretty(&d)? + "\n",
    };
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(0)
}
