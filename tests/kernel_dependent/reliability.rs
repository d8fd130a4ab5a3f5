//! Root tests for issue 16 against the real kernel: what ends a run, what a
//! run leaves behind, and reports that say when they are incomplete.

use crate::common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;

/// PIDs of `sleep ARG` processes (ARG unique to a test).
fn sleeps(arg: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let argv: Vec<&[u8]> = argv.split(|&b| b == 0).collect();
        if argv.len() >= 2 && argv[0].ends_with(b"sleep") && argv[1] == arg.as_bytes() {
            // A zombie is gone already: only running ones count.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if !stat
                .rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            {
                found.push(pid);
            }
        }
    }
    found
}

/// Kills what a failed test left (only this test's sleeps).
struct SleepsGuard(Vec<&'static str>);

impl Drop for SleepsGuard {
    fn drop(&mut self) {
        for arg in &self.0 {
            for pid in sleeps(arg) {
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
    }
}

/// Waits (without timing anything) for the kernel to reap what was killed.
fn gone(arg: &str) -> bool {
    poll_until(Duration::from_secs(5), || sleeps(arg).is_empty())
}

#[test]
fn the_command_tree_ends_with_the_run() {
    require_root();
    let _guard = SleepsGuard(vec!["3131", "3132", "3133"]);
    // The case: -d ends the run while the tree still runs; one
    // child daemonizes (setsid) out of the command's session.
    let out = kheap(&[
        "record",
        "-d",
        "1",
        "-o",
        "/dev/null",
        "--",
        "sh",
        "-c",
        "sleep 3131 & setsid sleep 3132 & sleep 3133; wait",
    ]);
    assert_ok(&out);
    for arg in ["3131", "3132", "3133"] {
        assert!(gone(arg), "sleep {arg} outlived the run");
    }
}

#[test]
fn the_command_tree_ends_when_kheap_is_killed() {
    require_root();
    let _guard = SleepsGuard(vec!["3141", "3142"]);
    let mut child = spawn_tracing(&[
        "record",
        "-o",
        "/dev/null",
        "--",
        "sh",
        "-c",
        "setsid sleep 3141 & sleep 3142; wait",
    ]);
    // Both sleeps run before kheap is killed.
    assert!(
        poll_until(Duration::from_secs(4), || {
            !sleeps("3141").is_empty() && !sleeps("3142").is_empty()
        }),
        "the command did not start"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        gone("3141"),
        "the daemonized child outlived kheap's SIGKILL"
    );
    assert!(gone("3142"), "the command outlived kheap's SIGKILL");
}

/// When kheap dies, its guard ends the tree as kheap would have: SIGTERM
/// first, so a command that cleans up on it (kheap-load removes its SysV
/// queues, which outlive processes) gets to, then SIGKILL for what is left.
#[test]
fn the_command_is_asked_to_stop_before_it_is_killed_when_kheap_dies() {
    require_root();
    let _guard = SleepsGuard(vec!["3144"]);
    let dir = tempfile::tempdir().unwrap();
    let (ready, stopped) = (dir.path().join("ready"), dir.path().join("stopped"));
    let script = format!(
        "trap 'echo TERM > {s}; exit 0' TERM; sleep 3144 & echo > {r}; wait",
        s = stopped.display(),
        r = ready.display()
    );
    let mut child = spawn_tracing(&["record", "-o", "/dev/null", "--", "sh", "-c", &script]);
    assert!(
        poll_until(Duration::from_secs(60), || ready.exists()),
        "the command did not start"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(gone("3144"), "the command's child outlived kheap's SIGKILL");
    assert_eq!(
        std::fs::read_to_string(&stopped).unwrap_or_default(),
        "TERM\n",
        "the command was killed without a SIGTERM first"
    );
}

#[test]
fn keep_running_leaves_the_tree() {
    require_root();
    let _guard = SleepsGuard(vec!["3151"]);
    let out = Command::new(KHEAP)
        .args([
            "record",
            "-d",
            "1",
            "--keep-running",
            "-o",
            "/dev/null",
            "--",
        ])
        .args(["sh", "-c", "sleep 3151 & wait"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(out.success());
    assert_eq!(sleeps("3151").len(), 1, "--keep-running ended the tree");
}

#[test]
fn a_full_map_makes_the_report_say_it_is_incomplete() {
    require_root();
    let r = record_json(&["--max-entries", "4"], &["msg", "1000", "1000"]);
    assert!(u(&r["lost"]["map_full_sites"]) > 0, "{}", r["lost"]);
    assert_eq!(r["sampling"]["sites_exact"], false);
    let incomplete = r["sampling"]["incomplete"].as_array().unwrap();
    assert!(
        incomplete[0]
            .as_str()
            .unwrap()
            .contains("not counted (site map full)"),
        "{incomplete:?}"
    );
    // The table's header says so first, and claims no exactness.
    let out = kheap(&[
        "record",
        "--max-entries",
        "4",
        "--",
        LOAD,
        "msg",
        "1000",
        "1000",
    ]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.starts_with("INCOMPLETE: "), "{table}");
    assert!(!table.contains("processes are exact"), "{table}");
    // With room enough, it is exact and says nothing.
    let r = record_json(&[], &["msg", "1000", "1000"]);
    assert_eq!(r["sampling"]["sites_exact"], true);
    assert_eq!(r["sampling"]["incomplete"].as_array().unwrap().len(), 0);
}

#[test]
fn bad_output_is_refused_before_tracing() {
    require_root();
    for args in [
        &["record", "-o", "/nonexistent/x", "-d", "4"][..],
        &["leaks", "-o", "/nonexistent/x", "-d", "4"],
        &["malloc", "-o", "/nonexistent/x", "--", "true"],
    ] {
        let out = kheap(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("does not exist"), "{err}");
        assert!(!err.contains("tracing"), "traced before refusing: {err}");
    }
}

#[test]
fn runs_end_when_every_pid_has_exited() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    for sub in ["record", "leaks", "top"] {
        // The target lives until kheap traces it (kheap took over 3 s to
        // start in the arm64 guest, after a `sleep 3` had ended), then ends.
        let mut target = Command::new("sleep").arg("600").spawn().unwrap();
        let pid = target.id().to_string();
        let path = dir.path().join(format!("{sub}.json"));
        let mut args = vec![sub, "-p", &pid, "--format", "json"];
        args.extend(["-o", path.to_str().unwrap()]);
        if sub == "top" {
            args.extend(["-b", "-i", "1"]);
        }
        let mut kh = Background::spawn(KHEAP, &args);
        kh.wait_for("tracing");
        target.kill().unwrap();
        target.wait().unwrap();
        // No -d: only the PID's exit ends the run (a hang fails the test
        // after a minute rather than forever).
        poll_every(Duration::from_secs(60), Duration::from_millis(50), || {
            kh.child.try_wait().unwrap().is_some()
        });
        if kh.child.try_wait().unwrap().is_none() {
            panic!("kheap {sub} -p {pid} went on after the process exited");
        }
        assert!(kh.wait(), "{sub}: {:#?}", kh.seen);
        assert!(
            kh.seen
                .iter()
                .any(|l| l.contains("every traced process (-p) exited")),
            "{sub}: {:#?}",
            kh.seen
        );
        let text = std::fs::read_to_string(&path).unwrap();
        if sub != "top" {
            serde_json::from_str::<Value>(&text).unwrap_or_else(|e| panic!("{sub}: {e}: {text}"));
        } else {
            let first = text.lines().next().unwrap_or("");
            serde_json::from_str::<Value>(first).unwrap_or_else(|e| panic!("{e}: {text}"));
        }
    }
}

#[test]
fn sigusr1_does_not_cost_the_report() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    for sub in ["record", "top"] {
        let path = dir.path().join(format!("{sub}.json"));
        let out = std::fs::File::create(&path).unwrap();
        let mut args = vec![sub, "--format", "json"];
        if sub == "top" {
            args.extend(["-b", "-i", "0.2"]);
        }
        let mut child = Command::new(KHEAP)
            .args(&args)
            .stdout(out)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut err, &mut line).unwrap();
        assert!(line.contains("tracing"), "{line}");
        unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
        // No wait for the SIGUSR1 to act: a signal whose default action
        // kills the process dooms it when it is sent (the kernel marks the
        // group exiting at once), so a kheap that does not ignore it ends
        // killed by SIGUSR1 whatever comes after, and a fixed wait here
        // would prove nothing more.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let status = wait_or_kill(&mut child, HANG_LIMIT);
        assert_ne!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGUSR1),
            "{sub} died of SIGUSR1"
        );
        assert!(status.success(), "{sub}: {status}");
        let text = std::fs::read_to_string(&path).unwrap();
        let first = text.lines().next().unwrap_or("");
        let json = if sub == "top" { first } else { &text };
        serde_json::from_str::<Value>(json).unwrap_or_else(|e| panic!("{sub}: {e}: {text}"));
    }
}

#[test]
fn slab_sampling_reports_after_a_signal() {
    require_root();
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        let mut child = Command::new(KHEAP)
            .args(["slab", "-d", "10", "--no-trace", "--format", "json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A fixed sleep was not enough under TCG: the signal came before
        // kheap had started. The sampling line says it has.
        let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut err, &mut line).unwrap();
        assert!(line.contains("sampling /proc/slabinfo"), "{line}");
        unsafe { libc::kill(child.id() as i32, sig) };
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "signal {sig}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let r: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(!r["caches"].as_array().unwrap().is_empty());
    }
}

#[test]
fn the_command_process_is_named_after_exec() {
    require_root();
    let r = record_json(&["--by", "process"], &["msg", "100", "100"]);
    let procs = r["processes"].as_array().unwrap();
    assert!(procs.iter().any(|p| p["comm"] == "kheap-load"), "{procs:?}");
    assert!(!procs.iter().any(|p| p["comm"] == "kheap"), "{procs:?}");
}

#[test]
fn a_short_leaks_run_has_a_real_duration_and_no_absurd_rate() {
    require_root();
    let r = report_json("leaks", &[], &["msg", "100", "1000"]);
    let duration = r["duration_s"].as_f64().unwrap();
    assert!(duration > 0.0, "{duration}");
    let l = &r["leaks"];
    let oldest = l["oldest_s"].as_f64().unwrap();
    assert!((0.0..=duration).contains(&oldest), "{l}");
    if duration < 1.0 {
        assert_eq!(l["growth_bytes_per_s"].as_f64(), Some(0.0), "{l}");
    }
}

#[test]
fn malloc_max_outstanding_sizes_the_block_map() {
    require_root();
    if malloc_refused_here(
        "malloc_max_outstanding_sizes_the_block_map",
        &[
            "--outstanding",
            "--max-outstanding",
            "4",
            "--",
            LOAD,
            "malloc",
            "1000",
            "64",
        ],
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.json");
    let json = |max: &str| -> Value {
        let out = kheap(&[
            "malloc",
            "--outstanding",
            "--max-outstanding",
            max,
            "--format",
            "json",
            "-o",
            path.to_str().unwrap(),
            "--",
            LOAD,
            "malloc",
            "1000",
            "64",
        ]);
        assert_ok(&out);
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
    };
    // kheap-load malloc keeps its 1000 blocks until it exits: 4 slots are
    // not enough, 100000 are.
    let small = json("4");
    assert!(u(&small["lost"]["map_full_live"]) > 0, "{}", small["lost"]);
    let large = json("100000");
    assert_eq!(u(&large["lost"]["map_full_live"]), 0, "{}", large["lost"]);
}

#[test]
fn doctor_without_root_says_what_it_cannot_tell() {
    require_root();
    use std::os::unix::process::CommandExt;
    let out = Command::new(KHEAP)
        .arg("doctor")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mounted = std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split_whitespace().nth(2) == Some("tracefs"));
    if mounted {
        assert!(!text.contains("not mounted"), "{text}");
    }
    // Without root, an unreadable tracefs is no evidence of missing events.
    for line in text.lines().filter(|l| l.contains("kmem:")) {
        assert!(!line.contains("tracepoint: no"), "{line}");
    }
    assert!(
        text.contains("cannot tell without root") || text.contains("tracepoint: yes"),
        "{text}"
    );
}

#[test]
fn doctor_names_the_mechanism_record_attaches_kmalloc_with() {
    require_root();
    let row = doctor_row("kheap record attaches with");
    let report = json_report("record", &["-d", "0.2"]);
    let kmalloc = report["run"]["attach"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|a| a.as_str()?.strip_prefix("kmalloc: "))
        .unwrap_or_else(|| panic!("kmalloc not attached: {:#}", report["run"]));
    // The row's value begins with the mechanism (tp_btf, raw_tp, tracepoint).
    let value = row.split('┆').nth(1).unwrap_or_default().trim_start();
    assert!(
        value.starts_with(&format!("{kmalloc} (loaded and attached")),
        "doctor: {row}; record attached kmalloc with {kmalloc}"
    );
}

/// Beside another kheap (a packaged `kheap serve`, say) the root tests
/// would fail each in its own way: the run stops at once, in one line that
/// names the other kheap's pid. A process named kheap that this test did
/// not start (a copy of sleep, orphaned by a shell) stands in for it; this
/// binary, run again on one of its root tests, must stop there.
#[test]
fn the_root_tests_stop_in_one_line_beside_another_kheap() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("kheap");
    std::fs::copy("/bin/sleep", &fake).unwrap();
    // Killed, and gone from the process table, whatever the test's end.
    struct Killed(std::path::PathBuf);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = Command::new("pkill")
                .args(["-KILL", "-f", &format!("^{} 3149$", self.0.display())])
                .status();
            poll_until(Duration::from_secs(10), || another_kheap().is_none());
        }
    }
    let _guard = Killed(fake.clone());
    let shell = Command::new("sh")
        .args([
            "-c",
            &format!("'{}' 3149 </dev/null >/dev/null 2>&1 &", fake.display()),
        ])
        .status()
        .unwrap();
    assert!(shell.success());
    // Found once exec has named it and laid out its command line (the
    // name comes first: /proc/PID/cmdline reads empty between the two).
    let mut other = None;
    assert!(
        poll_until(Duration::from_secs(10), || {
            other = another_kheap();
            other
                .as_ref()
                .is_some_and(|(_, cmdline)| cmdline.contains("3149"))
        }),
        "the stand-in kheap did not start: {other:?}"
    );
    let (pid, cmdline) = other.unwrap();
    assert_eq!(cmdline, format!("{} 3149", fake.display()));
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "reliability::bad_output_is_refused_before_tracing",
            "--test-threads=1",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("kheap tests:"))
        .collect();
    assert_eq!(
        said,
        [format!(
            "kheap tests: another kheap is running (pid {pid}: {cmdline}); the root tests count \
             what the kernel does and would fail beside it: stop it, then run them again"
        )],
        "{err}"
    );
    // Only the check ran: the test it was asked for did not.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("test result"), "{stdout}");
}
