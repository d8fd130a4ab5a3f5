//! `kheap diff BEFORE AFTER`: which sites, stacks or caches grew or shrank
//! between two kheap JSON reports.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::cli::OutputArgs;
use crate::contract::{self, Kind};
use crate::diff::{self, DiffBy, DiffFormat};
use crate::output::emit;
use crate::render::table::output_width;

#[derive(Args, Debug)]
pub struct DiffArgs {
    /// The earlier report (JSON from kheap record or leaks, or a leaks snapshot)
    pub before: PathBuf,
    /// The later report, of the same kind
    pub after: PathBuf,
    /// Compare per
    #[arg(long, value_enum, default_value_t = DiffBy::Site)]
    pub by: DiffBy,
    #[command(flatten)]
    pub output: OutputArgs<DiffFormat>,
}

pub fn run(args: DiffArgs) -> Result<i32> {
    if args.output.format == DiffFormat::Pprof {
        crate::output::check_binary_destination(args.output.output(), "pprof")?;
    }
    let read = |p: &PathBuf| -> Result<String> {
        std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
    };
    let (before, after) = (read(&args.before)?, read(&args.after)?);
    let (kind, before, after) = diff::parse_pair(
        (&before, &args.before.display().to_string()),
        (&after, &args.after.display().to_string()),
    )?;
    let mut d = diff::diff(kind, &before, &after, args.by);
    let out = &args.output;
    let text = match out.format {
        DiffFormat::Table => diff::table(
            &d,
            args.by,
            out.rows().unwrap_or(usize::MAX),
            output_width(out.output()),
        ),
        DiffFormat::Json => {
            if let Some(n) = out.rows() {
                d.rows.truncate(n);
            }
            contract::pretty(Kind::Diff, &d)
        }
        DiffFormat::Pprof => {
            let profile = crate::render::pprof::from_diff(&d).encode_gzip();
            crate::output::emit_bytes(&profile, out.output())?;
            return Ok(0);
        }
    };
    emit(&text, out.output())?;
    Ok(0)
}
