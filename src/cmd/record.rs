//! `kheap record`: trace for a while (or for a command's life), then print
//! who allocated what.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;

use crate::cli::{
    check_size_range, parse_comm, parse_duration, parse_map_entries, parse_sample, parse_size,
};
use crate::kernel::features;
use crate::kernel::kmem::{AttachMode, Config, Session};
use crate::kernel::latency::{LatencyProbe, LatencySession};
use crate::render::{self, Format, GroupBy, SortBy};
use crate::report::{self, BuildOptions, Report, RunInfo};
use crate::symbolize::KernelSymbols;
use crate::target::{resolve_pid, HeldCommand};

#[derive(Args, Debug, Clone)]
pub struct TraceArgs {
    /// Stop after this many seconds (default: until Ctrl-C or the command ends)
    #[arg(short, long, value_parser = parse_duration, value_name = "SECS")]
    pub duration: Option<Duration>,
    /// Only count allocations made by this process (repeatable)
    #[arg(short, long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Only count allocations made by tasks with this command name
    #[arg(long, value_parser = parse_comm, value_name = "NAME")]
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
    /// Leave the command and what it started running when kheap stops
    /// (by default they end with the run)
    #[arg(long)]
    pub keep_running: bool,
    /// Command to run and trace (with its children) until it exits
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct RecordArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    /// Group rows by
    #[arg(long, value_enum, default_value_t = GroupBy::Site)]
    pub by: GroupBy,
    /// Order rows by
    #[arg(long, value_enum, default_value_t = SortBy::Bytes)]
    pub sort: SortBy,
    /// Rows to show (tables default to 20; JSON and folded show all)
    #[arg(short = 'n', long = "top", value_name = "N")]
    pub top: Option<usize>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write the report to FILE instead of stdout
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Capture the stack of every allocation (exact per-stack numbers, ~20x the cost)
    #[arg(long, conflicts_with_all = ["stack_sample", "no_stacks"])]
    pub exact_stacks: bool,
    /// Capture the stack of about one allocation in N (a power of two)
    #[arg(long, value_parser = parse_sample, default_value = "1024", value_name = "N")]
    pub stack_sample: u32,
    /// Capture no stacks at all (cheapest; per-site numbers only)
    #[arg(long)]
    pub no_stacks: bool,
    /// Also time each allocation inside the allocator, per call site
    /// (needs fentry or kprobes)
    #[arg(long)]
    pub latency: bool,
    /// How --latency probes the allocator
    #[arg(long, value_enum, default_value_t = LatencyProbe::Auto, requires = "latency")]
    pub latency_probe: LatencyProbe,
    /// Don't trace frees (saves the cost of the kfree/kmem_cache_free events)
    #[arg(long)]
    pub no_frees: bool,
    /// Capacity of the per-site and per-stack maps
    #[arg(long, value_parser = parse_map_entries, default_value = "8192", value_name = "N")]
    pub max_entries: u32,
}

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
    pub fn from_args(t: &TraceArgs) -> Result<Targets> {
        let mut targets = Self::new(&t.pids, &t.command)?;
        if t.keep_running {
            targets.keep_running();
        }
        Ok(targets)
    }

    pub fn keep_running(&mut self) {
        if let Some(c) = self.command.as_mut() {
            c.keep_running();
        }
    }

    /// Validates the PIDs and starts the command, held until `release`.
    pub fn new(user_pids: &[u32], command: &[String]) -> Result<Targets> {
        let mut pids = Vec::new();
        for &p in user_pids {
            pids.push(resolve_pid(p)?);
        }
        let user_pids = pids.clone();
        let command = if command.is_empty() {
            None
        } else {
            let held = HeldCommand::spawn(command)?;
            pids.push(held.pid);
            Some(held)
        };
        Ok(Targets {
            pids,
            user_pids,
            command,
        })
    }

    pub fn filters(&self, t: &TraceArgs) -> Vec<String> {
        let mut f = Vec::new();
        if !t.pids.is_empty() {
            f.push(format!("pid {:?}", t.pids));
        }
        if let Some(c) = &t.command.first() {
            f.push(format!("command '{c}' and its children"));
        }
        if let Some(c) = &t.comm {
            f.push(format!("comm {c}"));
        }
        if t.min_size > 0 || t.max_size.is_some() {
            let max = t
                .max_size
                .map(|m| m.to_string())
                .unwrap_or_else(|| "∞".into());
            f.push(format!("size {}..={max}", t.min_size));
        }
        f
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
    /// Says why the run ended when that is worth a line; the exit code of
    /// kheap (the command's, if it failed).
    pub fn explain(&self) -> i32 {
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
    mut tick: impl FnMut(Duration),
) -> Ended {
    let start = Instant::now();
    let mut next_tick = Duration::from_secs(1);
    loop {
        if stop_requested() {
            return Ended::Signal;
        }
        if let Some(code) = targets.command.as_mut().and_then(|c| c.try_wait()) {
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
            next_tick += Duration::from_secs(1);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn run(args: RecordArgs) -> Result<i32> {
    let t = &args.trace;
    check_size_range(t.min_size, t.max_size)?;
    features::check_privileges("record")?;
    features::check_btf()?;
    if let Some(path) = &args.output {
        crate::output::check_writable(path, "-o")?;
    }
    install_stop_handler();

    let mut targets = Targets::from_args(t)?;
    let stack_sample_every = match (args.exact_stacks, args.no_stacks) {
        (true, _) => 1,
        (_, true) => 0,
        _ => args.stack_sample,
    };
    let cfg = Config {
        min_size: t.min_size,
        max_size: t.max_size,
        stack_sample_every,
        pids: targets.pids.clone(),
        follow_children: targets.command.is_some(),
        comm: t.comm.clone(),
        by_process: args.by == GroupBy::Process,
        attach: t.attach,
        max_sites: args.max_entries,
        max_stacks: args.max_entries,
        trace_frees: !args.no_frees,
        latency_starts: None,
    };
    // Latency first: the record object shares its per-task entry map.
    let mut latency = if args.latency {
        Some(LatencySession::start(args.latency_probe)?)
    } else {
        None
    };
    let cfg = Config {
        latency_starts: latency
            .as_ref()
            .map(|l| std::os::fd::AsRawFd::as_raw_fd(&l.starts_map())),
        ..cfg
    };
    let mut session = Session::start(&cfg)?;
    if let Some(l) = &latency {
        session.attached.push(format!(
            "latency: {} on {}",
            l.mechanism.name(),
            l.functions.join(", ")
        ));
    }
    let interactive = std::io::stderr().is_terminal();
    eprintln!(
        "kheap: tracing kernel heap allocations ({}){}",
        session.attached.join(", "),
        if t.duration.is_none() && t.command.is_empty() {
            "; Ctrl-C to stop"
        } else {
            ""
        }
    );
    if let Some(cmd) = targets.command.as_mut() {
        cmd.release()?;
    }
    let start = Instant::now();
    let ended = wait_for_end(t.duration, &mut targets, |elapsed| {
        if interactive {
            let allocs = session.allocations_so_far().unwrap_or(0);
            eprint!(
                "\rkheap: recording {:>4}s, {} allocations so far   ",
                elapsed.as_secs(),
                crate::model::human_count(allocs)
            );
        }
    });
    let duration_s = start.elapsed().as_secs_f64();
    session.detach();
    if let Some(l) = latency.as_mut() {
        l.detach();
    }
    if interactive {
        eprintln!();
    }
    let exit_code = ended.explain();
    if let Some(cmd) = targets.command.as_mut() {
        cmd.terminate();
    }
    let mut snap = session.snapshot()?;
    if let Some(cmd) = &targets.command {
        crate::target::name_command_process(&mut snap.procs, cmd);
    }
    let run = RunInfo {
        kernel: features::kernel_release(),
        attach: session.attached.clone(),
        skipped: session.skipped.clone(),
        filters: targets.filters(t),
        command: (!t.command.is_empty()).then(|| t.command.join(" ")),
    };
    drop(session);
    let latency_data = latency.map(|l| l.read()).transpose()?;

    let syms = KernelSymbols::new(None);
    let mut report = report::build(
        &snap,
        &syms,
        BuildOptions {
            stack_sample_every,
            duration_s,
            run,
        },
    );
    if let Some(data) = &latency_data {
        report.latency = crate::kernel::latency::rows(data, &syms);
        report.lost.latency_unmatched = data.missed_start;
        report.lost.map_full += data.map_full;
    }
    write_report(report, &args)?;
    Ok(exit_code)
}

fn write_report(mut report: Report, args: &RecordArgs) -> Result<()> {
    let top = render::default_top(args.format, args.top);
    let hidden = render::apply_top(&mut report, args.sort, top);
    let text = match args.format {
        Format::Table => render::table(&report, args.by, hidden, 3),
        Format::Json => serde_json::to_string_pretty(&report)? + "\n",
        Format::Folded => render::folded(&report),
    };
    crate::output::emit(&text, args.output.as_deref())
}
