//! Helpers for the root tests: run the real kheap binary against the real
//! kernel and read its JSON.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod cgroup;
pub mod schema;
pub mod tmux;
pub mod workload;

pub const KHEAP: &str = env!("CARGO_BIN_EXE_kheap");
pub const LOAD: &str = env!("CARGO_BIN_EXE_kheap-load");

/// The possible CPUs, what the kernel sizes per-CPU storage for
/// (`/sys/devices/system/cpu/possible`: "0-1", "0", "0-3,8-11").
pub fn possible_cpus() -> u64 {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    text.trim()
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<u64>().unwrap() - a.parse::<u64>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

/// These tests load BPF programs into the running kernel, so they need root.
/// Without it they fail: a test that returned early would count as a pass.
pub fn require_root() {
    assert!(
        unsafe { libc::geteuid() } == 0,
        "this test loads BPF programs into the kernel and needs root: run the suite with `sudo scripts/test`"
    );
    stop_beside_another_kheap();
}

/// Another kheap on the machine (the packaged `kheap serve`, another
/// user's run) traces the same kernel: it shares tracefs, the kernel's BPF
/// statistics and the machine's allocations with these tests, which then
/// fail each in its own way. So the first root test of a run looks, and
/// with another kheap running the whole run stops at once, in one line
/// that names it. kheap processes this run started are its own.
fn stop_beside_another_kheap() {
    static CHECKED: std::sync::Once = std::sync::Once::new();
    CHECKED.call_once(|| {
        if let Some((pid, cmdline)) = another_kheap() {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "kheap tests: another kheap is running (pid {pid}: {cmdline}); the root tests \
                 count what the kernel does and would fail beside it: stop it, then run them again"
            );
            std::process::exit(2);
        }
    });
}

/// A live process named `kheap` that this process did not start (directly
/// or not), with its command line. A zombie (one that ended, not yet
/// reaped) traces nothing and does not count.
pub fn another_kheap() -> Option<(u32, String)> {
    let me = std::process::id();
    let stat_of = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
    let parent =
        |pid: u32| -> Option<u32> { kheap::sys::stat_field(&stat_of(pid)?, 4)?.parse().ok() };
    let alive = |pid: u32| {
        stat_of(pid).is_some_and(|s| !matches!(kheap::sys::stat_field(&s, 3), Some("Z" | "X")))
    };
    let started_here = |pid: u32| {
        let mut p = pid;
        // Parents are older, so the walk ends (at 1, or a vanished one).
        for _ in 0..4096 {
            if p == me {
                return true;
            }
            match parent(p) {
                Some(pp) if pp > 0 && pp != p => p = pp,
                _ => return false,
            }
        }
        false
    };
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim_end() == "kheap")
        })
        .find(|&pid| alive(pid) && !started_here(pid))
        .map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let words: Vec<String> = raw
                .split(|&b| b == 0)
                .filter(|w| !w.is_empty())
                .map(|w| String::from_utf8_lossy(w).into_owned())
                .collect();
            // Empty while it execs: its name then.
            let cmdline = match words.join(" ") {
                c if c.is_empty() => "kheap".to_string(),
                c => c,
            };
            (pid, cmdline.chars().take(200).collect())
        })
}

/// Says that the test could check only part of what it covers here (e.g.
/// the kernel has no kprobes, so only the refusal is checked). Written to
/// the real stderr, past the harness's output capture, so the line shows in
/// the test run's output even when the test passes.
pub fn partial_check(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "kheap test: PARTIAL CHECK: {why}");
}

/// How long a child may take to exit before the test calls it hung.
pub const HANG_LIMIT: Duration = Duration::from_secs(60);

/// Waits for `child` to exit, for at most `limit`, and collects what it
/// printed on the pipes still attached. A child still running at the limit
/// is killed (with its process group when it leads one) and the test fails:
/// a hang must fail the test, not hang the suite.
pub fn wait_bounded(mut child: Child, limit: Duration) -> Output {
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let status = wait_or_kill(&mut child, limit);
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// Waits for `child` to exit, for at most `limit`; kills it and fails the
/// test if it is still running then.
pub fn wait_or_kill(child: &mut Child, limit: Duration) -> ExitStatus {
    if let Some(status) = exit_within(child, limit) {
        return status;
    }
    let pid = child.id() as i32;
    let target = if unsafe { libc::getpgid(pid) } == pid {
        -pid
    } else {
        pid
    };
    unsafe { libc::kill(target, libc::SIGKILL) };
    let _ = child.wait();
    panic!("process {pid} was still running after {limit:?} (hung?); killed it");
}

/// The exit status of `child` if it exits within `limit`.
pub fn exit_within(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let mut status = None;
    poll_until(limit, || {
        status = child.try_wait().expect("waiting for a child");
        status.is_some()
    });
    status
}

/// Checks `done` every 20 ms until it holds (true) or `limit` has passed
/// (false): the one polling loop of the tests' bounded waits.
pub fn poll_until(limit: Duration, done: impl FnMut() -> bool) -> bool {
    poll_every(limit, Duration::from_millis(20), done)
}

/// `poll_until` at a pace of the caller's: for a condition whose check is
/// itself costly (a scrape of /metrics).
pub fn poll_every(limit: Duration, pace: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(pace);
    }
}

/// The row of `kheap doctor`'s table whose feature is `feature` (asserts
/// that doctor succeeds and has it).
pub fn doctor_row(feature: &str) -> String {
    let out = kheap(&["doctor"]);
    assert_ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.contains(feature))
        .unwrap_or_else(|| panic!("no {feature:?} row: {text}"))
        .to_string()
}

/// Whether the running kernel is older than `major.minor`.
pub fn kernel_before(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap(), parts.next().unwrap()) < (major, minor)
}

/// Whether this kernel lacks BPF features `kheap malloc` needs
/// (bpf_probe_read_user 5.5, ring buffers 5.8; src/kernel/features.rs): it
/// then refuses in one line. Kernels from 5.8 to 5.16 run it on its legacy
/// path, with the same counts.
pub fn malloc_unsupported() -> bool {
    kernel_before(5, 8)
}

/// On a kernel without malloc's BPF features (`malloc_unsupported`): runs
/// `kheap malloc ARGS`, asserts that it refuses in one line naming what the
/// kernel lacks (and starts nothing), says that `test` checked only that,
/// and returns true: the test then ends. Elsewhere returns false at once.
pub fn malloc_refused_here(test: &str, args: &[&str]) -> bool {
    if !malloc_unsupported() {
        return false;
    }
    let mut all = vec!["malloc"];
    all.extend(args);
    let out = kheap(&all);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "kheap {all:?} ran here: {err}");
    assert!(
        err.contains("malloc needs BPF features this kernel (")
            && err.contains("BPF ring buffers (5.8)"),
        "kheap {all:?}: {err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(out.stdout.is_empty(), "no report on error");
    partial_check(&format!(
        "{test}: this kernel lacks BPF features kheap malloc needs; only its one-line refusal was checked"
    ));
    true
}

pub fn kheap(args: &[&str]) -> Output {
    Command::new(KHEAP)
        .args(args)
        .output()
        .expect("running kheap")
}

/// Runs `kheap record ARGS --format json -o FILE -- kheap-load LOAD_ARGS`
/// and parses the report (a file, so the command's own output can't mix in).
pub fn record_json(args: &[&str], load_args: &[&str]) -> Value {
    report_json("record", args, load_args)
}

/// A report's `run.attach` lines ("kmalloc: tp_btf", …).
pub fn attach_lines(report: &Value) -> Vec<&str> {
    report["run"]["attach"]
        .as_array()
        .expect("run.attach")
        .iter()
        .map(|a| a.as_str().expect("an attach line"))
        .collect()
}

/// The attach line of one hook: "kmalloc: tp_btf" for "kmalloc".
pub fn attach_line<'a>(report: &'a Value, hook: &str) -> &'a str {
    attach_lines(report)
        .into_iter()
        .find(|a| {
            a.strip_prefix(hook)
                .is_some_and(|how| how.starts_with(": "))
        })
        .unwrap_or_else(|| panic!("no attach line of {hook}: {}", report["run"]["attach"]))
}

/// Asserts that a kheap run succeeded, showing its stderr when not.
#[track_caller]
pub fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "kheap failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `kheap SUBCOMMAND --format json -o FILE ARGS -- kheap-load LOAD_ARGS`:
/// asserts success and returns the report written, checked against its
/// schema.
pub fn report_json(subcommand: &str, args: &[&str], load_args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--");
    all.push(LOAD);
    all.extend(load_args);
    json_report(subcommand, &all)
}

/// Runs `kheap SUBCOMMAND --format json -o FILE ARGS…` and parses the
/// report, checked against its schema.
pub fn json_report(subcommand: &str, args: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    let mut all = vec![subcommand, "--format", "json", "-o", path.to_str().unwrap()];
    all.extend(args);
    let out = kheap(&all);
    assert!(
        out.status.success(),
        "kheap {all:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&path).expect("kheap wrote no report");
    parse_valid(&text)
}

/// Parses one kheap JSON document (a report, or one line of a stream) and
/// checks it against the schema of its kind (schema/).
pub fn parse_valid(text: &str) -> Value {
    let v: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("kheap wrote invalid JSON ({e}): {text}"));
    schema::assert_valid(&v);
    v
}

/// The caches kheap-load msg's 2100-byte messages (4 KiB objects) can live
/// in, as a regular expression (pprof's -tagfocus): a kmalloc size class
/// (kmalloc-4k; kmalloc-cg-4k where charged; a kmalloc-rnd-NN-4k copy) or,
/// since 6.11, msg_msg's own bucket cache (msg_msg-4k). Which one a kernel
/// uses, tests/kernel_dependent/cache_names.rs checks against /proc/slabinfo.
pub const MSG_CACHE_RE: &str = "^(kmalloc-(cg-|rnd-[0-9]+-)?|msg_msg-)4k$";

/// The object size kmalloc gives a request of `bytes`: the smallest
/// kmalloc-N size class this kernel has (/proc/slabinfo) that holds it.
/// 144 bytes take 192 on x86-64, 256 on arm64 before 6.5, which has no
/// kmalloc-192 (its smallest class was the 128-byte cache line).
pub fn kmalloc_object_size(bytes: u64) -> u64 {
    let slabinfo = std::fs::read_to_string("/proc/slabinfo").expect("reading /proc/slabinfo");
    slabinfo
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .next()?
                .strip_prefix("kmalloc-")?
                .parse()
                .ok()
        })
        .filter(|&n: &u64| n >= bytes)
        .min()
        .unwrap_or_else(|| {
            panic!("no kmalloc size class of at least {bytes} bytes in /proc/slabinfo")
        })
}

/// Whether `name` is one of the caches of `MSG_CACHE_RE`.
pub fn is_msg_cache(name: &str) -> bool {
    let Some(class) = name.strip_suffix("4k") else {
        return false;
    };
    match class.strip_prefix("kmalloc-rnd-") {
        Some(n) => n
            .strip_suffix('-')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
        None => matches!(class, "kmalloc-" | "kmalloc-cg-" | "msg_msg-"),
    }
}

/// The function whose call allocates a SysV message's kmalloc, the site
/// kheap names for it: `load_msg` where the kernel inlines `alloc_msg` into
/// it (Debian's builds), else `alloc_msg` (Ubuntu 22.04's 5.15). Read from
/// this kernel's symbols once.
pub fn msg_fn() -> &'static str {
    static NAME: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        let syms = std::fs::read_to_string("/proc/kallsyms").expect("/proc/kallsyms");
        let alloc_msg_exists = syms.lines().any(|l| {
            let mut f = l.split_whitespace().skip(1);
            matches!(f.next(), Some("t" | "T")) && f.next().map(base_name) == Some("alloc_msg")
        });
        if alloc_msg_exists {
            "alloc_msg"
        } else {
            "load_msg"
        }
    })
}

/// A kernel function's name without the compiler's clone suffixes
/// (`iovec_from_user.part.0` on 6.1 and 6.12 is `iovec_from_user` on 6.18).
pub fn base_name(name: &str) -> &str {
    name.split_once('.').map_or(name, |(base, _)| base)
}

/// The entries of `list` whose function is `name` (clone suffixes ignored).
pub fn rows_of_fn<'a>(report: &'a Value, list: &str, name: &str) -> Vec<&'a Value> {
    report[list]
        .as_array()
        .unwrap_or_else(|| panic!("no {list} in report"))
        .iter()
        .filter(|r| r["function"].as_str().is_some_and(|f| base_name(f) == name))
        .collect()
}

/// The entries of `list` whose `field` is `value`.
pub fn rows<'a>(report: &'a Value, list: &str, field: &str, value: &str) -> Vec<&'a Value> {
    report[list]
        .as_array()
        .unwrap_or_else(|| panic!("no {list} in report"))
        .iter()
        .filter(|r| r[field] == value)
        .collect()
}

/// A stack row's frames, innermost first.
pub fn frames(row: &Value) -> Vec<&str> {
    row["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect()
}

pub fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// IDs of the BPF programs a process holds (from its fdinfo).
pub fn bpf_prog_ids(pid: u32) -> Vec<u32> {
    let mut ids = Vec::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return ids;
    };
    for entry in dir.flatten() {
        if let Ok(info) = std::fs::read_to_string(entry.path()) {
            for line in info.lines() {
                if let Some(id) = line.strip_prefix("prog_id:") {
                    if let Ok(id) = id.trim().parse() {
                        ids.push(id);
                    }
                }
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Whether a BPF program with this id is still loaded in the kernel.
pub fn prog_loaded(id: u32) -> bool {
    let out = Command::new("bpftool")
        .args(["prog", "show", "id", &id.to_string()])
        .output()
        .expect("bpftool is needed by the tests (scripts/setup installs it)");
    out.status.success()
}

/// Asserts that none of these BPF programs stays loaded once the process
/// that held them has detached or exited. The kernel frees a program when
/// its last reference goes, and some references (a perf event's, a link's
/// on some kernels) go only after an RCU grace period or from a workqueue:
/// a program can outlive its process by a moment, so this waits (bounded)
/// before it says one was left behind.
pub fn assert_unloaded(ids: &[u32], after: &str) {
    assert!(!ids.is_empty(), "no program ids to check {after}");
    poll_every(HANG_LIMIT, Duration::from_millis(100), || {
        ids.iter().all(|&id| !prog_loaded(id))
    });
    let left: Vec<String> = ids
        .iter()
        .filter(|&&id| prog_loaded(id))
        .map(|id| {
            let out = Command::new("bpftool")
                .args(["prog", "show", "id", &id.to_string()])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .collect();
    assert!(
        left.is_empty(),
        "BPF programs still loaded {after}: {left:?}"
    );
}

/// Starts `kheap ARGS` in the background (in its own process group) and
/// returns once it says it is tracing; its stderr keeps being drained.
pub fn spawn_tracing(args: &[&str]) -> Child {
    let mut child = Command::new(KHEAP)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("starting kheap");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            panic!("kheap {args:?} exited before tracing: {seen}");
        }
        seen.push_str(&line);
        if line.contains("tracing") {
            break;
        }
    }
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    child
}

/// A background process whose stderr lines are collected; interrupted
/// (SIGINT, so kheap detaches and reports) and reaped when dropped, so a
/// failing test leaves nothing attached.
pub struct Background {
    pub child: Child,
    lines: Receiver<String>,
    pub seen: Vec<String>,
}

impl Background {
    pub fn spawn(program: &str, args: &[&str]) -> Background {
        let mut child = Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {program}: {e}"));
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Background {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a stderr line containing `needle`.
    pub fn wait_for(&mut self, needle: &str) -> String {
        self.wait_for_within(needle, HANG_LIMIT)
    }

    /// Waits at most `limit` for a stderr line containing `needle` (a
    /// kheap loading every source took over 20 s to start under TCG on
    /// 6.1: a limit above HANG_LIMIT is for such starts).
    pub fn wait_for_within(&mut self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => break,
            }
        }
        panic!("no line with {needle:?} on stderr; saw {:#?}", self.seen);
    }

    pub fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Waits for the process to exit (killing it and failing the test if it
    /// is still running after HANG_LIMIT); returns whether it succeeded.
    pub fn wait(&mut self) -> bool {
        let status = wait_or_kill(&mut self.child, HANG_LIMIT);
        while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.seen.push(line);
        }
        status.success()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.signal(libc::SIGINT);
            // Killed after the limit rather than hanging the suite; no
            // panic here, the test has already failed or finished.
            if exit_within(&mut self.child, HANG_LIMIT).is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
    }
}

/// Runs headless chromium with ARGS on URL in a fresh profile (a directory
/// of the test's); its stdout. No background networking: this machine
/// reaches no host but the package registries.
pub fn chromium(args: &[&str], url: &str, profile: &std::path::Path) -> String {
    let child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium (scripts/setup installs it)");
    let out = wait_bounded(child, Duration::from_secs(120));
    assert!(out.status.success(), "chromium {args:?} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `go tool pprof ARGS SOURCE` (a profile's file, or a URL pprof fetches
/// itself) with the environment Go needs: a HOME and cache of its own
/// (where pprof also saves what it fetched), no toolchain download. Its
/// output; a failure fails the test.
pub fn go_pprof(args: &[&str], source: impl AsRef<std::ffi::OsStr>) -> String {
    let home = tempfile::tempdir().unwrap();
    let out = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(source.as_ref())
        .env("HOME", home.path())
        .env("GOCACHE", home.path().join("cache"))
        .env("GOTOOLCHAIN", "local")
        .stdin(Stdio::null())
        .output()
        .expect("running go tool pprof (scripts/setup installs golang-go)");
    assert!(
        out.status.success(),
        "go tool pprof {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
