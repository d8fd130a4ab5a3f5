//! `kheap slab`'s arguments: which mode a run is (static, sampled, watched
//! or traced) and where it reads the static picture from.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};

use crate::cli::{OutputArgs, TableOrJson, TraceArgs};
use crate::slab::{read_static, SortKey, StaticSnapshot};
use crate::sys::slab_sysfs::SYS_KERNEL_SLAB;
use crate::sys::slabinfo::PROC_SLABINFO;

/// `--sort`: [`SortKey`] as the command line spells it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SortArg {
    /// Slab memory.
    #[default]
    Size,
    /// Active objects.
    Objs,
    /// Rounding waste when traced, slab loss otherwise.
    Waste,
    /// Growth: traced, what the run allocated and still holds at its end (every object tracked, exact per site; the top grower is named), or the change in slab memory between reads.
    Growth,
    /// Allocations per second (needs tracing).
    Rate,
}

impl From<SortArg> for SortKey {
    fn from(a: SortArg) -> SortKey {
        match a {
            SortArg::Size => SortKey::Size,
            SortArg::Objs => SortKey::Objs,
            SortArg::Waste => SortKey::Waste,
            SortArg::Growth => SortKey::Growth,
            SortArg::Rate => SortKey::Rate,
        }
    }
}

/// Which slab caches hold memory, how fast they grow, and what they waste.
#[derive(Clone, Debug, clap::Args)]
pub struct SlabArgs {
    // Traced mode (with -d, -p, -- CMD or any filter): who allocates into
    // each cache and what rounding wastes.
    #[command(flatten)]
    pub trace: TraceArgs,
    #[command(flatten)]
    pub output: OutputArgs<TableOrJson>,
    /// Order of the rows
    #[arg(long, value_enum, default_value_t = SortArg::Size)]
    pub sort: SortArg,
    /// Re-read every SECS seconds and show per-cache changes, like slabtop
    /// with deltas (until interrupted, or for -d SECS)
    #[arg(long, value_parser = crate::cli::parse_duration, allow_hyphen_values = true, value_name = "SECS")]
    pub watch: Option<Duration>,
    /// With -d, only sample /proc/slabinfo; don't trace allocations
    #[arg(long)]
    pub no_trace: bool,
    /// Read this file instead of /proc/slabinfo (for tests and captures)
    #[arg(long, hide = true, default_value = PROC_SLABINFO)]
    pub slabinfo_path: PathBuf,
    /// Read this directory instead of /sys/kernel/slab
    #[arg(long, hide = true, default_value = SYS_KERNEL_SLAB)]
    pub sysfs_path: PathBuf,
}

impl SlabArgs {
    /// Whether this run traces allocations: any tracing option says so,
    /// -d alone too unless --no-trace; --watch never does.
    pub fn traced(&self) -> Result<bool> {
        let tracing_options = self.trace.any();
        if tracing_options && (self.watch.is_some() || self.no_trace) {
            let with = if self.no_trace {
                "--no-trace"
            } else {
                "--watch"
            };
            bail!("-p, -- CMD, --comm, --min-size, --max-size, --attach and the stack options select traced allocations: they don't go with {with}");
        }
        let traced = (tracing_options || self.trace.duration.is_some())
            && self.watch.is_none()
            && !self.no_trace;
        if !traced && self.sort == SortArg::Rate {
            bail!("--sort rate needs traced allocations: add -d SECS, -p PID or -- CMD (without --no-trace or --watch)");
        }
        Ok(traced)
    }

    /// One static read from the configured sources.
    pub fn read_static(&self) -> Result<StaticSnapshot> {
        read_static(&self.slabinfo_path, &self.sysfs_path)
    }
}
