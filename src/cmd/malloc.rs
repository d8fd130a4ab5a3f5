//! `kheap malloc`: trace the malloc family of a process (or of a command and
//! its children), then print who allocated what, and with --outstanding
//! what was never freed.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::allocators::libraries::initial_libraries;
use crate::contract::{self, Kind};
use crate::kernel::features;
use crate::kernel::malloc::MallocSession;
use crate::kernel::storage::ObjectStorage;
use crate::kernel::user_stack::UserStackRing;
use crate::malloc::preload::{self, PreloadLibrary};
use crate::malloc::render::{self, MallocSortBy};
use crate::malloc::report::{self, BuildOptions, MallocReport};
use crate::malloc::unwind::StackUnwinder;
use crate::render::Format;
use crate::report::budget::{self, BudgetRow};
use crate::report::RunInfo;
use crate::session::status::StatusLine;
use crate::session::{install_stop_handler, stop_requested};
use crate::symbolize::user::{symbolize_return_addresses, Blaze, Modules};
use crate::sys::procmaps;
use crate::target::{find_program, resolve_pid, HeldCommand};

mod args;
mod scanner;

pub use args::MallocArgs;
use scanner::Scanner;

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

pub fn run(args: MallocArgs) -> Result<i32> {
    let mut targets = check(&args)?;
    let preload = preload_for(&args, targets.cgroups.len())?;
    // Held between fork and exec until the probes are attached.
    let mut command = start_command(&args, preload.as_ref(), &mut targets)?;
    let mut storage = ObjectStorage::default();
    let mut session = MallocSession::start(
        &mut storage,
        &targets.pids,
        &targets
            .cgroups
            .iter()
            .map(|(c, _)| c.id)
            .collect::<Vec<_>>(),
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
    for l in &targets.libs {
        session.probe_library(l)?;
    }
    let mut scanner = start_scanner(&args, command.as_ref(), &mut session, &mut targets);
    eprintln!(
        "kheap: tracing malloc in {} ({}){}",
        describe_targets(&targets.user_pids, &args.targets.command),
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

    let mut pace = Pace::new();
    let exit_code = loop {
        let turn = tick(
            &args,
            &mut pace,
            &mut scanner,
            &mut session,
            &mut targets,
            &mut command,
        );
        if let Some(code) = turn {
            break code;
        }
        ring.poll(Duration::from_millis(10))?;
    };
    let duration_s = pace.start.elapsed().as_secs_f64();
    drop(pace); // erases the status line before the report
    scanner.scan(&mut session, &mut targets.modules, false, true);
    session.detach();
    if let Some(c) = command.as_mut() {
        c.terminate();
    }
    ring.drain()?;
    drop(ring);
    let unwinder = Rc::try_unwrap(unwinder)
        .map_err(|_| anyhow::anyhow!("the stack ring buffer is still in use"))?
        .into_inner();
    let report = finish(
        &args,
        &session,
        unwinder,
        scanner,
        targets,
        preload.as_ref(),
        duration_s,
    )?;
    drop(session);
    let (exit_code, over) = budget::verdict(&args.fail_if, &budget_rows(&report), exit_code);
    write_report(report, &args)?;
    eprint!("{over}");
    Ok(exit_code)
}

/// What is traced, as the arguments name it: the processes, cgroups and
/// allocator files, and the mappings their addresses will be read by.
struct Targets {
    cgroup_mount: Option<PathBuf>,
    cgroups: Vec<(crate::cgroup::CgroupTarget, Vec<u32>)>,
    /// The processes named by -p and --cgroup.
    user_pids: Vec<u32>,
    /// Those and the command kheap starts.
    pids: Vec<u32>,
    libs: Vec<PathBuf>,
    modules: Modules,
}

/// What can be refused before anything is started or attached.
fn check(args: &MallocArgs) -> Result<Targets> {
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
    let libs = initial_libraries(args.lib.as_deref(), &user_pids, &args.targets.command)?;
    let mut modules = Modules::default();
    for &pid in &user_pids {
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
    Ok(Targets {
        cgroup_mount,
        cgroups,
        pids: user_pids.clone(),
        user_pids,
        libs,
        modules,
    })
}

/// The command, forked and held before its exec (with the preload
/// library in its environment) until the probes are attached.
fn start_command(
    args: &MallocArgs,
    preload: Option<&PreloadLibrary>,
    targets: &mut Targets,
) -> Result<Option<HeldCommand>> {
    if args.targets.command.is_empty() {
        return Ok(None);
    }
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
    targets
        .modules
        .add_file(&find_program(&args.targets.command[0])?);
    targets.pids.push(held.pid);
    Ok(Some(held))
}

/// The scanner that follows the traced processes, after its first scan.
fn start_scanner(
    args: &MallocArgs,
    command: Option<&HeldCommand>,
    session: &mut MallocSession,
    targets: &mut Targets,
) -> Scanner {
    let mut scanner = Scanner::new(targets.cgroup_mount.take());
    if let Some(c) = command {
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
    scanner.scan(session, &mut targets.modules, args.lib.is_none(), false);
    scanner
}

/// When the wait scans the traced processes and redraws the status line.
struct Pace {
    start: Instant,
    next_scan: Instant,
    next_status: Instant,
    status: StatusLine,
}

impl Pace {
    fn new() -> Pace {
        let start = Instant::now();
        Pace {
            start,
            next_scan: start + SCAN_EVERY,
            next_status: start + Duration::from_secs(1),
            status: StatusLine::new(),
        }
    }
}

/// One turn of the wait: scan the processes and show the status line when
/// due; the exit code once the run is over (a signal, the command's exit,
/// the traced processes' or the duration's end).
fn tick(
    args: &MallocArgs,
    pace: &mut Pace,
    scanner: &mut Scanner,
    session: &mut MallocSession,
    targets: &mut Targets,
    command: &mut Option<HeldCommand>,
) -> Option<i32> {
    if Instant::now() >= pace.next_scan {
        scanner.scan(session, &mut targets.modules, args.lib.is_none(), false);
        pace.next_scan += SCAN_EVERY;
    }
    if Instant::now() >= pace.next_status {
        pace.status
            .show(pace.start.elapsed(), || session.progress());
        pace.next_status += Duration::from_secs(1);
    }
    if stop_requested() {
        eprintln!("kheap: stopped by signal; reporting what was recorded");
        return Some(0);
    }
    if let Some(code) = command.as_mut().and_then(|c| c.try_wait()) {
        if code != 0 {
            eprintln!("kheap: the command exited with status {code}");
        }
        return Some(code);
    }
    if command.is_none() && crate::tree::all_exited(&targets.user_pids) {
        eprintln!("kheap: the traced process exited; reporting what was recorded");
        return Some(0);
    }
    if args.duration.is_some_and(|d| pace.start.elapsed() >= d) {
        return Some(0);
    }
    None
}

/// The report of the run, from the kernel's maps, the unwound stacks and
/// the mappings read while it went on.
fn finish(
    args: &MallocArgs,
    session: &MallocSession,
    mut unwinder: StackUnwinder,
    scanner: Scanner,
    mut targets: Targets,
    preload: Option<&PreloadLibrary>,
    duration_s: f64,
) -> Result<MallocReport> {
    let mut snap = session.snapshot()?;
    let mut vmas = session.vmas()?;
    for (key, path) in session.exec_paths()? {
        // Relative paths were relative to the exec'ing process's directory;
        // kheap's own is the likeliest (the command was started from it).
        targets.modules.add_named(key, &path);
    }
    unwinder.finish(&vmas, &targets.modules);
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
        &targets.modules,
        &Blaze::default(),
    );
    let mut report = report::build(
        &snap,
        &frames,
        BuildOptions {
            duration_s,
            run: RunInfo {
                kernel: features::kernel_release(),
                attach: attach_kinds(session),
                skipped: Vec::new(),
                filters: std::iter::once(describe_targets(
                    &targets.user_pids,
                    &args.targets.command,
                ))
                .chain(
                    targets
                        .cgroups
                        .iter()
                        .map(|(c, _)| format!("cgroup {}", c.path)),
                )
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
    report.kernel_note = features::malloc_kernel_note(features::kernel_btf()?);
    Ok(report)
}

/// What --fail-if is checked against: each row's outstanding and
/// requested bytes.
fn budget_rows(report: &MallocReport) -> Vec<BudgetRow> {
    report
        .sites
        .iter()
        .map(|r| BudgetRow {
            function: r.function.clone(),
            source: None,
            outstanding_bytes: r.outstanding.as_ref().map_or(0, |o| o.bytes),
            allocated_bytes: r.counts.bytes_req,
        })
        .collect()
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
