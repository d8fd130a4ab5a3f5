//! What every tracing subcommand does around its tracer: the stop handler
//! (Ctrl-C, SIGTERM, SIGHUP end the run, the report is still printed), the
//! processes a run is about, the wait for its end, the kmem settings
//! they share and the end of a kmem run (detach, the last read of the
//! maps); the live status line (`status`) and the flags every
//! report-writing subcommand shares (`args`). Used by the commands in
//! `cmd`, never by one another's code.

pub mod args;
pub mod status;

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::cgroup::CgroupNames;
use crate::cli::{FilterArgs, TargetArgs, TraceArgs};
use crate::kernel::features;
use crate::kernel::kmem::{Config, Tracer};
use crate::model::snapshot::Snapshot;
use crate::report::RunInfo;
use crate::target::{resolve_pid, HeldCommand};

pub use crate::signals::{install_stop_handler, stop_requested};

/// The processes a run is about: validated PIDs and, with `-- CMD`, the
/// held command.
pub struct Targets {
    pub pids: Vec<u32>,
    /// The processes given with -p: the run ends when all have exited.
    pub user_pids: Vec<u32>,
    pub command: Option<HeldCommand>,
}

impl Targets {
    /// Validates the PIDs and starts the command, held until `release`.
    pub fn start(t: &TargetArgs) -> Result<Targets> {
        let mut pids = Vec::new();
        for &p in &t.pids {
            pids.push(resolve_pid(p)?);
        }
        let user_pids = pids.clone();
        let command = if t.command.is_empty() {
            None
        } else {
            let mut held = HeldCommand::spawn(&t.command)?;
            if t.keep_running {
                held.keep_running();
            }
            pids.push(held.pid);
            Some(held)
        };
        Ok(Targets {
            pids,
            user_pids,
            command,
        })
    }

    /// Lets the held command exec, once the tracer is attached.
    pub fn release(&mut self) -> Result<()> {
        match self.command.as_mut() {
            Some(cmd) => cmd.release(),
            None => Ok(()),
        }
    }

    /// Ends the command (and what it started) if it still runs.
    pub fn terminate(&mut self) {
        if let Some(cmd) = self.command.as_mut() {
            cmd.terminate();
        }
    }

    /// The command's exit status, once it has exited.
    pub fn command_exited(&mut self) -> Option<i32> {
        self.command.as_mut().and_then(|c| c.try_wait())
    }
}

/// Rows counted for the command's PID before its exec carry kheap's own
/// name (it was a fork of kheap then): name them after the command.
pub fn name_command_process(snap: &mut Snapshot, command: &HeldCommand) {
    let process_row = snap.procs.get_mut(&Some(command.pid)).map(|(comm, _)| comm);
    for comm in process_row
        .into_iter()
        .chain(snap.comms.get_mut(&command.pid))
    {
        if comm == "kheap" {
            *comm = command.name_after_exec.clone();
        }
    }
}

/// Why a recording ended.
pub enum Ended {
    Duration,
    Signal,
    CommandExited(i32),
    /// Every process given with -p exited.
    PidsExited,
}

impl Ended {
    /// Says why the run ended when that is news, and returns kheap's exit
    /// status: the command's, when it failed.
    pub fn report(&self) -> i32 {
        match self {
            Ended::CommandExited(code) if *code != 0 => {
                eprintln!("kheap: the command exited with status {code}");
                *code
            }
            Ended::Signal => {
                eprintln!("kheap: stopped by signal; reporting what was recorded");
                0
            }
            Ended::PidsExited => {
                eprintln!("kheap: every traced process (-p) exited; reporting what was recorded");
                0
            }
            _ => 0,
        }
    }
}

/// Waits until the duration passes, the command or every -p process exits
/// or a signal arrives, calling `tick` about once a second.
pub fn wait_for_end(
    duration: Option<Duration>,
    targets: &mut Targets,
    tick: impl FnMut(Duration),
) -> Ended {
    wait_for_end_every(duration, targets, Duration::from_secs(1), tick)
}

/// [`wait_for_end`], calling `tick` about every `period` (checked every
/// 20 ms, so periods below that are 20 ms).
pub fn wait_for_end_every(
    duration: Option<Duration>,
    targets: &mut Targets,
    period: Duration,
    mut tick: impl FnMut(Duration),
) -> Ended {
    let start = Instant::now();
    let mut next_tick = period;
    loop {
        if stop_requested() {
            return Ended::Signal;
        }
        if let Some(code) = targets.command_exited() {
            return Ended::CommandExited(code);
        }
        if targets.command.is_none() && crate::tree::all_exited(&targets.user_pids) {
            return Ended::PidsExited;
        }
        let elapsed = start.elapsed();
        if duration.is_some_and(|d| elapsed >= d) {
            return Ended::Duration;
        }
        if elapsed >= next_tick {
            tick(elapsed);
            // A tick slower than the period skips the readings it missed
            // rather than running back to back.
            while next_tick <= start.elapsed() {
                next_tick += period;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The kmem tracer's settings every subcommand shares: what the filters,
/// stack flags and map size say (stacks sampled 1 in `default_sample`
/// unless a flag says otherwise); each subcommand adds its own on top.
pub fn kmem_config(t: &TraceArgs, targets: &Targets, default_sample: u32) -> Config {
    let f = &t.filters;
    Config {
        min_size: f.min_size,
        max_size: f.max_size,
        pids: targets.pids.clone(),
        follow_children: targets.command.is_some(),
        comm: f.comm.clone(),
        cgroups: f.cgroups.iter().map(|c| c.id).collect(),
        attach: f.attach.into(),
        stack_sample_every: t.stacks.sample_every(default_sample),
        max_sites: t.max_entries,
        max_stacks: t.max_entries,
        kernel_memory: t.kernel_memory,
        sources: t.source.sources,
        ..Config::default()
    }
}

/// Says on stderr what is traced, with how, and (when nothing else ends the
/// run) how to stop it; then lets a held command run.
pub fn start_tracing(
    what: &str,
    attached: &[String],
    duration: Option<Duration>,
    targets: &mut Targets,
    how_to_stop: &str,
) -> Result<()> {
    let ends_by_itself = duration.is_some() || targets.command.is_some();
    eprintln!(
        "kheap: tracing {what} ({}){}",
        attached.join(", "),
        if ends_by_itself { "" } else { how_to_stop }
    );
    targets.release()
}

/// Learns the paths of the cgroups the maps name so far, on a run's tick:
/// a cgroup removed before the end keeps the path it had. A failed read
/// waits for the next tick.
pub fn learn_cgroups(names: &mut CgroupNames, tracer: &Tracer) {
    if let Ok(ids) = tracer.cgroup_ids() {
        names.learn(ids);
    }
}

/// Ends the tracing: detaches the tracer and learns the cgroups' paths a
/// last time, before the command's own cgroup is removed with it
/// ([`Targets::terminate`]). Returns the seconds traced since `start`.
pub fn stop_tracing(tracer: &mut Tracer, names: &mut CgroupNames, start: Instant) -> Result<f64> {
    let duration_s = start.elapsed().as_secs_f64();
    tracer.detach();
    names.learn(tracer.cgroup_ids()?);
    Ok(duration_s)
}

/// What the last read of a kmem run gives its report.
pub struct FinalRead {
    /// kheap's exit status so far ([`Ended::report`]).
    pub exit_code: i32,
    /// The maps at the end, the command's rows named after it.
    pub snapshot: Snapshot,
    pub run: RunInfo,
}

/// After [`stop_tracing`] and whatever a command reads while its traced
/// command still lives: says why the run ended, ends the command and reads
/// the maps a last time.
pub fn final_read(
    tracer: &Tracer,
    ended: Ended,
    targets: &mut Targets,
    filters: &FilterArgs,
) -> Result<FinalRead> {
    let exit_code = ended.report();
    targets.terminate();
    let mut snapshot = tracer.snapshot()?;
    if let Some(cmd) = &targets.command {
        name_command_process(&mut snapshot, cmd);
    }
    Ok(FinalRead {
        exit_code,
        snapshot,
        run: run_info(tracer, &tracer.skipped, filters),
    })
}

/// What a kmem run was, for the report's header and JSON.
pub fn run_info(session: &Tracer, skipped: &[String], f: &FilterArgs) -> RunInfo {
    let mut filters = f.describe();
    // The kmem tracer leaves kheap's own process out (Config::include_self):
    // its map reads allocate in the kernel, and that is not the workload.
    filters.push(format!("not kheap itself (pid {})", std::process::id()));
    RunInfo {
        kernel: features::kernel_release(),
        attach: session.attached.clone(),
        skipped: skipped.to_vec(),
        filters,
        command: f.targets.command_line(),
        kernel_memory_bytes: session.kernel_memory,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_row_is_named_after_exec() {
        let held = HeldCommand::spawn(&["sh".into(), "-c".into(), "true".into()]).unwrap();
        let mut snap = Snapshot::default();
        for pid in [held.pid, 1] {
            snap.procs
                .insert(Some(pid), ("kheap".to_string(), Default::default()));
            snap.comms.insert(pid, "kheap".to_string());
        }
        name_command_process(&mut snap, &held);
        assert_eq!(snap.procs[&Some(held.pid)].0, "sh");
        assert_eq!(
            snap.comms[&held.pid], "sh",
            "the name stacks are labelled with"
        );
        // Only the command's own PID: another kheap stays kheap.
        assert_eq!(snap.procs[&Some(1)].0, "kheap");
        assert_eq!(snap.comms[&1], "kheap");
    }
}
