//! `kheap top`: a refreshing view of who allocates right now, full-screen
//! or in batch mode. This is the loop that reads the kernel each interval;
//! everything it shows is computed by the pure `top` modules.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};

use crate::cli::{
    check_size_range, parse_comm, parse_duration, parse_map_entries, parse_sample, parse_size,
};
use crate::cmd::record::{install_stop_handler, stop_requested};
use crate::kernel::features;
use crate::kernel::kmem::{self as session, AttachMode, Config, Session};
use crate::render::GroupBy;
use crate::report::{self, BuildOptions, RunInfo};
use crate::symbolize::{CachingSymbols, KernelSymbols, Symbolize};
use crate::target::resolve_pid;
use crate::top::batch;
use crate::top::clock::rfc3339_utc;
use crate::top::delta::Tracker;
use crate::top::overhead::{self_usage, Overhead, ProgRunTime, SelfUsage};
use crate::top::tui::{self, Action, App, Input, Screen};
use crate::top::view::{self, Interval, ObjectSizes, TopRow, TopSort, ViewOptions};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TopFormat {
    /// Plain-text tables, one per interval (no escape codes)
    Table,
    /// One JSON object per interval, one per line (implies --batch)
    Json,
}

#[derive(Args, Debug)]
pub struct TopArgs {
    /// Seconds between refreshes
    #[arg(short, long, value_parser = parse_duration, default_value = "1", value_name = "SECS")]
    pub interval: Duration,
    /// Group rows by
    #[arg(long, value_enum, default_value_t = GroupBy::Site)]
    pub by: GroupBy,
    /// Order rows by
    #[arg(long, value_enum, default_value_t = TopSort::Bytes)]
    pub sort: TopSort,
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
    /// Rows per interval (batch tables default to 20, JSON to all; the screen shows what fits)
    #[arg(long, value_name = "N")]
    pub rows: Option<usize>,
    /// Batch mode: print plain text (or JSON) per interval instead of a full-screen view
    #[arg(short, long)]
    pub batch: bool,
    /// Stop after this many intervals (default: until q, Ctrl-C or SIGTERM)
    #[arg(short = 'n', long, value_name = "ITERATIONS")]
    pub iterations: Option<u64>,
    /// Output format of batch mode
    #[arg(long, value_enum, default_value_t = TopFormat::Table)]
    pub format: TopFormat,
    /// Capture the stack of about one allocation in N (a power of two; 1: every one)
    #[arg(long, value_parser = parse_sample, default_value = "1024", value_name = "N")]
    pub stack_sample: u32,
    /// Capture no stacks (cheapest; no stack view)
    #[arg(long)]
    pub no_stacks: bool,
    /// Delete map entries that saw no event for this many intervals, so the
    /// maps do not fill over a long run (0: never); shown as "aged out"
    #[arg(long, default_value = "10", value_name = "N")]
    pub idle_intervals: u32,
    /// Capacity of the per-site and per-stack maps
    #[arg(long, value_parser = parse_map_entries, default_value = "8192", value_name = "N")]
    pub max_entries: u32,
    /// How to attach to the kmem tracepoints
    #[arg(long, value_enum, default_value_t = AttachMode::Auto)]
    pub attach: AttachMode,
}

pub fn run(mut args: TopArgs) -> Result<i32> {
    check_size_range(args.min_size, args.max_size)?;
    if args.format == TopFormat::Json {
        args.batch = true;
    }
    if args.iterations == Some(0) {
        bail!("-n 0: nothing to show; give at least one iteration");
    }
    let on_terminal = std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    if !args.batch && !on_terminal {
        bail!("the full-screen view needs a terminal: use -b for plain-text output");
    }
    features::check_privileges("top")?;
    features::check_btf()?;
    install_stop_handler();
    let mut pids = Vec::new();
    for &p in &args.pids {
        pids.push(resolve_pid(p)?);
    }
    let stack_sample_every = if args.no_stacks { 0 } else { args.stack_sample };
    let watched = pids.clone();
    let cfg = Config {
        min_size: args.min_size,
        max_size: args.max_size,
        stack_sample_every,
        pids,
        follow_children: false,
        comm: args.comm.clone(),
        by_process: args.by == GroupBy::Process,
        attach: args.attach,
        max_sites: args.max_entries,
        max_stacks: args.max_entries,
        trace_frees: true,
        latency_starts: None,
    };
    let session = Session::start(&cfg)?;
    // Run-time statistics cost a little per program run, for everyone:
    // they are on only while top runs (closing the descriptor ends them).
    let stats = match session::enable_run_time_stats() {
        Ok(fd) => Some(fd),
        Err(e) => {
            eprintln!("kheap: warning: {e:#}; BPF overhead will not be shown");
            None
        }
    };
    let mut filters = Vec::new();
    if !args.pids.is_empty() {
        filters.push(format!("pid {:?}", args.pids));
    }
    if let Some(c) = &args.comm {
        filters.push(format!("comm {c}"));
    }
    let run = RunInfo {
        kernel: features::kernel_release(),
        attach: session.attached.clone(),
        skipped: session.skipped.clone(),
        filters,
        command: None,
    };
    let syms = CachingSymbols::new(KernelSymbols::new(None));
    // The first lookup loads kallsyms; do it now, not inside an interval.
    let _ = syms.symbolize(&[0]);
    // The first interval starts at a baseline read, not at attach time:
    // whatever happened before it is not in any interval.
    let mut tracker = Tracker::new();
    tracker.interval(session.snapshot()?);
    let last_read = Instant::now();
    let run_time = stats.as_ref().and_then(|_| session.run_time().ok());
    let usage = self_usage();
    // Said once counting has begun: every event after this line is in an
    // interval.
    eprintln!(
        "kheap: tracing kernel heap allocations ({})",
        session.attached.join(", ")
    );
    let mut top = Top {
        run_time,
        session,
        tracker,
        syms,
        sizes: ObjectSizes::default(),
        stack_sample_every,
        idle_intervals: args.idle_intervals,
        run,
        last_read,
        usage,
        watched,
    };
    let result = if args.batch {
        batch_loop(&mut top, &args)
    } else {
        screen_loop(&mut top, &args)
    };
    drop(stats);
    result.map(|()| 0)
}

/// The reading side: the session and what is kept between reads.
struct Top {
    session: Session,
    tracker: Tracker,
    syms: CachingSymbols<KernelSymbols>,
    sizes: ObjectSizes,
    stack_sample_every: u32,
    idle_intervals: u32,
    run: RunInfo,
    last_read: Instant,
    /// None when BPF statistics are off.
    run_time: Option<ProgRunTime>,
    usage: SelfUsage,
    /// The -p processes: top ends when all have exited.
    watched: Vec<u32>,
}

impl Top {
    /// A signal, or every -p process gone.
    fn should_stop(&self) -> bool {
        if stop_requested() {
            return true;
        }
        if crate::tree::all_exited(&self.watched) {
            eprintln!("kheap: every traced process (-p) exited");
            return true;
        }
        false
    }

    /// Reads the maps and turns what changed since the last read into one
    /// interval; then deletes entries idle for too long.
    fn read_interval(&mut self) -> Result<Interval> {
        // Everything that measures the interval is read together, before
        // the slower symbolizing and building.
        let snap = self.session.snapshot()?;
        let now = Instant::now();
        let time = rfc3339_utc(SystemTime::now());
        let run_time = match self.run_time {
            Some(_) => self.session.run_time().ok(),
            None => None,
        };
        let usage = self_usage();
        let interval_s = now.duration_since(self.last_read).as_secs_f64();
        self.last_read = now;
        let delta = self.tracker.interval(snap);
        let report = report::build(
            &delta,
            &self.syms,
            BuildOptions {
                stack_sample_every: self.stack_sample_every,
                duration_s: interval_s,
                run: self.run.clone(),
            },
        );
        self.sizes.learn(&report);

        let bpf = self.run_time.zip(run_time);
        self.run_time = run_time;
        let overhead = Overhead::between(bpf, (self.usage, usage), interval_s);
        self.usage = usage;

        let mut aged_out = 0;
        if self.idle_intervals > 0 {
            let idle = self.tracker.idle_keys(self.idle_intervals);
            if !idle.is_empty() {
                let removed = self.session.remove_idle(&idle)?;
                aged_out = (removed.sites.len()
                    + removed.stacks.len()
                    + removed.procs.len()
                    + removed.cache_frees.len()) as u64;
                self.tracker.forget(&removed);
            }
        }
        Ok(Interval {
            time,
            interval_s,
            aged_out,
            overhead,
            report,
        })
    }
}

/// The next read time: one interval after the last, or now if that passed
/// (a slow read or a pause must not cause a burst of catch-up reads).
fn next_deadline(last: Instant, interval_s: f64) -> Instant {
    // interval_s comes from parse_duration or the screen's fixed steps.
    let interval = Duration::try_from_secs_f64(interval_s).unwrap_or(crate::cli::MAX_DURATION);
    last.checked_add(interval.min(crate::cli::MAX_DURATION))
        .unwrap_or(last)
        .max(Instant::now())
}

fn batch_loop(top: &mut Top, args: &TopArgs) -> Result<()> {
    let view = ViewOptions {
        by: args.by,
        sort: args.sort,
        paused: false,
    };
    let limit = args.rows.unwrap_or(20);
    let mut deadline = next_deadline(top.last_read, args.interval.as_secs_f64());
    let mut done = 0;
    loop {
        // A stop mid-interval still prints that (shorter) interval: the
        // run ends with what it measured, as record's does.
        let mut stopping = false;
        while Instant::now() < deadline {
            if top.should_stop() {
                stopping = true;
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            // Wakes up to see a stop request; rarely, to cost next to nothing.
            std::thread::sleep(left.min(Duration::from_millis(100)));
        }
        let iv = top.read_interval()?;
        deadline = next_deadline(deadline, args.interval.as_secs_f64());
        let text = match args.format {
            TopFormat::Json => batch::json(&iv, args.sort, args.rows),
            TopFormat::Table => batch::text(&iv, &view, &top.sizes, limit) + "\n",
        };
        let mut out = std::io::stdout().lock();
        // A closed pipe (| head) ends the run quietly.
        if out
            .write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            return Ok(());
        }
        done += 1;
        if stopping || args.iterations.is_some_and(|n| done >= n) || top.should_stop() {
            return Ok(());
        }
    }
}

/// The rows to show, sorted and cut to `limit`, and how many there were.
fn screen_rows(
    iv: Option<&Interval>,
    app: &App,
    top: &Top,
    limit: Option<usize>,
) -> (Vec<TopRow>, usize) {
    let Some(iv) = iv else {
        return (Vec::new(), 0);
    };
    let mut rows = view::rows(&iv.report, app.view.by, &top.sizes);
    view::sort_rows(&mut rows, app.view.sort);
    let total = rows.len();
    if let Some(n) = limit {
        rows.truncate(n);
    }
    (rows, total)
}

fn screen_loop(top: &mut Top, args: &TopArgs) -> Result<()> {
    let mut screen = Screen::enter()?;
    let mut app = App::new(
        ViewOptions {
            by: args.by,
            sort: args.sort,
            paused: false,
        },
        args.interval.as_secs_f64(),
        args.by == GroupBy::Process,
    );
    let mut current: Option<Interval> = None;
    let mut rows = Vec::new();
    let mut deadline = next_deadline(top.last_read, app.interval_s);
    let mut done = 0;
    let mut redraw = true;
    loop {
        if top.should_stop() {
            break;
        }
        if !app.view.paused && Instant::now() >= deadline {
            current = Some(top.read_interval()?);
            deadline = next_deadline(deadline, app.interval_s);
            done += 1;
            redraw = true;
        }
        if redraw {
            let (shown, total) = screen_rows(current.as_ref(), &app, top, args.rows);
            rows = shown;
            app.follow(&rows);
            screen
                .terminal
                .draw(|f| tui::draw(f, &app, current.as_ref(), &rows, total))?;
            redraw = false;
        }
        if args.iterations.is_some_and(|n| done >= n) {
            break;
        }
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(100));
        match tui::next_input(wait)? {
            Some(Input::Key(key)) => match app.on_key(key, rows.len()) {
                Action::Quit => break,
                Action::Redraw => redraw = true,
                Action::Reschedule => {
                    deadline = next_deadline(top.last_read, app.interval_s);
                    redraw = true;
                }
                Action::Nothing => {}
            },
            Some(Input::Resize) => redraw = true,
            None => {}
        }
    }
    drop(screen);
    // After a signal, leave the last interval on the main screen: the run
    // still ends with a report.
    if stop_requested() {
        if let Some(iv) = &current {
            let text = batch::text(iv, &app.view, &top.sizes, args.rows.unwrap_or(20));
            let _ = std::io::stdout().write_all(text.as_bytes());
        }
    }
    Ok(())
}
