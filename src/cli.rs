//! Command-line definitions shared by the subcommands: the argument groups
//! every subcommand flattens (targets and filters, stacks, output), so a
//! flag has one spelling, one meaning and one help text everywhere, and the
//! value parsers behind them.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};

use crate::kernel::attach::AttachMode;

/// The processes a run is about: PIDs, and/or a command kheap starts.
#[derive(Args, Debug, Clone, Default)]
pub struct TargetArgs {
    /// Only trace this process (repeatable)
    #[arg(short, long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Command to run and trace (with its children) until it exits
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

impl TargetArgs {
    pub fn is_empty(&self) -> bool {
        self.pids.is_empty() && self.command.is_empty()
    }

    /// The command line, for the report's header.
    pub fn command_line(&self) -> Option<String> {
        (!self.command.is_empty()).then(|| self.command.join(" "))
    }
}

/// Which kernel allocations count: the targets, then the kernel-side
/// filters (applied in BPF, so they also make tracing cheaper).
#[derive(Args, Debug, Clone)]
pub struct FilterArgs {
    #[command(flatten)]
    pub targets: TargetArgs,
    /// Only count allocations made by tasks with this command name
    #[arg(long, value_name = "NAME")]
    pub comm: Option<String>,
    /// Ignore allocations smaller than this (bytes, or with k/M suffix)
    #[arg(long, value_parser = parse_size, default_value = "0", value_name = "N")]
    pub min_size: u64,
    /// Ignore allocations larger than this
    #[arg(long, value_parser = parse_size, value_name = "N")]
    pub max_size: Option<u64>,
    /// How to attach to the kmem tracepoints
    #[arg(long, value_enum, default_value_t = AttachMode::Auto)]
    pub attach: AttachMode,
}

impl Default for FilterArgs {
    fn default() -> Self {
        FilterArgs {
            targets: TargetArgs::default(),
            comm: None,
            min_size: 0,
            max_size: None,
            attach: AttachMode::Auto,
        }
    }
}

impl FilterArgs {
    /// Rejects what clap cannot see: a size range that is empty.
    pub fn check(&self) -> Result<()> {
        check_size_range(self.min_size, self.max_size)
    }

    /// Whether any filter or target was given (slab traces only then).
    pub fn any(&self) -> bool {
        !self.targets.is_empty()
            || self.comm.is_some()
            || self.min_size > 0
            || self.max_size.is_some()
            || self.attach != AttachMode::Auto
    }

    /// The filters in words, for the report's header.
    pub fn describe(&self) -> Vec<String> {
        let mut f = Vec::new();
        if !self.targets.pids.is_empty() {
            f.push(format!("pid {:?}", self.targets.pids));
        }
        if let Some(c) = self.targets.command.first() {
            f.push(format!("command '{c}' and its children"));
        }
        if let Some(c) = &self.comm {
            f.push(format!("comm {c}"));
        }
        if self.min_size > 0 || self.max_size.is_some() {
            let max = self
                .max_size
                .map(|m| m.to_string())
                .unwrap_or_else(|| "∞".into());
            f.push(format!("size {}..={max}", self.min_size));
        }
        f
    }
}

/// How many allocation stacks to capture: one choice of three, so that
/// conflicting flags are an error rather than a silent pick.
#[derive(Args, Debug, Clone, Default)]
#[group(id = "stacks", multiple = false)]
pub struct StackArgs {
    /// Capture the stack of every allocation (exact per-stack numbers, much costlier)
    #[arg(long)]
    pub exact_stacks: bool,
    /// Capture the stack of about one allocation in N (a power of two; sites
    /// are exact regardless). Default: 1024 for record, top and slab, 256
    /// for leaks
    #[arg(long, value_parser = parse_sample, value_name = "N")]
    pub stack_sample: Option<u32>,
    /// Capture no stacks at all (cheapest; per-site numbers only)
    #[arg(long)]
    pub no_stacks: bool,
}

impl StackArgs {
    /// The sampling period: 1 = every stack, N = about one in N, 0 = none;
    /// `default` when no flag was given (each subcommand has its own).
    pub fn sample_every(&self, default: u32) -> u32 {
        if self.exact_stacks {
            1
        } else if self.no_stacks {
            0
        } else {
            self.stack_sample.unwrap_or(default)
        }
    }

    pub fn any(&self) -> bool {
        self.exact_stacks || self.no_stacks || self.stack_sample.is_some()
    }
}

/// An output format: tables for people, JSON for scripts.
pub trait OutputFormat: ValueEnum + Clone + Copy + Send + Sync + 'static {
    fn is_table(self) -> bool;
}

/// The formats of reports that have no stacks to fold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TableOrJson {
    Table,
    Json,
}

impl OutputFormat for TableOrJson {
    fn is_table(self) -> bool {
        self == TableOrJson::Table
    }
}

impl OutputFormat for crate::render::Format {
    fn is_table(self) -> bool {
        self == crate::render::Format::Table
    }
}

/// Where a report goes and how much of it: the same three flags on every
/// subcommand that prints one.
#[derive(Args, Debug, Clone)]
pub struct OutputArgs<F: OutputFormat> {
    /// Output format (the JSON is described in docs/json.md)
    #[arg(long, value_enum, default_value = "table")]
    pub format: F,
    /// Write the report to FILE instead of stdout
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Rows to show (tables default to 20; JSON and folded show all)
    #[arg(short = 'n', long = "top", value_name = "N")]
    pub top: Option<usize>,
}

impl<F: OutputFormat> OutputArgs<F> {
    /// Rows to keep per list: `-n`, else 20 in a table and all otherwise.
    pub fn rows(&self) -> Option<usize> {
        match (self.top, self.format.is_table()) {
            (Some(n), _) => Some(n),
            (None, true) => Some(DEFAULT_TABLE_ROWS),
            (None, false) => None,
        }
    }

    pub fn output(&self) -> Option<&Path> {
        self.output.as_deref()
    }
}

/// Rows a table shows unless `-n` says otherwise.
pub const DEFAULT_TABLE_ROWS: usize = 20;

/// Parses a byte size: `4096`, `4k`, `2M` (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let mult = match c.to_ascii_lowercase() {
                'k' => 1u64 << 10,
                'm' => 1 << 20,
                'g' => 1 << 30,
                _ => return Err(format!("'{s}' is not a size: use bytes, or a k/M/G suffix")),
            };
            (&t[..i], mult)
        }
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("'{s}' is not a size: use bytes, or a k/M/G suffix"))
}

/// Parses a positive duration in seconds (fractions allowed).
pub fn parse_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not a positive number of seconds")),
    }
}

pub fn check_size_range(min: u64, max: Option<u64>) -> Result<()> {
    if let Some(max) = max {
        if min > max {
            bail!("bad size range: --min-size {min} is larger than --max-size {max}");
        }
    }
    Ok(())
}

/// Parses a stack sampling period: a power of two (1 = every event).
pub fn parse_sample(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if n.is_power_of_two() => Ok(n),
        _ => Err(format!("'{s}' is not a power of two (1, 2, 4, … 65536)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("2M"), Ok(2 << 20));
        assert!(parse_size("12q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("-1").is_err());
    }

    #[test]
    fn ranges_and_periods() {
        assert!(check_size_range(10, Some(5))
            .unwrap_err()
            .to_string()
            .contains("bad size range"));
        assert!(check_size_range(10, None).is_ok());
        assert_eq!(parse_sample("64"), Ok(64));
        assert!(parse_sample("48").is_err());
        assert!(parse_secs("0").is_err());
        assert_eq!(parse_secs("1.5"), Ok(1.5));
    }
}
