//! The attached programs' run time, run count and recursion misses.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};

use anyhow::{bail, Result};
use libbpf_rs::query::{ProgInfoIter, ProgInfoQueryOptions};
use libbpf_rs::Program;

use crate::model::snapshot::ProgRunTime;

use super::tracer::Tracer;

impl<'obj> Tracer<'obj> {
    /// Per attached program (by its tracepoint): run time, run count and recursion misses (events
    /// the kernel skipped because a BPF program was already running on the
    /// CPU), from the kernel's program info. Run time and count only advance
    /// while BPF run-time statistics are enabled (`enable_run_time_stats`).
    pub fn program_stats(&self) -> Vec<(String, ProgRunTime)> {
        let ours: Vec<(u32, &str)> = self
            .programs
            .iter()
            .filter_map(|(tp, name)| {
                let id = Program::id_from_fd(self.program_named(name)?.as_fd()).ok()?;
                Some((id, *tp))
            })
            .collect();
        let mut out: Vec<(String, ProgRunTime)> =
            ProgInfoIter::with_query_opts(ProgInfoQueryOptions::default())
                .filter_map(|info| {
                    let (_, tp) = ours.iter().find(|(id, _)| *id == info.id)?;
                    Some((
                        tp.to_string(),
                        ProgRunTime {
                            run_time_ns: info.run_time_ns,
                            run_cnt: info.run_cnt,
                            recursion_misses: info.recursion_misses,
                        },
                    ))
                })
                .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The attached programs' run time, run count and recursion misses,
    /// summed.
    pub fn run_time(&self) -> ProgRunTime {
        let mut total = ProgRunTime::default();
        for (_, s) in self.program_stats() {
            total.run_time_ns += s.run_time_ns;
            total.run_cnt += s.run_cnt;
            total.recursion_misses += s.recursion_misses;
        }
        total
    }
}

/// Turns on the kernel's BPF run-time statistics (run_time_ns, run_cnt per
/// program) for as long as the returned descriptor is open. They cost a
/// little on every program run, so they are enabled only while needed.
pub fn enable_run_time_stats() -> Result<OwnedFd> {
    let fd = unsafe { libbpf_sys::bpf_enable_stats(libbpf_sys::BPF_STATS_RUN_TIME) };
    if fd < 0 {
        bail!(
            "enabling BPF run-time statistics: {}",
            std::io::Error::from_raw_os_error(-fd)
        );
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
