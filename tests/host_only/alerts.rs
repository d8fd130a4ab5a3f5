//! contrib/kheap-alerts.yml: Prometheus' own `promtool` checks the rules
//! and runs their unit tests (contrib/tests/kheap-alerts.test.yml), and a
//! real `kheap serve` scrape has every metric the rules read (root).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{poll_every, require_root, Background, HANG_LIMIT, KHEAP};

fn contrib() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib")
}

/// Runs promtool with `args` in `dir`; panics with its output unless it
/// succeeds. Returns its stdout.
fn promtool(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool (scripts/setup --tests installs the prometheus package)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "promtool {args:?}: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn alert_rules_pass_promtool_check() {
    let out = promtool(&contrib(), &["check", "rules", "kheap-alerts.yml"]);
    assert!(out.contains("SUCCESS: 4 rules found"), "{out}");
}

#[test]
fn alert_rules_pass_their_unit_tests() {
    let out = promtool(
        &contrib().join("tests"),
        &["test", "rules", "kheap-alerts.test.yml"],
    );
    assert!(out.contains("SUCCESS"), "{out}");
}

/// The metric names the rules read, in the order they appear.
fn rule_metrics() -> Vec<String> {
    let rules = std::fs::read_to_string(contrib().join("kheap-alerts.yml")).unwrap();
    let mut names = Vec::new();
    for expr in rules.lines().filter_map(|l| l.trim().strip_prefix("expr:")) {
        let mut rest = expr;
        while let Some(at) = rest.find("kheap_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.push(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    names
}

/// Every metric the rules read is in a real `kheap serve
/// --track-outstanding` scrape over plain TCP (no --expose-slabinfo, no
/// authentication), with at least one sample: a renamed metric, or one
/// that such a reader is not served, would leave its alert silent forever.
#[test]
fn alert_rules_read_metrics_kheap_serve_exports() {
    require_root();
    let names = rule_metrics();
    assert_eq!(names.len(), 4, "one metric per rule: {names:?}");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut serve = Background::spawn(
        KHEAP,
        &[
            "serve",
            "--listen",
            &listen,
            "--interval",
            "1",
            // The site alert needs the outstanding gauges; nothing else is
            // asked for: the slab alert must work over unauthenticated TCP,
            // where the /proc/slabinfo gauges are not served by default.
            "--track-outstanding",
        ],
    );
    serve.wait_for("serving on");
    let url = format!("http://{listen}/metrics");
    // Sites appear after the first read (every second) of a machine that
    // allocates all the time; HANG_LIMIT bounds the wait.
    let mut missing = Vec::new();
    poll_every(HANG_LIMIT, Duration::from_millis(250), || {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "10", &url])
            .output()
            .expect("curl (scripts/setup --tests installs it)");
        let body = String::from_utf8_lossy(&out.stdout);
        missing = names
            .iter()
            .filter(|n| {
                !body.lines().any(|l| {
                    l.strip_prefix(n.as_str())
                        .is_some_and(|r| r.starts_with(['{', ' ']))
                })
            })
            .collect();
        missing.is_empty()
    });
    assert!(missing.is_empty(), "no samples of {missing:?} at {url}");
}
