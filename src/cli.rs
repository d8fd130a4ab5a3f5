//! Command-line definitions shared by the subcommands: the argument groups
//! every subcommand flattens (targets and filters, stacks, output), so a
//! flag has one spelling, one meaning and one help text everywhere, and the
//! value parsers behind them.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};

use crate::cgroup::CgroupTarget;
use crate::kernel::attach::AttachMode;
use crate::model::Sources;

/// The processes a run is about: PIDs, and/or a command kheap starts.
#[derive(Args, Debug, Clone, Default)]
pub struct TargetArgs {
    /// Only trace this process (repeatable)
    #[arg(short, long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Leave the command and what it started running when kheap stops
    /// (by default they end with the run)
    #[arg(long)]
    pub keep_running: bool,
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
    #[arg(long, value_parser = parse_comm, value_name = "NAME")]
    pub comm: Option<String>,
    /// Only count allocations made by tasks in this cgroup v2 or below it
    /// (a directory under the cgroup2 mount, or a path relative to it;
    /// repeatable)
    #[arg(long = "cgroup", value_parser = parse_cgroup, value_name = "PATH")]
    pub cgroups: Vec<CgroupTarget>,
    /// Ignore allocations smaller than this (bytes, or with k/M suffix)
    #[arg(long, value_parser = parse_size, default_value = "0", value_name = "N")]
    pub min_size: u64,
    /// Ignore allocations larger than this
    #[arg(long, value_parser = parse_size, value_name = "N")]
    pub max_size: Option<u64>,
    /// How to attach to the kmem tracepoints
    #[arg(long, value_enum, default_value_t = AttachArg::Auto)]
    pub attach: AttachArg,
    /// The kernel's BTF, for a kernel without /sys/kernel/btf/vmlinux: a
    /// file from BTFHub or made by `pahole --btf_encode_detached` from the
    /// kernel's debug vmlinux (refused if it is another kernel's)
    #[arg(long, value_name = "FILE")]
    pub btf: Option<PathBuf>,
}

/// `--attach`: [`AttachMode`] as the command line spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AttachArg {
    /// The cheapest that loads: tp_btf, then raw_tp, then classic
    Auto,
    /// BTF-typed raw tracepoints (cheapest; 6.13+ verifiers accept them)
    Btf,
    /// Untyped raw tracepoints (as cheap; kernel structs read via CO-RE)
    Raw,
    /// Classic tracepoints, record fields read through CO-RE
    Tracepoint,
}

impl From<AttachArg> for AttachMode {
    fn from(a: AttachArg) -> AttachMode {
        match a {
            AttachArg::Auto => AttachMode::Auto,
            AttachArg::Btf => AttachMode::Btf,
            AttachArg::Raw => AttachMode::Raw,
            AttachArg::Tracepoint => AttachMode::Tracepoint,
        }
    }
}

impl Default for FilterArgs {
    fn default() -> Self {
        FilterArgs {
            targets: TargetArgs::default(),
            comm: None,
            cgroups: Vec::new(),
            min_size: 0,
            max_size: None,
            attach: AttachArg::Auto,
            btf: None,
        }
    }
}

impl FilterArgs {
    /// Rejects what clap cannot see: a size range that is empty.
    pub fn check(&self) -> Result<()> {
        if let Some(btf) = &self.btf {
            crate::kernel::features::use_btf_file(btf)?;
        }
        check_size_range(self.min_size, self.max_size)
    }

    /// Whether any filter or target was given (slab traces only then).
    pub fn any(&self) -> bool {
        !self.targets.is_empty()
            || self.comm.is_some()
            || !self.cgroups.is_empty()
            || self.min_size > 0
            || self.max_size.is_some()
            || self.attach != AttachArg::Auto
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
        for c in &self.cgroups {
            f.push(format!("cgroup {}", c.path));
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

/// Stacks of one allocation in this many unless a flag says otherwise
/// (record, top, slab, serve): sites are exact regardless, and a sparse
/// sample names the callers of wrappers. `leaks` samples denser
/// (`cmd::leaks::LEAKS_STACK_SAMPLE`).
pub const DEFAULT_STACK_SAMPLE: u32 = 1024;

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
    /// for leaks; for malloc, 1024 and each row's first call (the stacks
    /// copied to be unwound without frame pointers)
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

/// What every subcommand on the kmem tracer takes (record, leaks, top and
/// slab's traced mode): which allocations, how their stacks are sampled, and
/// how big the maps are.
#[derive(Args, Debug, Clone)]
pub struct TraceArgs {
    /// Stop after this many seconds (default: until Ctrl-C, or until the
    /// command or every -p process ends)
    #[arg(short, long, value_parser = parse_duration, allow_hyphen_values = true, value_name = "SECS")]
    pub duration: Option<Duration>,
    #[command(flatten)]
    pub filters: FilterArgs,
    #[command(flatten)]
    pub stacks: StackArgs,
    /// Capacity of the per-site and per-stack maps
    #[arg(long, value_parser = parse_map_entries, default_value = DEFAULT_MAP_ENTRIES, value_name = "N")]
    pub max_entries: u32,
    /// Kernel memory kheap's maps may take (default: 32M up to 128 CPUs,
    /// 128K more a CPU beyond; leaks 64M, its object store apart)
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub kernel_memory: Option<u64>,
    #[command(flatten)]
    pub source: SourceArgs,
}

impl TraceArgs {
    /// Whether any tracing option was given.
    pub fn any(&self) -> bool {
        self.filters.any() || self.stacks.any() || !self.source.sources.is_default()
    }
}

/// `--source`: which kernel allocators the kmem tracer follows (record,
/// top, leaks, slab's traced mode and serve).
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct SourceArgs {
    /// Kernel allocators to trace: kmalloc (the slab), page, vmalloc,
    /// percpu, comma-separated, or all
    #[arg(long = "source", default_value = "kmalloc", value_name = "LIST")]
    pub sources: Sources,
}

pub use crate::render::OutputFormat;

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
    /// Rows to show (tables default to 20; JSON and folded show all).
    /// The old spellings `-n` and `--top` still work, except `-n` in
    /// `kheap top`, where it is the number of iterations as in top(1)
    #[arg(
        short = 'r',
        long = "rows",
        value_name = "N",
        short_alias = 'n',
        alias = "top"
    )]
    pub rows: Option<usize>,
}

/// The id of `-r/--rows`, for a command that takes `-n` for something
/// else (`kheap top`) and so drops `-n` as its alias.
pub const ROWS_ARG: &str = "rows";

impl<F: OutputFormat> OutputArgs<F> {
    /// Rows to keep per list: `-r`, else 20 in a table and all otherwise.
    pub fn rows(&self) -> Option<usize> {
        match (self.rows, self.format.is_table()) {
            (Some(n), _) => Some(n),
            (None, true) => Some(DEFAULT_TABLE_ROWS),
            (None, false) => None,
        }
    }

    pub fn output(&self) -> Option<&Path> {
        self.output.as_deref()
    }

    /// Checked before tracing: -o can be written, and a file-only format is
    /// not about to be dumped on a terminal.
    pub fn check(&self) -> Result<()> {
        if let Some(path) = self.output() {
            return crate::output::check_writable(path, "-o");
        }
        if self.format.is_file_only() && std::io::stdout().is_terminal() {
            bail!(
                "--format {} writes a file, not text for a terminal: add -o FILE (or pipe it)",
                self.format
                    .to_possible_value()
                    .map_or_else(String::new, |v| v.get_name().to_string())
            );
        }
        Ok(())
    }
}

/// Rows a table shows unless `-r` says otherwise.
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

/// The longest duration or interval kheap accepts: longer ones are typos
/// (`1e19`), and `Instant + Duration` must never overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);
/// The shortest: below a millisecond a wait loop would only spin.
pub const MIN_DURATION: Duration = Duration::from_millis(1);

/// Parses a duration or interval in seconds (fractions allowed), between
/// [`MIN_DURATION`] and [`MAX_DURATION`]. Every `-d`, `-i`, `--watch` and
/// `--snapshot-every` goes through here.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let secs = match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => v,
        _ => return Err(format!("'{s}' is not a positive number of seconds")),
    };
    if secs > MAX_DURATION.as_secs_f64() {
        return Err(format!(
            "'{s}' seconds is too long: at most {} (7 days)",
            MAX_DURATION.as_secs()
        ));
    }
    let d = Duration::from_secs_f64(secs);
    if d < MIN_DURATION {
        return Err(format!("'{s}' seconds is too short: at least 0.001"));
    }
    Ok(d)
}

/// The largest per-site and per-stack map kheap asks for: 2^20 entries is
/// already about a gigabyte of kernel memory for stacks.
pub const MAX_MAP_ENTRIES: u32 = 1 << 20;
/// The largest object map (leaks) or outstanding-block map (malloc).
pub const MAX_TRACKED_OBJECTS: u32 = 1 << 24;

fn parse_capacity(s: &str, max: u32) -> Result<u32, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if (1..=max as u64).contains(&n) => Ok(n as u32),
        _ => Err(format!(
            "'{s}' is not a map size: give a number from 1 to {max}"
        )),
    }
}

/// `--max-entries`' default, for every command that has it.
pub const DEFAULT_MAP_ENTRIES: &str = "8192";
/// `--max-objects`' and `--max-outstanding`'s default.
pub const DEFAULT_TRACKED_OBJECTS: &str = "262144";

/// Parses `--max-entries`: 1 to [`MAX_MAP_ENTRIES`].
pub fn parse_map_entries(s: &str) -> Result<u32, String> {
    parse_capacity(s, MAX_MAP_ENTRIES)
}

/// Parses `--max-objects` and `--max-outstanding`: 1 to [`MAX_TRACKED_OBJECTS`].
pub fn parse_tracked_objects(s: &str) -> Result<u32, String> {
    parse_capacity(s, MAX_TRACKED_OBJECTS)
}

/// The kernel keeps 15 bytes of a task's name (TASK_COMM_LEN - 1).
const COMM_MAX: usize = 15;

/// Parses `--comm`: a task name the kernel can hold, so that the filter can
/// match at all.
pub fn parse_comm(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err(
            "an empty command name matches nothing: give a task name as in 'ps -o comm'".into(),
        );
    }
    if s.chars().any(char::is_control) {
        return Err(format!(
            "{s:?} has a control character (a line end, a tab…): no task name shown by ps has one; give the name as 'ps -o comm' shows it"
        ));
    }
    if s.len() > COMM_MAX {
        return Err(format!(
            "'{s}' is longer than the {COMM_MAX} bytes the kernel keeps of a task name: use '{}'",
            truncate_comm(s)
        ));
    }
    Ok(s.to_string())
}

fn truncate_comm(s: &str) -> &str {
    let mut end = COMM_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A clap error as one line: clap's first line, without its tips (its tip
/// for a negative number, "use '-- -5'", is wrong in kheap, where `--`
/// starts the command to trace) and with where to look instead.
pub fn one_line_error(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    // The message may go on over lines ("required arguments were not
    // provided:" and their names); usage and tips are left out.
    let message: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty() && !l.starts_with("tip:"))
        .collect();
    let joined = message.join(" ");
    let first = joined.strip_prefix("error: ").unwrap_or(&joined);
    let negative = first.contains("unexpected argument '-")
        && first
            .split('\'')
            .nth(1)
            .is_some_and(|a| a.trim_start_matches('-').parse::<f64>().is_ok());
    if negative {
        format!("{first}: negative numbers are not accepted here (see --help)")
    } else {
        format!("{first} (see --help)")
    }
}

/// What `kheap` alone prints: the usage line and a one-line hint naming
/// the commands.
pub fn no_command(cmd: &mut clap::Command) -> String {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .filter(|n| n != "help")
        .collect();
    format!(
        "{}\nkheap: no command given: one of {} (kheap --help says what each does)\n",
        cmd.render_usage(),
        names.join(", ")
    )
}

/// Resolves `--cgroup PATH` against this host's cgroup2 mount (found in
/// /proc/mounts): a bad path is refused before anything is attached.
pub fn parse_cgroup(s: &str) -> Result<CgroupTarget, String> {
    if s.is_empty() {
        return Err(
            "an empty cgroup path: give a directory under the cgroup2 mount or a path relative to it (leave --cgroup out for every cgroup)".into(),
        );
    }
    if s.trim_start_matches('/').is_empty() {
        return Err(format!(
            "{s:?} is the root cgroup, which holds every process: leave --cgroup out to trace them all"
        ));
    }
    let mount = crate::sys::cgroup2_mount().map_err(|e| e.to_string())?;
    crate::cgroup::resolve_target(s, &mount).map_err(|e| e.to_string())
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
mod tests;
