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

/// A scrape of a real `kheap serve --track-outstanding` over plain TCP (no
/// --expose-slabinfo, no authentication) once `ready` holds for it.
fn real_scrape(ready: impl Fn(&str) -> bool) -> String {
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
    let mut body = String::new();
    poll_every(HANG_LIMIT, Duration::from_millis(250), || {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "10", &url])
            .output()
            .expect("curl (scripts/setup --tests installs it)");
        body = String::from_utf8_lossy(&out.stdout).into_owned();
        ready(&body)
    });
    serve.signal(libc::SIGTERM);
    assert!(serve.wait(), "{:#?}", serve.seen);
    body
}

/// The names of the metrics in `names` without a sample in `body`.
fn missing<'n>(body: &str, names: &'n [String]) -> Vec<&'n String> {
    names
        .iter()
        .filter(|n| {
            !body.lines().any(|l| {
                l.strip_prefix(n.as_str())
                    .is_some_and(|r| r.starts_with(['{', ' ']))
            })
        })
        .collect()
}

/// Every metric the rules read is in a real `kheap serve
/// --track-outstanding` scrape over plain TCP (no --expose-slabinfo, no
/// authentication), with at least one sample: a renamed metric, or one
/// that such a reader is not served, would leave its alert silent forever.
#[test]
fn alert_rules_read_metrics_kheap_serve_exports() {
    require_root();
    let names = rule_metrics();
    assert_eq!(names.len(), 6, "the metrics of the rules: {names:?}");
    let body = real_scrape(|b| missing(b, &names).is_empty());
    let missing = missing(&body, &names);
    assert!(missing.is_empty(), "no samples of {missing:?} in\n{body}");
}

/// The label set (`{...}`, as scraped) of the first sample of `name`
/// whose labels contain `having`, and its labels as pairs.
fn labels_of(body: &str, name: &str, having: &str) -> (String, Vec<(String, String)>) {
    let line = body
        .lines()
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') && r.contains(having))
        })
        .unwrap_or_else(|| panic!("no {name} sample with {having} in\n{body}"));
    let set = &line[name.len()..=line.find('}').unwrap()];
    let pairs = set[1..set.len() - 1]
        .split("\",")
        .map(|p| {
            let (k, v) = p.split_once("=\"").unwrap();
            (k.to_string(), v.trim_end_matches('"').to_string())
        })
        .collect();
    (set.to_string(), pairs)
}

/// The two rules on growth fire on the series a real `kheap serve` exports,
/// with their real label sets: unreclaimable slab memory growing by 8 MiB a
/// minute, and a real site's outstanding bytes growing by 1 MiB a minute
/// beside its aged-out counter. Labels that no longer matched the rules'
/// selectors (kind, site, the aged-out counter's) would leave them silent.
#[test]
fn growth_alerts_fire_on_the_series_kheap_serve_exports() {
    require_root();
    let body = real_scrape(|b| {
        b.lines().any(|l| {
            l.starts_with("kheap_site_outstanding_aged_out_bytes_total{")
                && !l.contains("site=\"other\"")
        })
    });
    let (slab, _) = labels_of(&body, "kheap_meminfo_slab_bytes", "kind=\"unreclaimable\"");
    // A site series (not other) with its aged-out counter.
    let (site, pairs) = body
        .lines()
        .filter_map(|l| l.strip_prefix("kheap_site_outstanding_aged_out_bytes_total{"))
        .find(|r| !r.contains("site=\"other\""))
        .map(|r| {
            labels_of(
                &body,
                "kheap_site_outstanding_bytes",
                &r[..r.find('}').unwrap()],
            )
        })
        .expect("a site's aged-out counter");
    let with_instance = |set: &str| format!("{{instance=\"real\",{}", &set[1..]);
    let value = |k: &str| pairs.iter().find(|(n, _)| n == k).unwrap().1.clone();
    let exp_labels: String = pairs
        .iter()
        .map(|(k, v)| format!("              {k}: '{v}'\n"))
        .collect();
    let rules = contrib().join("kheap-alerts.yml");
    let test = format!(
        r#"rule_files:
  - {rules}
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'kheap_meminfo_slab_bytes{slab}'
        values: '100000000+8388608x120'
      - series: 'kheap_site_outstanding_bytes{site}'
        values: '0+1048576x120'
      - series: 'kheap_site_outstanding_aged_out_bytes_total{site}'
        values: '0x120'
    alert_rule_test:
      - eval_time: 40m
        alertname: KheapSlabMemoryGrowing
        exp_alerts:
          - exp_labels:
              severity: warning
              instance: real
            exp_annotations:
              summary: "Unreclaimable slab memory on real grew by 240MiB in 30 minutes, for 15 minutes"
              description: "Which caches and sites: topk(5, sum by (cache) (increase(kheap_cache_allocated_bytes_total{{instance=\"real\"}}[30m]))), and kheap_slab_memory_bytes where it is served. Who allocates them: kheap slab, kheap leaks."
      - eval_time: 30m
        alertname: KheapSiteOutstandingGrowing
        exp_alerts:
          - exp_labels:
              severity: warning
              instance: real
{exp_labels}            exp_annotations:
              summary: '{site_name} ({cache}) on real: outstanding bytes grow by 60MiB per hour'
              description: "Objects allocated at this site are not freed as fast as they are allocated. kheap leaks on that host shows their ages and stacks."
"#,
        rules = rules.display(),
        slab = with_instance(&slab),
        site = with_instance(&site),
        site_name = value("site"),
        cache = value("cache"),
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("real.test.yml"), &test).unwrap();
    let out = promtool(dir.path(), &["test", "rules", "real.test.yml"]);
    assert!(out.contains("SUCCESS"), "{out}\n{test}");
}
