//! `kheap leaks`' timeline against the real kernel: kheap-load msg-steps
//! holds N, 2N, then 3N SysV messages (one kmalloc in load_msg each), a
//! step each STEP_SECS, then frees them; the timeline must show the three
//! levels exactly, for as long as they last, with /proc/meminfo's Slab
//! line rising with them.

use crate::common;

use common::*;
use serde_json::Value;

const STEP_N: u64 = 2000;
const MSG_SIZE: &str = "2100";
const STEP_SECS: f64 = 1.5;
const INTERVAL: f64 = 0.25;

/// load_msg's (objects, bytes) at each point (0 when not among the top).
fn load_msg_levels(report: &Value) -> Vec<(f64, u64, u64, &Value)> {
    let t = &report["leaks"]["timeline"];
    let series = t["series"].as_array().unwrap();
    t["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let (objects, bytes) = p["sites"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|s| series[u(&s["series"]) as usize]["function"] == msg_fn())
                .fold((0, 0), |(o, b), s| {
                    (o + u(&s["objects"]), b + u(&s["bytes"]))
                });
            (p["t_s"].as_f64().unwrap(), objects, bytes, p)
        })
        .collect()
}

/// The allocated size of one message, from the report's own totals.
fn msg_object_size(report: &Value) -> u64 {
    let sites = rows_of_fn(report, "sites", msg_fn());
    assert_eq!(sites.len(), 1, "{:#}", report["sites"]);
    let count = u(&sites[0]["count"]);
    assert_eq!(count, 3 * STEP_N, "every message allocated once");
    let bytes = u(&sites[0]["bytes_alloc"]);
    assert_eq!(bytes % count, 0, "messages of one size: {bytes} / {count}");
    bytes / count
}

fn steps_report(extra: &[&str]) -> Value {
    let n = STEP_N.to_string();
    let step = STEP_SECS.to_string();
    let interval = INTERVAL.to_string();
    let mut args = vec!["--interval", interval.as_str()];
    args.extend(extra);
    report_json("leaks", &args, &["msg-steps", &n, MSG_SIZE, &step])
}

#[test]
fn the_timeline_shows_three_steps_of_exact_sizes_and_slab_rises_with_them() {
    require_root();
    let report = steps_report(&[]);
    let objsize = msg_object_size(&report);
    let t = &report["leaks"]["timeline"];
    assert_eq!(t["interval_s"].as_f64(), Some(INTERVAL));
    assert_eq!(t["estimated"], false);
    let levels = load_msg_levels(&report);
    let per_step = STEP_SECS / INTERVAL;
    for &(_, objects, bytes, p) in &levels {
        assert_eq!(bytes, objects * objsize, "{p}");
    }
    let shown: Vec<(f64, u64)> = levels.iter().map(|l| (l.0, l.1)).collect();
    // Every reading is one of the levels, except those caught while a
    // step's messages were being sent or all were received (between two
    // levels; on a slow machine sending takes a few readings): those are
    // fewer than the readings at the levels.
    let expected = [0, STEP_N, 2 * STEP_N, 3 * STEP_N];
    let between: Vec<_> = levels.iter().filter(|l| !expected.contains(&l.1)).collect();
    assert!(between.len() * 2 < levels.len(), "{shown:?}");
    // Up to the third step, never down; then back to nothing at the end.
    let peak = levels.iter().position(|l| l.1 == 3 * STEP_N).unwrap();
    for w in levels[..=peak].windows(2) {
        assert!(w[0].1 <= w[1].1, "{shown:?}");
    }
    assert_eq!(levels.last().unwrap().1, 0, "freed at the end");
    // Each level lasts a step: about as many readings as fit in STEP_SECS
    // (sending 2000 messages on a loaded machine takes a reading or two).
    let mut firsts = Vec::new();
    for k in 1..=3 {
        let at: Vec<_> = levels.iter().filter(|l| l.1 == k * STEP_N).collect();
        let n = at.len() as f64;
        assert!(
            (per_step / 2.0..=per_step + 2.0).contains(&n),
            "step {k}: {n} readings of {per_step}: {shown:?}"
        );
        firsts.push(at[0].0);
    }
    for w in firsts.windows(2) {
        let gap = w[1] - w[0];
        assert!(
            (STEP_SECS - 2.0 * INTERVAL..=STEP_SECS + 6.0 * INTERVAL).contains(&gap),
            "steps {gap}s apart: {shown:?}"
        );
    }
    // /proc/meminfo's Slab line rises with the two later steps (other
    // processes allocate and free too: half the messages' bytes at least).
    let slab = |p: &Value| u(&p["meminfo"]["slab_bytes"]);
    let first = levels.iter().find(|l| l.1 == STEP_N).unwrap().3;
    let third = levels.iter().rfind(|l| l.1 == 3 * STEP_N).unwrap().3;
    let rise = slab(third).saturating_sub(slab(first));
    assert!(
        rise >= STEP_N * objsize,
        "Slab rose {rise} bytes for {} bytes of messages",
        2 * STEP_N * objsize
    );
    assert!(
        u(&t["readings"]) >= (3.0 * per_step) as u64,
        "{}",
        t["readings"]
    );
    assert!(u(&t["read_us_max"]) >= u(&t["read_us_mean"]));
}

#[test]
fn the_html_chart_opens_in_a_browser_with_the_site_and_its_three_steps() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("run.html");
    let json = dir.path().join("run.json");
    let (n, step, interval) = (STEP_N.to_string(), STEP_SECS.to_string(), "0.25");
    let out = kheap(&[
        "leaks",
        "--interval",
        interval,
        "--format",
        "html",
        "-o",
        html.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--",
        LOAD,
        "msg-steps",
        &n,
        MSG_SIZE,
        &step,
    ]);
    assert_ok(&out);
    let report = parse_valid(&std::fs::read_to_string(&json).unwrap());
    let objsize = msg_object_size(&report);
    let url = format!("file://{}", html.display());
    let profile = dir.path().join("profile");

    // The page as the browser built it: the site named, each step's exact
    // bytes in the readings, the script run, and (?t=) the hover text of a
    // reading in the third step.
    let third = load_msg_levels(&report)
        .into_iter()
        .find(|l| l.1 == 3 * STEP_N)
        .unwrap()
        .0;
    let dom = chromium(&["--dump-dom"], &format!("{url}?t={third}"), &profile);
    assert!(
        dom.contains(&format!("{} [kmalloc]", msg_fn())),
        "site not named"
    );
    for k in 1..=3 {
        let cell = format!("<td>{}</td>", k * STEP_N * objsize);
        assert!(dom.contains(&cell), "step {k}: no {cell}");
    }
    assert!(
        dom.contains("data-chart-ready=\"1\""),
        "the script did not run"
    );
    // The readout, on the page (not a tooltip): load_msg's bytes at that
    // reading and who allocated them, the process of its stack rows.
    let readout = dom.split("<div id=\"readout\"").nth(1).expect("readout");
    let readout = readout.split("</div></div>").next().unwrap();
    let mut owners: std::collections::HashMap<String, u64> = Default::default();
    for stack in rows_of_fn(&report, "stacks", msg_fn()) {
        for p in stack["processes"].as_array().unwrap() {
            if let (Some(comm), Some(pid)) = (p["comm"].as_str(), p["pid"].as_u64()) {
                *owners.entry(format!("{comm} [{pid}]")).or_default() += u(&p["bytes_alloc"]);
            }
        }
    }
    let (owner, _) = owners
        .iter()
        .max_by_key(|o| o.1)
        .expect("load_msg's stacks have owners");
    assert!(owner.starts_with("kheap-load ["), "{owners:?}");
    let line = format!("{} [kmalloc]: ", msg_fn());
    let want = format!("({} bytes)  allocated by {owner}", 3 * STEP_N * objsize);
    let row = readout
        .split("<div class=\"series\">")
        .find(|r| r.contains(&line))
        .unwrap_or_else(|| panic!("no {line} in {readout}"));
    assert!(row.contains(&want), "{want} not in {row}");
    // How to get there is said on the page, outside the collapsed table.
    let help = dom.split("<p id=\"help\">").nth(1).expect("help line");
    let help = help.split("</p>").next().unwrap();
    assert!(
        help.contains("point at it") && help.contains("?t=SECONDS"),
        "{help}"
    );
    let before_table = dom.split("<details>").next().unwrap();
    assert!(before_table.contains("id=\"help\"") && before_table.contains("id=\"readout\""));

    // The areas have a panel and a scale of their own: from 0 to the
    // highest total of the readings, whatever /proc/meminfo did; the
    // meminfo lines stay in theirs, below.
    let highest = report["leaks"]["timeline"]["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| u(&p["total"]["bytes"]))
        .max()
        .unwrap();
    let areas = panel(&dom, "areas");
    assert_eq!(areas.range, (0, highest as i64), "the areas' scale");
    let lines = panel(&dom, "meminfo");
    assert!(areas.band.1 < lines.band.0, "{areas:?} {lines:?}");
    let area_ys = path_ys(&dom, "area");
    let line_ys = path_ys(&dom, "line");
    assert!(!area_ys.is_empty() && !line_ys.is_empty());
    for y in &area_ys {
        assert!(
            (areas.band.0..=areas.band.1).contains(y),
            "area at {y}: {areas:?}"
        );
    }
    for y in &line_ys {
        assert!(
            (lines.band.0..=lines.band.1).contains(y),
            "line at {y}: {lines:?}"
        );
    }
    // The highest stack reaches the top of its panel.
    let top = area_ys.iter().copied().fold(f64::MAX, f64::min);
    assert_eq!(top, areas.band.0);

    // Every legend entry (areas, other, the lines) has a label and a
    // colour no other entry has.
    let entries: Vec<(&str, &str)> = dom
        .split("class=\"entry\" data-colour=\"")
        .skip(1)
        .map(|rest| {
            let colour = rest.split('"').next().unwrap();
            let end = ["</span>", "</text>"]
                .iter()
                .filter_map(|m| rest.find(m))
                .min()
                .unwrap();
            (colour, rest[..end].rsplit('>').next().unwrap())
        })
        .collect();
    let series = report["leaks"]["timeline"]["series"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(entries.len(), series + 1 + 4, "{entries:?}");
    let labels: std::collections::HashSet<_> = entries.iter().map(|e| e.1).collect();
    let colours: std::collections::HashSet<_> = entries.iter().map(|e| e.0).collect();
    assert_eq!(labels.len(), entries.len(), "{entries:?}");
    assert_eq!(colours.len(), entries.len(), "{entries:?}");

    let png = dir.path().join("chart.png");
    chromium(
        &[
            &format!("--screenshot={}", png.display()),
            "--window-size=1100,800",
        ],
        &url,
        &profile,
    );
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&png).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    let pixels = &buf[..info.buffer_size()];
    // The stacked area is drawn in colour, not just text on white.
    let coloured = pixels
        .chunks(channels)
        .filter(|p| {
            let (lo, hi) = (p[..3].iter().min().unwrap(), p[..3].iter().max().unwrap());
            hi - lo > 40
        })
        .count();
    let total = pixels.len() / channels;
    assert!(
        coloured * 20 > total,
        "only {coloured} of {total} pixels are in colour"
    );
}

/// A panel of the chart as the browser's DOM has it: its band of pixels
/// (top, bottom) and the range of bytes drawn over it (lo, hi).
#[derive(Debug)]
struct Panel {
    band: (f64, f64),
    range: (i64, i64),
}

fn panel(dom: &str, id: &str) -> Panel {
    let g = dom
        .split(&format!("<g id=\"{id}\""))
        .nth(1)
        .unwrap_or_else(|| panic!("no panel {id}"));
    let g = g.split('>').next().unwrap();
    let attr = |name: &str| {
        g.split(&format!("{name}=\""))
            .nth(1)
            .and_then(|v| v.split('"').next())
            .unwrap_or_else(|| panic!("{id}: no {name} in {g}"))
    };
    Panel {
        band: (
            attr("data-top").parse().unwrap(),
            attr("data-bottom").parse().unwrap(),
        ),
        range: (
            attr("data-lo").parse().unwrap(),
            attr("data-hi").parse().unwrap(),
        ),
    }
}

/// The y of every point of every `<path class="CLASS">`.
fn path_ys(dom: &str, class: &str) -> Vec<f64> {
    dom.split(&format!("<path class=\"{class}\" d=\""))
        .skip(1)
        .flat_map(|rest| {
            let d = rest.split('"').next().unwrap();
            d.split(['M', 'L', 'Z'])
                .filter(|p| !p.is_empty())
                .map(|p| p.split_once(',').unwrap().1.parse::<f64>().unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `--snapshot-when site:load_msg+=1.5 steps` fires once: at the first
/// reading of the level 1.5 steps above the level of the first reading (the
/// second step if tracing began before the first, else the third), and its
/// snapshot holds that level exactly; pprof beside it with --format pprof.
#[test]
fn a_site_trigger_fires_once_at_the_right_step() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let snaps = dir.path().join("snaps");
    std::fs::create_dir(&snaps).unwrap();
    let json = dir.path().join("run.json");
    let (n, step) = (STEP_N.to_string(), STEP_SECS.to_string());
    // Sized from a message's known allocation (4096 bytes for 2100): the
    // report's own object size is checked below. A glob: "load_m*" (or
    // "alloc_m*" where alloc_msg is not inlined).
    let prefix = msg_fn().trim_end_matches("sg");
    let grow = format!("site:{prefix}*+={}", STEP_N * 4096 * 3 / 2);
    let out = kheap(&[
        "leaks",
        "--interval",
        &INTERVAL.to_string(),
        "--snapshot-dir",
        snaps.to_str().unwrap(),
        "--snapshot-when",
        &grow,
        "--format",
        "pprof",
        "-o",
        dir.path().join("run.pb.gz").to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--",
        LOAD,
        "msg-steps",
        &n,
        MSG_SIZE,
        &step,
    ]);
    assert_ok(&out);
    let report = parse_valid(&std::fs::read_to_string(&json).unwrap());
    assert_eq!(msg_object_size(&report), 4096);
    let levels = load_msg_levels(&report);
    // Growth counts from the start of tracing (nothing outstanding then),
    // however late the first reading comes: the second step crosses the
    // threshold; a reading on a slow machine (a guest under TCG) can catch
    // it half-filled.
    let want = 2 * STEP_N;
    let threshold = STEP_N * 3 / 2;
    let at = levels.iter().find(|l| l.1 >= threshold).unwrap();
    assert!(
        at.1 >= threshold && at.1 <= want,
        "{:?}",
        levels.iter().map(|l| l.1).collect::<Vec<_>>()
    );
    let fired = report["leaks"]["timeline"]["triggers"].as_array().unwrap();
    assert_eq!(fired.len(), 1, "{fired:?}");
    assert_eq!(fired[0]["condition"], grow.as_str());
    assert_eq!(fired[0]["t_s"].as_f64().unwrap(), at.0);
    let path = std::path::PathBuf::from(fired[0]["path"].as_str().unwrap());
    assert!(path.starts_with(&snaps));
    let name = path.file_name().unwrap().to_str().unwrap();
    assert!(
        name.starts_with(&format!("snapshot-site-{prefix}_-")),
        "{name}"
    );
    let snap = parse_valid(&std::fs::read_to_string(&path).unwrap());
    assert_eq!(snap["leaks"]["snapshot"], true);
    // Taken just after that reading: what it saw, or more of the same step.
    let site = &rows_of_fn(&snap, "sites", msg_fn())[0];
    let held = u(&site["outstanding_count"]);
    assert!(held >= at.1 && held <= want, "{held} held, {} read", at.1);
    assert!(path.with_extension("pb.gz").exists());
    let files = std::fs::read_dir(&snaps).unwrap().count();
    assert_eq!(files, 2, "one snapshot and its profile");
}

/// `--fail-if`: a command that leaves messages behind (kheap stops while
/// they are held) fails with status 3 and the row named; one that frees
/// them passes.
#[test]
fn fail_if_fails_a_command_that_leaves_objects_and_passes_one_that_frees_them() {
    require_root();
    let budget = format!("outstanding{{site={}*}} > 0", msg_fn());
    let held = kheap(&[
        "leaks",
        "-d",
        "2",
        "--fail-if",
        &budget,
        "-o",
        "/dev/null",
        "--",
        LOAD,
        "msg",
        "100",
        MSG_SIZE,
        "20",
    ]);
    assert_eq!(held.status.code(), Some(3), "{held:?}");
    let stderr = String::from_utf8_lossy(&held.stderr);
    assert!(
        stderr.contains(&format!(
            "kheap: over budget: {budget} ({} bytes > 0 bytes)",
            100 * 4096
        )) && stderr.contains(&format!("  {} [kmalloc]: 409600 bytes", msg_fn())),
        "{stderr}"
    );
    let freed = kheap(&[
        "leaks",
        "--fail-if",
        &budget,
        "--fail-if",
        &format!("outstanding[kmalloc]{{site={}}} > 0", msg_fn()),
        "-o",
        "/dev/null",
        "--",
        LOAD,
        "msg",
        "100",
        MSG_SIZE,
    ]);
    assert_eq!(freed.status.code(), Some(0), "{freed:?}");
    let bad = kheap(&[
        "leaks",
        "--fail-if",
        "outstanding > lots",
        "--",
        LOAD,
        "msg",
        "1",
        "1",
    ]);
    assert_eq!(bad.status.code(), Some(2));
}

/// A memory cgroup with a small limit: cgroup v1's memory controller where
/// it is mounted (this host), else a child of the cgroup2 mount with
/// memory.max (the guests). Removed (its processes killed first) when
/// dropped, even if the test fails; the memory controller is disabled
/// again at the cgroup2 root if this test enabled it.
struct SmallMemcg {
    dir: std::path::PathBuf,
    enabled_at: Option<std::path::PathBuf>,
}

impl SmallMemcg {
    fn new(limit: u64) -> Option<SmallMemcg> {
        let name = format!("kheap-test-oom-{}", std::process::id());
        let v1 = std::path::Path::new("/sys/fs/cgroup/memory");
        if v1.join("memory.limit_in_bytes").exists() {
            std::fs::create_dir(v1.join(&name)).ok()?;
            let cg = SmallMemcg {
                dir: v1.join(&name),
                enabled_at: None,
            };
            std::fs::write(cg.dir.join("memory.limit_in_bytes"), limit.to_string()).ok()?;
            return Some(cg);
        }
        let root = kheap::cgroup::cgroup2_mount().ok()?;
        let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).ok()?;
        if !controllers.split_whitespace().any(|c| c == "memory") {
            return None;
        }
        let control = root.join("cgroup.subtree_control");
        let on = std::fs::read_to_string(&control).ok()?;
        let enabled_at = if on.split_whitespace().any(|c| c == "memory") {
            None
        } else {
            std::fs::write(&control, "+memory").ok()?;
            Some(control)
        };
        let cg = SmallMemcg {
            dir: root.join(&name),
            enabled_at,
        };
        std::fs::create_dir(&cg.dir).ok()?;
        std::fs::write(cg.dir.join("memory.max"), limit.to_string()).ok()?;
        // No swap to escape into, where the kernel has swap accounting.
        let _ = std::fs::write(cg.dir.join("memory.swap.max"), "0");
        Some(cg)
    }
}

impl Drop for SmallMemcg {
    fn drop(&mut self) {
        let mut removed = false;
        for _ in 0..50 {
            let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            if std::fs::remove_dir(&self.dir).is_ok() {
                removed = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if !removed {
            eprintln!("warning: {} not removed", self.dir.display());
        }
        if let Some(control) = &self.enabled_at {
            let _ = std::fs::write(control, "-memory");
        }
    }
}

fn oom_kills() -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// `--snapshot-when oom`: a process in a 32 MiB memory cgroup faulting in
/// 80 MiB is killed by the kernel; the trigger fires and writes its
/// snapshot, and tracing goes on to the end of the command.
#[test]
fn an_oom_kill_fires_the_oom_trigger() {
    require_root();
    let Some(cg) = SmallMemcg::new(32 << 20) else {
        panic!("no memory controller (cgroup v1 at /sys/fs/cgroup/memory, or cgroup2's) to run an OOM in");
    };
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let before = oom_kills();
    // The victim moves itself into the cgroup, then becomes kheap-load
    // faulting in 20480 pages; the outer shell outlives it.
    let script = format!(
        "sleep 1; sh -c 'echo $$ > {}/cgroup.procs && exec {LOAD} pages 20480 5'; sleep 1.5",
        cg.dir.display()
    );
    let out = kheap(&[
        "leaks",
        "--interval",
        "0.25",
        "--snapshot-dir",
        dir.path().to_str().unwrap(),
        "--snapshot-when",
        "oom",
        "--json",
        json.to_str().unwrap(),
        "-o",
        "/dev/null",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert_ok(&out);
    let kills = oom_kills() - before;
    assert!(kills >= 1, "the kernel killed nothing");
    let report = parse_valid(&std::fs::read_to_string(&json).unwrap());
    let fired = report["leaks"]["timeline"]["triggers"].as_array().unwrap();
    // Other OOM kills on the machine would fire it too: at least ours.
    assert!(
        !fired.is_empty() && fired.len() as u64 <= kills,
        "{fired:?}, {kills} kills"
    );
    assert_eq!(fired[0]["condition"], "oom");
    let t = fired[0]["t_s"].as_f64().unwrap();
    assert!(t >= 1.0, "fired at {t}s, before the victim ran");
    let path = fired[0]["path"].as_str().unwrap();
    assert!(path.contains("snapshot-oom-"), "{path}");
    let snap = parse_valid(&std::fs::read_to_string(path).unwrap());
    assert_eq!(snap["leaks"]["snapshot"], true);
    drop(cg);
}
