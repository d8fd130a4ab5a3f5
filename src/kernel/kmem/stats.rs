//! The attached programs' run time, run count and recursion misses.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use anyhow::{bail, Result};

use crate::model::snapshot::ProgRunTime;

use super::tracer::Tracer;

/// One attached program's counters, from the kernel's program info.
pub(super) struct ProgramCounters {
    /// The tracepoint it is attached to.
    pub tracepoint: &'static str,
    pub run: ProgRunTime,
    /// Runs the kernel skipped because a program was already running on
    /// that CPU (events that reached no map).
    pub recursion_misses: u64,
}

impl<'obj> Tracer<'obj> {
    /// Per attached program, sorted by tracepoint: run time and count (they
    /// only advance while BPF run-time statistics are enabled:
    /// `enable_run_time_stats`) and recursion misses. One
    /// `BPF_OBJ_GET_INFO_BY_FD` per program of ours, not a walk of every
    /// program on the machine. A program attached to two tracepoints (a
    /// raw_tp on kmalloc and kmalloc_node, before 6.1) has one set of
    /// counters: it is listed once, under the first.
    pub(super) fn program_counters(&self) -> Vec<ProgramCounters> {
        let mut seen = std::collections::HashSet::new();
        let mut out: Vec<ProgramCounters> = self
            .programs
            .iter()
            .filter(|(_, name)| seen.insert(name.as_str()))
            .filter_map(|(tp, name)| {
                let info = program_info(self.program_named(name)?.as_fd())?;
                Some(ProgramCounters {
                    tracepoint: tp,
                    run: ProgRunTime {
                        run_time_ns: info.run_time_ns,
                        run_cnt: info.run_cnt,
                    },
                    recursion_misses: info.recursion_misses,
                })
            })
            .collect();
        out.sort_by_key(|p| p.tracepoint);
        out
    }
}

/// The kernel's info of one program (the fixed part only: no instruction,
/// map or line arrays are asked for).
fn program_info(fd: std::os::fd::BorrowedFd<'_>) -> Option<libbpf_sys::bpf_prog_info> {
    let mut info = libbpf_sys::bpf_prog_info::default();
    let mut len = std::mem::size_of_val(&info) as u32;
    // SAFETY: `info` is a bpf_prog_info of `len` bytes that the kernel
    // fills; every pointer field in it is 0, so nothing else is written.
    let ret = unsafe {
        libbpf_sys::bpf_obj_get_info_by_fd(
            fd.as_raw_fd(),
            (&mut info as *mut libbpf_sys::bpf_prog_info).cast(),
            &mut len,
        )
    };
    (ret == 0).then_some(info)
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
