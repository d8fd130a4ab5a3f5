//! Helpers for the root tests: run the real kheap binary against the real
//! kernel and read its JSON.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod schema;

pub const KHEAP: &str = env!("CARGO_BIN_EXE_kheap");
pub const LOAD: &str = env!("CARGO_BIN_EXE_kheap-load");

/// These tests load BPF programs. Without root they cannot run; they say so
/// loudly instead of passing quietly (CI runs them as root).
pub fn require_root(test: &str) -> bool {
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    eprintln!("\n*** SKIPPED {test}: needs root to load BPF programs (CI runs it as root) ***\n");
    false
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
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    let mut all = vec!["record", "--format", "json", "-o", path.to_str().unwrap()];
    all.extend(args);
    all.push("--");
    all.push(LOAD);
    all.extend(load_args);
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
        let deadline = Instant::now() + Duration::from_secs(20);
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

    /// Waits for the process to exit; returns whether it succeeded.
    pub fn wait(&mut self) -> bool {
        let status = self.child.wait().expect("waiting for a child");
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
            let _ = self.child.wait();
        }
    }
}
