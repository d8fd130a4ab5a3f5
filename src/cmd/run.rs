//! What every tracing subcommand does around its tracer: the stop handler
//! (Ctrl-C, SIGTERM, SIGHUP end the run, the report is still printed), the
//! processes a run is about, and the wait for its end.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::cli::{FilterArgs, TargetArgs};
use crate::kernel::features;
use crate::kernel::kmem::Config;
use crate::report::RunInfo;
use crate::target::{resolve_pid, HeldCommand};

static STOP: AtomicBool = AtomicBool::new(false);

/// Ctrl-C, SIGTERM and SIGHUP end the recording; the report is still printed.
pub fn install_stop_handler() {
    // Fails only if a handler is already installed, which is then ours.
    let _ = ctrlc::set_handler(|| STOP.store(true, Ordering::SeqCst));
}

pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// The processes a run is about: validated PIDs and, with `-- CMD`, the
/// held command.
pub struct Targets {
    pub pids: Vec<u32>,
    pub command: Option<HeldCommand>,
}

impl Targets {
    /// Validates the PIDs and starts the command, held until `release`.
    pub fn start(t: &TargetArgs) -> Result<Targets> {
        let mut pids = Vec::new();
        for &p in &t.pids {
            pids.push(resolve_pid(p)?);
        }
        let command = if t.command.is_empty() {
            None
        } else {
            let held = HeldCommand::spawn(&t.command)?;
            pids.push(held.pid);
            Some(held)
        };
        Ok(Targets { pids, command })
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

/// Why a recording ended.
pub enum Ended {
    Duration,
    Signal,
    CommandExited(i32),
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
            _ => 0,
        }
    }
}

/// Waits until the duration passes, the command exits or a signal arrives,
/// calling `tick` about once a second.
pub fn wait_for_end(
    duration: Option<f64>,
    targets: &mut Targets,
    mut tick: impl FnMut(Duration),
) -> Ended {
    let start = Instant::now();
    let mut next_tick = Duration::from_secs(1);
    loop {
        if stop_requested() {
            return Ended::Signal;
        }
        if let Some(code) = targets.command_exited() {
            return Ended::CommandExited(code);
        }
        let elapsed = start.elapsed();
        if duration.is_some_and(|d| elapsed.as_secs_f64() >= d) {
            return Ended::Duration;
        }
        if elapsed >= next_tick {
            tick(elapsed);
            next_tick += Duration::from_secs(1);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The kmem tracer's settings every subcommand shares: what the filters
/// and targets say; each subcommand adds its own on top.
pub fn kmem_config(f: &FilterArgs, targets: &Targets) -> Config {
    Config {
        min_size: f.min_size,
        max_size: f.max_size,
        pids: targets.pids.clone(),
        follow_children: targets.command.is_some(),
        comm: f.comm.clone(),
        attach: f.attach,
        ..Config::default()
    }
}

/// What a kmem run was, for the report's header and JSON.
pub fn run_info(attached: &[String], skipped: &[String], f: &FilterArgs) -> RunInfo {
    let mut filters = f.describe();
    // The kmem tracer leaves kheap's own process out (Config::include_self):
    // its map reads allocate in the kernel, and that is not the workload.
    filters.push(format!("not kheap itself (pid {})", std::process::id()));
    RunInfo {
        kernel: features::kernel_release(),
        attach: attached.to_vec(),
        skipped: skipped.to_vec(),
        filters,
        command: f.targets.command_line(),
    }
}

/// Where a stream of reports goes (top -b, slab --watch): stdout, or a file
/// created before anything is attached, so a path that cannot be written is
/// said at once.
pub enum Sink {
    Stdout,
    File(std::fs::File),
}

impl Sink {
    pub fn create(path: Option<&Path>) -> Result<Sink> {
        Ok(match path {
            Some(p) => Sink::File(
                std::fs::File::create(p)
                    .with_context(|| format!("cannot write the output to {}", p.display()))?,
            ),
            None => Sink::Stdout,
        })
    }

    /// Writes one report. A closed stdout pipe (`| head`) ends the run
    /// quietly (false); a file that cannot be written is an error.
    pub fn write(&mut self, text: &str) -> Result<bool> {
        match self {
            Sink::Stdout => {
                let mut out = std::io::stdout().lock();
                Ok(out
                    .write_all(text.as_bytes())
                    .and_then(|()| out.flush())
                    .is_ok())
            }
            Sink::File(f) => {
                f.write_all(text.as_bytes())
                    .and_then(|()| f.flush())
                    .context("writing the output file")?;
                Ok(true)
            }
        }
    }
}
