//! The live status line of record, leaks and malloc: drawn on a real
//! terminal (tmux) while a known workload runs, gone from the screen once
//! the report is printed (also after Ctrl-C), and absent when stderr is a
//! file.

use crate::common;

use std::process::{Command, Stdio};

use common::tmux::Tmux;
use common::*;

/// The events count of the status line on the screen, if one is there:
/// `kheap: 2s, 1.2k events (600/s), lost 0, map fill <1% (sites)`.
fn status_events(screen: &str) -> Option<String> {
    screen.lines().find_map(|l| {
        let rest = l.trim_end().strip_prefix("kheap: ")?;
        let (secs, rest) = rest.split_once("s, ")?;
        secs.parse::<u64>().ok()?;
        let (events, rest) = rest.split_once(" events")?;
        rest.contains(", lost ").then(|| events.to_string())
    })
}

/// Whether any part of a status line is left on the screen.
fn status_text_left(screen: &str) -> bool {
    status_events(screen).is_some() || screen.contains("map fill")
}

/// Runs `command` in a fresh pane, waits for a status line with nonzero
/// events and for `ready` on the screen, then (after `end`, if any: keys
/// that stop the run) for the shell prompt after `report_marker`; asserts
/// no status text is left anywhere in the pane's history. Returns that
/// history.
fn status_then_report(
    test: &str,
    command: &str,
    ready: &str,
    end: &[&str],
    report_marker: &str,
) -> String {
    let tmux = Tmux::start(test);
    tmux.send(&[command, "Enter"]);
    let screen = tmux.wait_for("a status line with events", |s| {
        status_events(s).is_some_and(|e| e != "0") && s.contains(ready)
    });
    let line = screen
        .lines()
        .find(|l| l.contains(" events"))
        .unwrap()
        .to_string();
    assert!(line.contains(", lost 0"), "nothing lost here: {line}");
    assert!(line.contains("map fill "), "{line}");
    if !end.is_empty() {
        tmux.send(end);
    }
    // The marker may have scrolled off the screen under a long report:
    // it is looked for in the whole history.
    tmux.wait_for("the report and the prompt", |s| {
        s.trim_end().ends_with('$') && tmux.capture_history().contains(report_marker)
    });
    let history = tmux.capture_history();
    assert!(
        !status_text_left(&history),
        "status text left after the report:\n{history}"
    );
    history
}

#[test]
fn record_shows_a_status_line_and_erases_it_before_the_report() {
    require_root();
    // 2000 messages held 4 s: the status is drawn at least twice.
    let screen = status_then_report(
        "rec",
        &format!("{KHEAP} record -n 3 -- {LOAD} msg 2000 2100 4"),
        "holding 2000 messages",
        &[],
        "load_msg",
    );
    assert!(screen.split_whitespace().any(is_msg_cache), "{screen}");
}

#[test]
fn leaks_erases_its_status_line_when_ctrl_c_ends_the_run() {
    require_root();
    let screen = status_then_report(
        "leaks",
        &format!("{KHEAP} leaks -n 3 -- {LOAD} msg 500 2100 60"),
        "holding 500 messages",
        &["C-c"],
        // Not load_msg: Ctrl-C reaches the workload too, which removes its
        // queues (freeing the messages) while kheap reads its maps, so
        // whether they are still outstanding is a race.
        "transient:",
    );
    assert!(
        screen.contains("stopped by signal; reporting what was recorded"),
        "{screen}"
    );
}

#[test]
fn malloc_shows_a_status_line_and_erases_it_before_the_report() {
    require_root();
    // bash allocates with the C library's malloc on every loop turn. The
    // run ends with Ctrl-C once the status is seen: with -d 3 a loaded TCG
    // guest once ended it before a screen capture caught the line.
    status_then_report(
        "malloc",
        &format!(
            "{KHEAP} malloc -n 3 -- bash -c 's=; while :; do s=\"$s x\"; s=${{s:0:200}}; done'"
        ),
        "kheap: tracing malloc",
        &["C-c"],
        "allocator",
    );
}

/// Runs kheap with stderr going to a file and returns what it wrote there.
fn stderr_in_file(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stderr.txt");
    let file = std::fs::File::create(&path).unwrap();
    let out = Command::new(KHEAP)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(file)
        .output()
        .expect("running kheap");
    let err = std::fs::read_to_string(&path).unwrap();
    assert!(out.status.success(), "kheap {args:?} failed: {err}");
    err
}

#[test]
fn no_status_text_when_stderr_is_a_file() {
    require_root();
    // Each run lasts over 2 s, so a status line would have been due twice.
    let load = ["--", LOAD, "msg", "300", "2100", "3"];
    for sub in ["record", "leaks", "malloc"] {
        let args: Vec<&str> = [&[sub][..], &load[..]].concat();
        let err = stderr_in_file(&args);
        assert!(err.contains("kheap: tracing"), "{sub}: {err}");
        assert!(!err.contains('\r'), "{sub}: carriage return in {err:?}");
        assert!(!err.contains('\x1b'), "{sub}: escape sequence in {err:?}");
        assert!(!status_text_left(&err), "{sub}: status text in {err:?}");
    }
}
