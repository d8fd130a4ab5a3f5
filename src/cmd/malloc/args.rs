//! `kheap malloc`'s arguments.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::cli::{parse_duration, parse_tracked_objects, OutputArgs, StackArgs, TargetArgs};
use crate::malloc::render::{MallocGroupBy, MallocSortBy};
use crate::render::Format;
use crate::report::budget::{self, Budget};

#[derive(Args, Debug)]
pub struct MallocArgs {
    /// Stop after this many seconds (default: until Ctrl-C, or until the
    /// command or the processes end)
    #[arg(short, long, value_parser = parse_duration, allow_hyphen_values = true, value_name = "SECS")]
    pub duration: Option<Duration>,
    // The processes to trace (with the children they fork from now on).
    // The kernel-side filters of the other subcommands (--comm, sizes,
    // --attach) have no counterpart here: the probes are in user space.
    #[command(flatten)]
    pub targets: TargetArgs,
    /// The kernel's BTF, for a kernel without /sys/kernel/btf/vmlinux (as
    /// for record)
    #[arg(long, value_name = "FILE")]
    pub btf: Option<std::path::PathBuf>,
    /// Trace the processes in this cgroup v2 and below it, and count only
    /// allocations made there (repeatable; a directory under the cgroup2
    /// mount, or a path relative to it)
    #[arg(long = "cgroup", value_name = "PATH")]
    pub cgroups: Vec<String>,
    // Every call's stack is walked by frame pointers; these say which
    // calls also send a copy of their stack to be unwound from .eh_frame
    // (code without frame pointers).
    #[command(flatten)]
    pub stacks: StackArgs,
    #[command(flatten)]
    pub output: OutputArgs<Format>,
    #[command(flatten)]
    pub json: crate::session::args::JsonCopy,
    /// What sizes the frames of --format svg
    #[arg(long, value_enum, default_value_t)]
    pub weight: crate::render::flame::Weight,
    /// Probe this allocator library instead of the C library the target
    /// maps (jemalloc, tcmalloc, mimalloc export the same names)
    #[arg(long, value_name = "PATH")]
    pub lib: Option<PathBuf>,
    /// Group rows by direct caller (site) or by whole user stack
    #[arg(long, value_enum, default_value_t = MallocGroupBy::Site)]
    pub by: MallocGroupBy,
    /// Order rows by
    #[arg(long, value_enum, default_value_t = MallocSortBy::Bytes)]
    pub sort: MallocSortBy,
    /// Track every block to its free: report what is still allocated at the
    /// end, per site and stack (adds a return probe to each call)
    #[arg(long)]
    pub outstanding: bool,
    /// With --outstanding: how many live blocks can be tracked at once
    /// (about 60 bytes of kernel memory each, taken when the run starts; more
    /// than a quarter of MemAvailable is refused; blocks beyond are counted
    /// as not tracked)
    #[arg(
        long,
        value_parser = parse_tracked_objects,
        default_value = crate::cli::DEFAULT_TRACKED_OBJECTS,
        value_name = "N",
        requires = "outstanding"
    )]
    pub max_outstanding: u32,
    /// Exit with status 3 (and list the rows) when the command allocates or leaves more than BUDGET: 'outstanding > 1M' (needs --outstanding), 'allocated{site=parse*} > 10M' (repeatable)
    #[arg(long, value_parser = parse_budget, value_name = "BUDGET")]
    pub fail_if: Vec<Budget>,
    /// With -- COMMAND: probe the C library's functions instead of running
    /// the command with kheap's preload library (which costs less per call,
    /// but does not reach static or set-user-ID programs it starts)
    #[arg(long)]
    pub no_preload: bool,
    /// Put every probe on its function's first instruction, even where the
    /// kernel must single-step it (for scripts/bench-malloc)
    #[arg(long, hide = true)]
    pub probes_at_entry: bool,
}

fn parse_budget(s: &str) -> Result<Budget, String> {
    budget::parse(s, false)
}
