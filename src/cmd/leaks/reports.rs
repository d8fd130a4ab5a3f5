//! One read of the maps turned into a leaks report, and its JSON file.

use std::path::Path;

use anyhow::Result;

use crate::cgroup::CgroupNames;
use crate::contract::{self, Kind};
use crate::kernel::kmem::Config;
use crate::model::snapshot::Snapshot;
use crate::report::{self, BuildOptions, Report, RunInfo};
use crate::symbolize::KernelSymbols;
use crate::sys::cgroup2_mount;

use super::args::LeaksArgs;

/// Turns one read of the maps into a leaks report: the symbols, the
/// cgroups' paths learned while the run goes on, and the flags that shape
/// the rows. Snapshots and the final report are built alike.
pub(super) struct Reports {
    pub(super) syms: KernelSymbols,
    pub(super) cgroup_names: CgroupNames,
    min_age_ns: u64,
    stack_sample_every: u32,
}

impl Reports {
    pub(super) fn new(args: &LeaksArgs, cfg: &Config) -> Reports {
        Reports {
            syms: KernelSymbols::new(None),
            cgroup_names: CgroupNames::new(cgroup2_mount().ok()),
            min_age_ns: (args.min_age * 1e9) as u64,
            stack_sample_every: cfg.stack_sample_every,
        }
    }

    /// `kind` is "snapshot" or "leaks" (the report's `leaks.kind`).
    pub(super) fn build(
        &mut self,
        snap: &mut Snapshot,
        kind: &str,
        duration_s: f64,
        run: RunInfo,
    ) -> Report {
        if let Some(l) = snap.leaks.as_mut() {
            l.min_age_ns = self.min_age_ns;
            l.kind = kind.to_string();
            l.cap_ages((duration_s * 1e9) as u64);
        }
        let mut report = report::build(
            snap,
            &self.syms,
            BuildOptions {
                stack_sample_every: self.stack_sample_every,
                duration_s,
                run,
            },
        );
        report.name_cgroups(&mut self.cgroup_names);
        report
    }
}

pub(super) fn write_json(r: &Report, path: &Path) -> Result<()> {
    crate::output::write_atomic(path, &contract::pretty(Kind::Leaks, r))
}
