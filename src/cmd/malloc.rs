//! `kheap malloc`: trace the malloc family of a process (or of a command and
//! its children), then print who allocated what, and with --outstanding
//! what was never freed.

mod scanner;

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::report::budget::{self, Budget, BudgetRow};
use clap::Args;

use crate::allocators::libraries::initial_libraries;
use crate::cli::{parse_duration, parse_tracked_objects, OutputArgs, StackArgs, TargetArgs};
use crate::contract::{self, Kind};
use crate::kernel::features;
use crate::kernel::malloc::MallocSession;
use crate::kernel::storage::ObjectStorage;
use crate::kernel::user_stack::UserStackRing;
use crate::malloc::preload::{self, PreloadLibrary};
use crate::malloc::render::{self, MallocGroupBy, MallocSortBy};
use crate::malloc::report::{self, BuildOptions, MallocReport};
use crate::malloc::unwind::StackUnwinder;
use crate::render::Format;
use crate::report::RunInfo;
use crate::session::status::StatusLine;
use crate::session::{install_stop_handler, stop_requested};
use crate::symbolize::user::{symbolize_return_addresses, Blaze, Modules};
use crate::sys::procmaps;
use crate::target::{find_program, resolve_pid, HeldCommand};
use scanner::Scanner;

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

/// The preload library for this run, if the command runs with it: only a
/// command is traced (other targets are running already), no --lib, it
/// ends with the run, and the program can load it.
fn preload_for(args: &MallocArgs, cgroups: usize) -> Result<Option<PreloadLibrary>> {
    let Some(prog) = args.targets.command.first() else {
        return Ok(None);
    };
    // --keep-running: the command outlives the run, and the library's
    // file, which its later execs would look for.
    if args.no_preload
        || args.lib.is_some()
        || !args.targets.pids.is_empty()
        || cgroups > 0
        || args.targets.keep_running
    {
        return Ok(None);
    }
    let program = find_program(prog)?;
    if let Some(why) = preload::unusable_reason(&program) {
        eprintln!(
            "kheap: {} {why}: probing its allocator's functions instead of preloading",
            program.display()
        );
        return Ok(None);
    }
    let Some(dir) = preload::choose_directory() else {
        eprintln!(
            "kheap: no writable directory that allows code ($TMPDIR, /tmp, /dev/shm, /run, /var/tmp are noexec or read-only): probing {}'s allocator functions instead of preloading",
            program.display()
        );
        return Ok(None);
    };
    PreloadLibrary::install(&dir).map(Some)
}

/// How often the list of traced processes is checked: new processes and
/// processes that exec'd (maybe a program with another C library) are read
/// then.
const SCAN_EVERY: Duration = Duration::from_millis(100);

fn parse_budget(s: &str) -> Result<Budget, String> {
    budget::parse(s, false)
}

pub fn run(args: MallocArgs) -> Result<i32> {
    if args.targets.pids.is_empty() && args.targets.command.is_empty() && args.cgroups.is_empty() {
        bail!("nothing to trace: give -p PID or -- COMMAND [ARGS...], or --cgroup PATH");
    }
    let cgroup_mount = crate::sys::cgroup2_mount().ok();
    let cgroups = resolve_cgroups(&args.cgroups, cgroup_mount.as_deref())?;
    if args.sort == MallocSortBy::Outstanding && !args.outstanding {
        bail!("--sort outstanding needs --outstanding");
    }
    if let (Some(b), false) = (
        args.fail_if
            .iter()
            .find(|b| b.measure == budget::Measure::Outstanding),
        args.outstanding,
    ) {
        bail!("--fail-if '{}' needs --outstanding", b.text);
    }
    features::check_privileges("malloc")?;
    if let Some(btf) = &args.btf {
        features::use_btf_file(btf)?;
    }
    features::check_btf()?;
    args.output.check()?;
    args.json.check()?;
    if args.output.format == Format::Pprof {
        crate::output::check_binary_destination(args.output.output(), "pprof")?;
    }
    install_stop_handler();

    let mut user_pids = Vec::new();
    for &p in &args.targets.pids {
        user_pids.push(resolve_pid(p)?);
    }
    for (c, pids) in &cgroups {
        if pids.is_empty() && args.targets.is_empty() {
            bail!("--cgroup {}: no process runs in it or below it", c.path);
        }
        user_pids.extend(pids);
    }
    user_pids.sort_unstable();
    user_pids.dedup();
    let mut pids = user_pids.clone();
    let libs = initial_libraries(args.lib.as_deref(), &pids, &args.targets.command)?;
    let mut modules = Modules::default();
    for &pid in &pids {
        modules.add_maps(pid, &procmaps::read(pid).unwrap_or_default());
    }
    for l in &libs {
        modules.add_file(l);
    }
    // After the input is checked, before a command is started.
    if let Some(why) = features::malloc_unsupported(features::kernel_btf()?) {
        bail!(why);
    }
    if args.outstanding {
        crate::kernel::malloc::check_store(
            args.max_outstanding,
            args.stacks
                .sample_every(crate::kernel::user_stack::DEFAULT_SAMPLE_EVERY),
        )?;
    }
    let preload = preload_for(&args, cgroups.len())?;
    // Held between fork and exec until the probes are attached.
    let mut command = if args.targets.command.is_empty() {
        None
    } else {
        let env: Vec<(&str, String)> = preload
            .iter()
            .map(|p| {
                let current = std::env::var("LD_PRELOAD").ok();
                ("LD_PRELOAD", p.ld_preload(current.as_deref()))
            })
            .collect();
        let mut held = HeldCommand::spawn_with_env(&args.targets.command, &env)?;
        if args.targets.keep_running {
            held.keep_running();
        }
        modules.add_file(&find_program(&args.targets.command[0])?);
        pids.push(held.pid);
        Some(held)
    };

    let mut storage = ObjectStorage::default();
    let mut session = MallocSession::start(
        &mut storage,
        &pids,
        &cgroups.iter().map(|(c, _)| c.id).collect::<Vec<_>>(),
        args.outstanding,
        args.max_outstanding,
        args.probes_at_entry,
        args.stacks
            .sample_every(crate::kernel::user_stack::DEFAULT_SAMPLE_EVERY),
    )?;
    // Stack copies are unwound as they come, while their processes (and
    // so their mappings) are still there.
    let unwinder = Rc::new(RefCell::new(StackUnwinder::default()));
    let ring = {
        let unwinder = unwinder.clone();
        UserStackRing::new(session.user_stacks_map(), move |s| {
            unwinder.borrow_mut().add(s)
        })?
    };
    if let Some(p) = &preload {
        session.probe_preload(&p.path, p.sites)?;
    }
    for l in &libs {
        session.probe_library(l)?;
    }
    let mut scanner = Scanner::new(cgroup_mount);
    if let Some(c) = &command {
        // Until it execs, the held child is a copy of kheap: name it after
        // the program, as the kernel will (comm is 15 bytes at most).
        let prog = std::path::Path::new(&args.targets.command[0]);
        let name = prog
            .file_name()
            .unwrap_or(prog.as_os_str())
            .to_string_lossy();
        scanner.comms.insert(c.pid, name.chars().take(15).collect());
        scanner.held = Some(c.pid);
    }
    // The processes already there are named and their allocator libraries
    // probed before tracing is said to start: a process that runs briefly
    // once told may be gone before a later scan (seen in the 6.1 guest).
    scanner.scan(&mut session, &mut modules, args.lib.is_none(), false);
    let mut next_scan = Instant::now() + SCAN_EVERY;
    eprintln!(
        "kheap: tracing malloc in {} ({}){}",
        describe_targets(&user_pids, &args.targets.command),
        describe_probes(&session, preload.as_ref()),
        if args.duration.is_none() && command.is_none() {
            "; Ctrl-C to stop"
        } else {
            ""
        }
    );
    if let Some(c) = command.as_mut() {
        c.release()?;
    }

    let start = Instant::now();
    let mut exit_code = 0;
    let mut status = StatusLine::new();
    let mut next_status = start + Duration::from_secs(1);
    loop {
        if Instant::now() >= next_scan {
            scanner.scan(&mut session, &mut modules, args.lib.is_none(), false);
            next_scan += SCAN_EVERY;
        }
        if Instant::now() >= next_status {
            status.show(start.elapsed(), || session.progress());
            next_status += Duration::from_secs(1);
        }
        if stop_requested() {
            eprintln!("kheap: stopped by signal; reporting what was recorded");
            break;
        }
        if let Some(code) = command.as_mut().and_then(|c| c.try_wait()) {
            if code != 0 {
                eprintln!("kheap: the command exited with status {code}");
                exit_code = code;
            }
            break;
        }
        if command.is_none() && crate::tree::all_exited(&user_pids) {
            eprintln!("kheap: the traced process exited; reporting what was recorded");
            break;
        }
        if args.duration.is_some_and(|d| start.elapsed() >= d) {
            break;
        }
        ring.poll(Duration::from_millis(10))?;
    }
    drop(status); // erases the status line before the report
    let duration_s = start.elapsed().as_secs_f64();
    scanner.scan(&mut session, &mut modules, false, true);
    session.detach();
    if let Some(c) = command.as_mut() {
        c.terminate();
    }
    ring.drain()?;
    drop(ring);

    let mut snap = session.snapshot()?;
    let mut vmas = session.vmas()?;
    for (key, path) in session.exec_paths()? {
        // Relative paths were relative to the exec'ing process's directory;
        // kheap's own is the likeliest (the command was started from it).
        modules.add_named(key, &path);
    }
    let mut unwinder = Rc::try_unwrap(unwinder)
        .map_err(|_| anyhow::anyhow!("the stack ring buffer is still in use"))?
        .into_inner();
    unwinder.finish(&vmas, &modules);
    for (mm, read) in unwinder.vmas() {
        let v = vmas.entry(mm).or_default();
        v.extend(read.iter().cloned());
        v.sort_by_key(|v| v.start);
    }
    snap.unwind = session.user_stack_events()?;
    snap.unwind.no_mappings = unwinder.counts.no_mappings;
    snap.unwound = unwinder.stacks;
    let frames = symbolize_return_addresses(
        &report::addresses(&snap),
        &vmas,
        &modules,
        &Blaze::default(),
    );
    let mut report = report::build(
        &snap,
        &frames,
        BuildOptions {
            duration_s,
            run: RunInfo {
                kernel: features::kernel_release(),
                attach: attach_kinds(&session),
                skipped: Vec::new(),
                filters: std::iter::once(describe_targets(&user_pids, &args.targets.command))
                    .chain(cgroups.iter().map(|(c, _)| format!("cgroup {}", c.path)))
                    .collect(),
                command: (!args.targets.command.is_empty()).then(|| args.targets.command.join(" ")),
                kernel_memory_bytes: session.kernel_memory,
            },
            probes: preload
                .iter()
                .map(|p| format!("{}: malloc family (preloaded)", p.path.display()))
                .chain(session.probed_libraries().map(|l| l.describe()))
                .collect(),
            func_names: session.func_names(),
            allocator_code: session.allocator_code(),
            comms: scanner.comms,
            cgroups: scanner.cgroups,
        },
    );
    report.kernel_note = features::malloc_legacy(features::kernel_btf()?);
    drop(session);
    let rows: Vec<BudgetRow> = report
        .sites
        .iter()
        .map(|r| BudgetRow {
            function: r.function.clone(),
            source: None,
            outstanding_bytes: r.outstanding.as_ref().map_or(0, |o| o.bytes),
            allocated_bytes: r.counts.bytes_req,
        })
        .collect();
    let (exit_code, over) = budget::verdict(&args.fail_if, &rows, exit_code);
    write_report(report, &args)?;
    eprint!("{over}");
    Ok(exit_code)
}

/// `run.attach`: "preload" when the command runs with the preload library,
/// "uprobes" when functions of its libraries are probed.
fn attach_kinds(session: &MallocSession) -> Vec<String> {
    let preload = session.preloaded().then(|| "preload".to_string());
    let uprobes = session
        .probed_libraries()
        .next()
        .map(|_| "uprobes".to_string());
    preload.into_iter().chain(uprobes).collect()
}

/// The header's `preloaded …; probes on …`.
fn describe_probes(session: &MallocSession, preload: Option<&PreloadLibrary>) -> String {
    let probed: Vec<String> = session
        .probed_libraries()
        .map(|l| l.path.display().to_string())
        .collect();
    let mut parts = Vec::new();
    if let Some(p) = preload {
        parts.push(format!("preloaded {}", p.path.display()));
    }
    if !probed.is_empty() {
        parts.push(format!("probes on {}", probed.join(", ")));
    }
    parts.join("; ")
}

/// The --cgroup targets, each with the processes in it and below it now.
fn resolve_cgroups(
    args: &[String],
    mount: Option<&std::path::Path>,
) -> Result<Vec<(crate::cgroup::CgroupTarget, Vec<u32>)>> {
    if args.is_empty() {
        return Ok(Vec::new());
    }
    let mount = match mount {
        Some(m) => m.to_path_buf(),
        None => crate::sys::cgroup2_mount()?, // says what is missing
    };
    args.iter()
        .map(|a| {
            let t = crate::cgroup::resolve_target(a, &mount)?;
            let pids = crate::cgroup::pids_in(&mount.join(t.path.trim_start_matches('/')));
            Ok((t, pids))
        })
        .collect()
}

fn describe_targets(pids: &[u32], command: &[String]) -> String {
    let mut parts: Vec<String> = pids.iter().map(|p| format!("PID {p}")).collect();
    if let Some(c) = command.first() {
        parts.push(format!("'{c}'"));
    }
    format!("{} and children", parts.join(", "))
}

fn write_report(mut report: MallocReport, args: &MallocArgs) -> Result<()> {
    let out = &args.output;
    args.json.write(Kind::Malloc, &report, |r| {
        render::apply_top(r, args.by, args.sort, None);
    })?;
    let hidden = render::apply_top(&mut report, args.by, args.sort, out.rows());
    let width = crate::render::table::output_width(out.output());
    let text = match out.format {
        Format::Table => render::table(&report, args.by, hidden, width),
        Format::Json => contract::pretty(Kind::Malloc, &report),
        Format::Folded => render::folded(&report),
        Format::Pprof => {
            let profile = crate::malloc::pprof::profile(&report).encode_gzip();
            return crate::output::emit_bytes(&profile, out.output());
        }
        Format::Svg => crate::render::flame::titled(
            &render::flame_samples(&report),
            args.weight,
            "kheap malloc",
            "allocated",
        ),
    };
    crate::output::emit(&text, out.output())
}
