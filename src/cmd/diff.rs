//! `kheap diff BEFORE AFTER`: which sites, stacks or caches grew or shrank
//! between two kheap JSON reports.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::cli::OutputArgs;
use crate::contract::{self, Kind};
use crate::diff::{self, DiffBy, DiffFormat, Measure};
use crate::output::emit;
use crate::render::flame::{Sample, Weight};
use crate::render::table::output_width;
use crate::report::Report;

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
    /// What sizes (and colours) the frames of --format svg
    #[arg(long, value_enum, default_value_t)]
    pub weight: Weight,
}

pub fn run(args: DiffArgs) -> Result<i32> {
    args.output.check()?;
    if args.output.format == DiffFormat::Pprof {
        crate::output::check_binary_destination(args.output.output(), "pprof")?;
    }
    let read = |p: &PathBuf| crate::input::read_bounded(p, "report", crate::input::MAX_INPUT);
    let (before, after) = (read(&args.before)?, read(&args.after)?);
    let (kind, before, after) = diff::parse_pair(
        (&before, &args.before.display().to_string()),
        (&after, &args.after.display().to_string()),
    )?;
    let out = &args.output;
    if out.format == DiffFormat::Svg {
        let samples = differential(
            &stack_samples(kind, &before),
            &stack_samples(kind, &after),
            args.weight,
        );
        let word = match Measure::of(kind) {
            Some(Measure::Outstanding) => "outstanding",
            _ => "allocated",
        };
        let title = format!(
            "kheap diff {} {}",
            args.before.display(),
            args.after.display()
        );
        emit(
            &crate::cmd::record::flame_svg(&samples, args.weight, &title, word),
            out.output(),
        )?;
        return Ok(0);
    }
    let mut d = diff::diff(kind, &before, &after, args.by);
    let text = match out.format {
        DiffFormat::Svg => unreachable!("drawn above"),
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

/// The stacks a report folds: all allocations of a record, the outstanding
/// objects of leaks.
fn stack_samples(kind: Kind, r: &Report) -> Vec<Sample> {
    match Measure::of(kind) {
        Some(Measure::Outstanding) => crate::leaks::render::flame_samples(r),
        _ => crate::render::flame_samples(r),
    }
}

/// AFTER's stacks, each carrying BEFORE's weight of the same frames. Stacks
/// only BEFORE had have no width in AFTER and are left out (the table and
/// JSON of `--by stack` list them).
fn differential(before: &[Sample], after: &[Sample], w: Weight) -> Vec<Sample> {
    let weight = |s: &Sample| match w {
        Weight::Bytes => s.bytes,
        Weight::Count => s.count,
        Weight::Waste => s.waste,
    };
    let mut earlier: std::collections::HashMap<&[String], u64> = Default::default();
    for s in before {
        *earlier.entry(&s.frames).or_default() += weight(s);
    }
    after
        .iter()
        .map(|s| Sample {
            before: Some(earlier.get(s.frames.as_slice()).copied().unwrap_or(0)),
            ..s.clone()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(frames: &[&str], bytes: u64) -> Sample {
        Sample {
            frames: frames.iter().map(|f| f.to_string()).collect(),
            count: 1,
            bytes,
            ..Sample::default()
        }
    }

    #[test]
    fn after_stacks_carry_the_before_weight_of_the_same_frames() {
        let d = differential(
            &[s(&["a", "k"], 100), s(&["gone"], 7)],
            &[s(&["a", "k"], 300), s(&["new"], 5)],
            Weight::Bytes,
        );
        let before: Vec<_> = d.iter().map(|s| (s.frames.join(";"), s.before)).collect();
        assert_eq!(before, [("a;k".into(), Some(100)), ("new".into(), Some(0))]);
    }
}
