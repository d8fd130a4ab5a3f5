//! `kheap diff BEFORE AFTER`: which sites, stacks or caches grew or shrank
//! between two kheap JSON reports.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::cli::{OutputArgs, TableOrJson};
use crate::contract::{self, Kind};
use crate::diff::{self, DiffBy};
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
    pub output: OutputArgs<TableOrJson>,
}

pub fn run(args: DiffArgs) -> Result<i32> {
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
        TableOrJson::Table => diff::table(
            &d,
            args.by,
            out.rows().unwrap_or(usize::MAX),
            output_width(out.output()),
        ),
        TableOrJson::Json => {
            if let Some(n) = out.rows() {
                d.rows.truncate(n);
            }
            contract::pretty(Kind::Diff, &d)
        }
    };
    emit(&text, out.output())?;
    Ok(0)
}
