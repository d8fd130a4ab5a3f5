//! `kheap top`: a refreshing view of who allocates right now, full-screen
//! or in batch mode. This is the loop that reads the kernel each interval;
//! everything it shows is computed by the pure `top` modules.

use std::io::IsTerminal;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant, SystemTime};

use crate::cgroup::CgroupNames;
use crate::sys::cgroup2_mount;
use anyhow::{bail, Context, Result};
use clap::Args;

use crate::cli::{parse_duration, OutputArgs, TableOrJson, TraceArgs, ROWS_ARG};
use crate::clock::rfc3339_utc;
use crate::kernel::features;
use crate::kernel::kmem::{self as session, Config, Tracer};
use crate::kernel::storage::ObjectStorage;
use crate::output::Sink;
use crate::render::table::output_width;
use crate::render::GroupBy;
use crate::report::delta::Tracker;
use crate::report::overhead::{self_usage, Overhead, SelfUsage};
use crate::report::{self, BuildOptions, RunInfo};
use crate::session::{
    install_stop_handler, kmem_config, run_info, start_tracing, stop_requested, Ended, Targets,
};
use crate::symbolize::{CachingSymbols, KernelSymbols, Symbolize};
use crate::top::batch;
use crate::top::tui::{self, Action, App, Input, Keys, Screen};
use crate::top::view::{self, Interval, ObjectSizes, TopRow, TopSort, ViewOptions};

// `-n` is the number of iterations here, as in top(1), so `-r/--rows` has
// no `-n` alias in this command (it keeps `--top`).
#[derive(Args, Debug)]
#[command(mut_arg(ROWS_ARG, |rows| rows.short_alias(None)))]
pub struct TopArgs {
    /// Seconds between refreshes
    #[arg(short, long, value_parser = parse_duration, allow_hyphen_values = true, default_value = "1", value_name = "SECS")]
    pub interval: Duration,
    #[command(flatten)]
    pub trace: TraceArgs,
    // Batch output: --format json prints one JSON object per interval, one
    // per line; -r cuts each list (JSON) or table (default 20).
    #[command(flatten)]
    pub output: OutputArgs<TableOrJson>,
    /// Group rows by
    #[arg(long, value_enum, default_value_t = GroupBy::Site)]
    pub by: GroupBy,
    /// Order rows by
    #[arg(long, value_enum, default_value_t = TopSort::Bytes)]
    pub sort: TopSort,
    /// Batch mode: print plain text (or JSON) per interval instead of a
    /// full-screen view (implied by --format json and by -o)
    #[arg(short, long)]
    pub batch: bool,
    /// Stop after this many intervals, as top(1)'s -n (default: until q,
    /// Ctrl-C, SIGTERM or the command ends)
    #[arg(short = 'n', long, value_name = "N")]
    pub iterations: Option<u64>,
    /// Delete map entries that saw no event for this many intervals, so the
    /// maps do not fill over a long run (0: never); shown as "aged out"
    #[arg(long, default_value = "10", value_name = "N")]
    pub idle_intervals: u32,
}

/// The kernel tracer's settings for this run.
fn kernel_config(args: &TopArgs, targets: &Targets) -> Config {
    Config {
        by_process: args.by == GroupBy::Process,
        by_cgroup: args.by == GroupBy::Cgroup,
        trace_frees: true,
        // The cache view's frees column counts kfree()'s too.
        kfree_caches: true,
        ..kmem_config(&args.trace, targets, crate::cli::DEFAULT_STACK_SAMPLE)
    }
}

pub fn run(mut args: TopArgs) -> Result<i32> {
    args.trace.filters.check()?;
    // Batch, JSON and the full-screen view alike.
    if let Err(e) = args.sort.check_offered(args.by) {
        bail!("{e}");
    }
    if args.output.format == TableOrJson::Json || args.output.output.is_some() {
        args.batch = true;
    }
    if args.iterations == Some(0) {
        bail!("-n/--iterations 0: nothing to show; give at least one iteration");
    }
    let on_terminal = std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    if !args.batch && !on_terminal {
        bail!("the full-screen view needs a terminal: use -b for plain-text output");
    }
    features::check_privileges("top")?;
    features::check_btf()?;
    // Created before anything is attached: a path that cannot be written
    // is said at once, not after the first interval.
    let sink = Sink::create(args.output.output())?;
    install_stop_handler();
    let mut targets = Targets::start(&args.trace.filters.targets)?;
    let cfg = kernel_config(&args, &targets);
    let mut storage = ObjectStorage::default();
    let session = Tracer::start(&cfg, &mut storage, None)?;
    // Run-time statistics cost a little per program run, for everyone:
    // they are on only while top runs (closing the descriptor ends them).
    let stats = match session::enable_run_time_stats() {
        Ok(fd) => Some(fd),
        Err(e) => {
            eprintln!("kheap: warning: {e:#}; BPF overhead will not be shown");
            None
        }
    };
    let mut skipped = session.skipped.clone();
    let (idle_intervals, kept) = features::idle_intervals_here(args.idle_intervals);
    skipped.extend(kept.map(str::to_string));
    let run = run_info(&session, &skipped, &args.trace.filters);
    let syms = CachingSymbols::new(KernelSymbols::new(None));
    // The first lookup loads kallsyms; do it now, not inside an interval.
    let _ = syms.symbolize(&[0]);
    // The first interval starts at a baseline read, not at attach time:
    // whatever happened before it is not in any interval.
    let mut tracker = Tracker::new();
    let last_read = Instant::now();
    tracker.interval(session.snapshot()?);
    let usage = self_usage();
    // Said once counting has begun: every event after this line is in an
    // interval.
    // The command runs from here: its allocations are all in intervals.
    start_tracing(
        "kernel heap allocations",
        &session.attached,
        None,
        &mut targets,
        "",
    )?;
    let mut top = Top {
        run_time_stats: stats,
        session,
        tracker,
        syms,
        sizes: ObjectSizes::default(),
        cgroup_names: CgroupNames::new(cgroup2_mount().ok()),
        stack_sample_every: cfg.stack_sample_every,
        idle_intervals,
        run,
        last_read,
        usage,
        targets,
        end: args.trace.duration.map(|d| last_read + d),
        ended: None,
    };
    let result = if args.batch {
        batch_loop(&mut top, &args, sink)
    } else {
        screen_loop(&mut top, &args)
    };
    top.run_time_stats = None;
    top.targets.terminate();
    result?;
    // A signal is how top usually ends: only a failed command is news.
    Ok(match &top.ended {
        Some(ended @ (Ended::CommandExited(_) | Ended::PidsExited)) => ended.report(),
        _ => 0,
    })
}

/// The reading side: the session and what is kept between reads.
struct Top<'obj> {
    session: Tracer<'obj>,
    tracker: Tracker,
    syms: CachingSymbols<KernelSymbols>,
    sizes: ObjectSizes,
    cgroup_names: CgroupNames,
    stack_sample_every: u32,
    idle_intervals: u32,
    run: RunInfo,
    last_read: Instant,
    /// Keeps the kernel's BPF run-time statistics on while open (the
    /// intervals' program run times are 0 without it).
    run_time_stats: Option<OwnedFd>,
    usage: SelfUsage,
    /// The processes traced; with `-- CMD`, top ends when the command does.
    targets: Targets,
    /// When -d ends the run.
    end: Option<Instant>,
    /// Set when the command exited (or a signal came).
    ended: Option<Ended>,
}

impl Top<'_> {
    /// Whether the run is over: a signal, -d, or the traced command (or
    /// every -p process) exited.
    /// Sleeps until the next read (`deadline`) or the end of the run,
    /// whichever comes first, woken by a signal: an idle batch run wakes
    /// once an interval. Processes it watches (the command, -p) end
    /// without a signal to kheap, so while it watches some it looks every
    /// 100 ms.
    fn nap(&self, deadline: Instant) {
        let now = Instant::now();
        let mut left = deadline.saturating_duration_since(now);
        if let Some(end) = self.end {
            left = left.min(end.saturating_duration_since(now));
        }
        if self.targets.command.is_some() || !self.targets.user_pids.is_empty() {
            left = left.min(Duration::from_millis(100));
        }
        crate::signals::sleep_until_signal(left);
    }

    fn should_stop(&mut self) -> bool {
        if self.ended.is_none() {
            if stop_requested() {
                self.ended = Some(Ended::Signal);
            } else if let Some(code) = self.targets.command_exited() {
                self.ended = Some(Ended::CommandExited(code));
            } else if self.end.is_some_and(|end| Instant::now() >= end) {
                self.ended = Some(Ended::Duration);
            } else if self.targets.command.is_none()
                && crate::tree::all_exited(&self.targets.user_pids)
            {
                self.ended = Some(Ended::PidsExited);
            }
        }
        self.ended.is_some()
    }

    /// Reads the maps and turns what changed since the last read into one
    /// interval; then deletes entries idle for too long.
    fn read_interval(&mut self) -> Result<Interval> {
        // Everything that measures the interval is read together, before
        // the slower symbolizing and building. The clocks first: the
        // snapshot reads the per-site counts right away and the stacks
        // last (slowly, under emulation), so an interval ends when its
        // counts were read, not when its stacks were.
        let now = Instant::now();
        let time = rfc3339_utc(SystemTime::now());
        let snap = self.session.snapshot()?;
        let read = now.elapsed();
        let usage = self_usage();
        let interval_s = now.duration_since(self.last_read).as_secs_f64();
        self.last_read = now;
        let delta = self.tracker.interval(snap);
        let mut report = report::build(
            &delta,
            &self.syms,
            BuildOptions {
                stack_sample_every: self.stack_sample_every,
                duration_s: interval_s,
                run: self.run.clone(),
            },
        );
        // Every interval: ids new since the last one are resolved while
        // their cgroups exist; known ones keep their path after removal.
        report.name_cgroups(&mut self.cgroup_names);
        self.sizes.learn(&report);

        let bpf = self.run_time_stats.is_some().then_some(delta.bpf_run);
        let mut overhead = Overhead::between(bpf, (self.usage, usage), interval_s);
        overhead.maps_read_ms = crate::model::round2(read.as_secs_f64() * 1e3);
        self.usage = usage;

        let mut aged_out = 0;
        if self.idle_intervals > 0 {
            let idle = self.tracker.idle_keys(self.idle_intervals);
            if !idle.is_empty() {
                let removed = self.session.remove_idle(&idle)?;
                aged_out = removed.map_entries() as u64;
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

fn batch_loop(top: &mut Top, args: &TopArgs, mut sink: Sink) -> Result<()> {
    let view = ViewOptions {
        by: args.by,
        sort: args.sort,
        paused: false,
    };
    let rows = args.output.rows();
    let mut deadline = next_deadline(top.last_read, args.interval.as_secs_f64());
    let mut done = 0;
    loop {
        // Set when the run ends mid-interval (the command or every -p
        // process exited, or a signal came): what was counted since the
        // last read goes into one last, shorter interval, so a run always
        // ends with what it measured.
        let mut last = false;
        while Instant::now() < deadline {
            if top.should_stop() {
                last = true;
                break;
            }
            top.nap(deadline);
        }
        let iv = top.read_interval()?;
        deadline = next_deadline(deadline, args.interval.as_secs_f64());
        let text = match args.output.format {
            TableOrJson::Json => batch::json(&iv, args.sort, &top.sizes, rows),
            TableOrJson::Table => {
                let width = output_width(args.output.output());
                batch::text(&iv, &view, &top.sizes, rows.unwrap_or(usize::MAX), width) + "\n"
            }
        };
        if !sink.write(&text)? {
            return Ok(());
        }
        done += 1;
        if last || args.iterations.is_some_and(|n| done >= n) {
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
        crate::top::view::counted_view(args.by),
    );
    let mut current: Option<Interval> = None;
    let mut rows = Vec::new();
    let mut deadline = next_deadline(top.last_read, app.interval_s);
    let mut done = 0;
    let mut redraw = true;
    let mut keys = Keys::new();
    // The terminal went away: the run ends, with nothing left to show on.
    let mut gone = false;
    'run: loop {
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
            let (shown, total) = screen_rows(current.as_ref(), &app, top, args.output.rows);
            rows = shown;
            app.follow(&rows);
            let drawn = screen
                .terminal
                .draw(|f| tui::draw(f, &app, current.as_ref(), &rows, total));
            if let Err(e) = drawn {
                if tui::terminal_gone() {
                    gone = true;
                    break;
                }
                return Err(e).context("drawing the screen");
            }
            redraw = false;
        }
        if args.iterations.is_some_and(|n| done >= n) {
            break;
        }
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(100));
        for input in keys.next(wait)? {
            match input {
                Input::Key(key) => match app.on_key(key, rows.len()) {
                    Action::Quit => break 'run,
                    Action::Redraw => redraw = true,
                    Action::Reschedule => {
                        deadline = next_deadline(top.last_read, app.interval_s);
                        redraw = true;
                    }
                    Action::Nothing => {}
                },
                Input::Resize => redraw = true,
                Input::Gone => {
                    gone = true;
                    break 'run;
                }
            }
        }
    }
    drop(screen);
    if gone {
        top.ended.get_or_insert(Ended::Signal);
        return Ok(());
    }
    // After a signal, or once the traced command has exited (its last
    // allocations read into a last interval), leave the last interval on
    // the main screen: the run still ends with a report.
    if matches!(top.ended, Some(Ended::CommandExited(_))) {
        current = Some(top.read_interval()?);
    }
    if top.ended.is_some() {
        if let Some(iv) = &current {
            let limit = args.output.rows().unwrap_or(20);
            let text = batch::text(iv, &app.view, &top.sizes, limit, output_width(None));
            crate::output::print(&text)?;
        }
    }
    Ok(())
}
