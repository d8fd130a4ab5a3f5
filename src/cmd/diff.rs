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
    #[command(flatten)]
    pub frames: crate::session::args::FrameArgs,
}

pub fn run(args: DiffArgs) -> Result<i32> {
    args.output.check()?;
    if args.output.format == DiffFormat::Pprof {
        crate::output::check_binary_destination(args.output.output(), "pprof")?;
    }
    let read = |p: &PathBuf| {
        let p = p.clone();
        move || crate::input::read_bounded(&p, "report", crate::input::MAX_INPUT)
    };
    let (kind, mut before, mut after) = diff::parse_pair(
        (read(&args.before), &args.before.display().to_string()),
        (read(&args.after), &args.after.display().to_string()),
    )?;
    let out = &args.output;
    if matches!(out.format, DiffFormat::Svg | DiffFormat::Pprof) {
        args.frames.apply(&mut before);
        args.frames.apply(&mut after);
    }
    if out.format == DiffFormat::Svg {
        // Each side's stacks, and what of its total no stack holds: the
        // root is the later report's total, its BEFORE the earlier one's.
        let whole = |r: &Report| {
            let mut samples = stack_samples(kind, r);
            samples.extend(crate::render::flame::remainder(&samples, &totals(kind, r)));
            samples
        };
        let samples = differential(&whole(&before), &whole(&after), args.weight);
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
            &crate::render::flame::titled(&samples, args.weight, &title, word),
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
            let profile = crate::diff::pprof(&d).encode_gzip();
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
        Some(Measure::Outstanding) => crate::render::outstanding_flame_samples(r),
        _ => crate::render::flame_samples(r),
    }
}

/// A report's totals in the measure its graph draws: all allocations of a
/// record, the outstanding objects of leaks.
fn totals(kind: Kind, r: &Report) -> Sample {
    match Measure::of(kind) {
        Some(Measure::Outstanding) => {
            let ret = r
                .leaks
                .as_ref()
                .map(|l| l.retention.clone())
                .unwrap_or_default();
            Sample {
                count: ret.outstanding_count,
                bytes: ret.outstanding_bytes,
                waste: ret
                    .outstanding_bytes
                    .saturating_sub(ret.outstanding_bytes_req),
                ..Sample::default()
            }
        }
        _ => Sample {
            count: r.totals.allocs,
            bytes: r.totals.bytes_alloc,
            waste: r.totals.waste_bytes,
            ..Sample::default()
        },
    }
}

/// AFTER's stacks, each carrying BEFORE's weight of the same frames (once:
/// on the first of AFTER's samples with those frames). Stacks only BEFORE
/// had come last, with no width, so that every frame's BEFORE, and the
/// root's, is the earlier run's.
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
    let mut out: Vec<Sample> = after
        .iter()
        .map(|s| Sample {
            before: Some(earlier.remove(s.frames.as_slice()).unwrap_or(0)),
            ..s.clone()
        })
        .collect();
    let mut gone: Vec<(&[String], u64)> = earlier.into_iter().collect();
    gone.sort();
    out.extend(gone.into_iter().map(|(frames, was)| Sample {
        frames: frames.to_vec(),
        before: Some(was),
        ..Sample::default()
    }));
    out
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
        assert_eq!(
            before,
            [
                ("a;k".into(), Some(100)),
                ("new".into(), Some(0)),
                ("gone".into(), Some(7))
            ]
        );
        assert_eq!(d[2].bytes, 0, "no width in AFTER");
        // Two of AFTER's samples with the same frames: BEFORE counts once.
        let d = differential(
            &[s(&["a"], 100)],
            &[s(&["a"], 30), s(&["a"], 40)],
            Weight::Bytes,
        );
        let total: u64 = d.iter().filter_map(|s| s.before).sum();
        assert_eq!(total, 100);
    }
}
