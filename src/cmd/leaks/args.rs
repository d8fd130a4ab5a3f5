//! `kheap leaks`'s arguments.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Args;

use crate::cli::{parse_duration, parse_sample, parse_tracked_objects};
use crate::leaks::render::{LeakGroupBy, LeaksFormat};
use crate::report::budget::{self, Budget};
use crate::report::trigger::{self, Trigger};
use crate::session::args::ReportArgs;

#[derive(Args, Debug)]
pub struct LeaksArgs {
    #[command(flatten)]
    pub report: ReportArgs<LeaksFormat>,
    /// Only count objects at least this old as outstanding
    #[arg(long, value_parser = parse_age, default_value = "0", value_name = "SECS")]
    pub min_age: f64,
    /// Group rows by
    #[arg(long, value_enum, default_value_t = LeakGroupBy::Site)]
    pub by: LeakGroupBy,
    /// Write a JSON snapshot of what is outstanding every SECS seconds (also on SIGUSR1)
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true, value_name = "SECS")]
    pub snapshot_every: Option<Duration>,
    /// Where snapshots go (snapshot-001.json, …; default: the current directory)
    #[arg(long, value_name = "DIR")]
    pub snapshot_dir: Option<PathBuf>,
    /// Track about one object in N, chosen by a hash of its address (a power of two); totals become estimates
    #[arg(long, value_parser = parse_sample, default_value = "1", value_name = "N")]
    pub sample: u32,
    /// Capacity of the object store (objects tracked at once; about 80 bytes of kernel memory each, 120 before 5.12)
    #[arg(long, value_parser = parse_tracked_objects, default_value = crate::cli::DEFAULT_TRACKED_OBJECTS, value_name = "N")]
    pub max_objects: u32,
    /// Read the timeline (outstanding bytes of the top sites, /proc/meminfo) every SECS seconds
    #[arg(long, value_parser = parse_interval, default_value = "1", value_name = "SECS")]
    pub interval: Duration,
    /// Sites the timeline keeps at each reading (the rest is "other")
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=100), default_value = "10", value_name = "N")]
    pub timeline_sites: u16,
    /// Write a snapshot (JSON; also pprof with --format pprof) into --snapshot-dir when COND holds at a reading: sunreclaim+=N, site:PATTERN+=N or oom (repeatable)
    #[arg(long, value_parser = trigger::parse, value_name = "COND")]
    pub snapshot_when: Vec<Trigger>,
    /// Exit with status 3 (and list the rows) when the run leaves more than BUDGET: 'outstanding > 1M', 'allocated[page] > 10M', 'outstanding{site=load_msg*} > 0' (repeatable; docs/design.md)
    #[arg(long, value_parser = parse_budget, value_name = "BUDGET")]
    pub fail_if: Vec<Budget>,
}

fn parse_budget(s: &str) -> Result<Budget, String> {
    budget::parse(s, true)
}

/// The timeline's interval: a reading walks the whole object map, so not
/// more often than ten times a second.
fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(100) {
        return Err(format!("'{s}': the interval must be at least 0.1 seconds"));
    }
    Ok(d)
}

/// `--min-age`: 0 or more seconds, capped like every other duration
/// (crate::cli::MAX_DURATION).
fn parse_age(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > crate::cli::MAX_DURATION.as_secs_f64() => Err(format!(
            "'{s}' seconds is too long: at most {} (7 days)",
            crate::cli::MAX_DURATION.as_secs()
        )),
        Ok(v) if v >= 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not a number of seconds")),
    }
}
