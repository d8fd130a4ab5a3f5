//! `--format svg` against the real kernel: the flame graph of a known
//! workload carries the exact numbers, is well-formed XML, and a real
//! headless browser draws it and runs its script.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::*;

/// Each msgsnd of 2100 bytes is one kmalloc of 2148 bytes, rounded to 4k.
const MSGS: u64 = 1000;
const REQ: u64 = 48 + 2100;

/// One frame of the SVG: its name and numbers.
#[derive(Debug)]
struct Frame {
    name: String,
    level: u64,
    count: u64,
    bytes: u64,
    waste: u64,
}

fn attr(line: &str, key: &str) -> u64 {
    let tag = format!("data-{key}=\"");
    let rest = &line[line.find(&tag).unwrap_or_else(|| panic!("{key} in {line}")) + tag.len()..];
    rest[..rest.find('"').unwrap()].parse().unwrap()
}

fn frames(svg: &str) -> Vec<Frame> {
    svg.lines()
        .filter(|l| l.starts_with("<g class=\"f\""))
        .map(|l| {
            let t = &l[l.find("<title>").unwrap() + 7..];
            Frame {
                name: t[..t.find("&#10;").unwrap()].to_string(),
                level: attr(l, "l"),
                count: attr(l, "count"),
                bytes: attr(l, "bytes"),
                waste: attr(l, "waste"),
            }
        })
        .collect()
}

/// `kheap SUBCOMMAND --format FORMAT -o FILE ARGS -- kheap-load msg`, the
/// file's text.
fn run_to_file(format: &str, args: &[&str], dir: &Path) -> String {
    let path = dir.join(format!("out.{format}"));
    let mut all = vec!["record", "--format", format, "-o", path.to_str().unwrap()];
    all.extend(args);
    let n = MSGS.to_string();
    all.extend(["--", LOAD, "msg", &n, "2100"]);
    assert_ok(&kheap(&all));
    std::fs::read_to_string(&path).expect("kheap wrote no file")
}

/// The folded lines the SVG was drawn from: each frame's path (callers
/// first) and its own numbers (its total minus its children's), from the
/// frames' depth-first order.
fn unfold(fs: &[Frame]) -> Vec<(String, Frame)> {
    let mut path: Vec<&str> = Vec::new();
    let mut out: Vec<(String, Frame)> = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    for f in fs.iter().skip(1) {
        path.truncate(f.level as usize - 1);
        open.truncate(f.level as usize - 1);
        if let Some(&parent) = open.last() {
            let p: &mut Frame = &mut out[parent].1;
            p.count -= f.count;
            p.bytes -= f.bytes;
            p.waste -= f.waste;
        }
        path.push(&f.name);
        open.push(out.len());
        out.push((
            path.join(";"),
            Frame {
                name: f.name.clone(),
                level: f.level,
                count: f.count,
                bytes: f.bytes,
                waste: f.waste,
            },
        ));
    }
    out.retain(|(_, f)| f.count > 0 || f.bytes > 0);
    out
}

/// The one stack of the messages in folded output: load_msg calling the
/// allocator, whose frames folded output keeps.
fn is_msg_stack(path: &str) -> bool {
    path.ends_with(";load_msg;__kmalloc_node_noprof")
        || path.ends_with(";load_msg;__kmalloc_noprof")
}

/// The same in a flame graph, which starts stacks at the caller.
fn is_msg_flame(path: &str) -> bool {
    path.ends_with(";do_msgsnd;load_msg")
}

/// Whether a stack of a flame graph ends in the allocator's own entry
/// frame (inner frames can be the allocator's: a slab allocating its own
/// bookkeeping, `alloc_slab_obj_exts`, under `__kmalloc_node_noprof`).
fn ends_in_the_allocator(lines: &[(String, Frame)]) -> bool {
    lines
        .iter()
        .any(|(_, f)| f.name.starts_with("__kmalloc") || f.name.ends_with("_noprof"))
}

#[test]
fn svg_frames_carry_the_exact_numbers_of_the_folded_stacks() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let svg = run_to_file("svg", &["--exact-stacks"], dir.path());
    let fs = frames(&svg);
    assert_eq!(fs[0].name, "all", "the root comes first");
    let lines = unfold(&fs);
    assert!(!ends_in_the_allocator(&lines), "{lines:#?}");
    let msg: Vec<_> = lines.iter().filter(|(p, _)| is_msg_flame(p)).collect();
    assert_eq!(msg.len(), 1, "{lines:#?}");
    let m = &msg[0].1;
    assert_eq!(
        (m.count, m.bytes, m.waste),
        (MSGS, MSGS * 4096, MSGS * (4096 - REQ)),
        "every message, its 4k and its rounding"
    );
    // The frames' own numbers add up to the root: nothing lost or doubled.
    let sum = |f: fn(&Frame) -> u64| lines.iter().map(|(_, fr)| f(fr)).sum::<u64>();
    assert_eq!(
        (sum(|f| f.count), sum(|f| f.bytes), sum(|f| f.waste)),
        (fs[0].count, fs[0].bytes, fs[0].waste)
    );
    assert!(svg.contains(&format!("data-total=\"{}\"", fs[0].bytes)));

    // The folded output of the same workload has the same line.
    let folded = run_to_file("folded", &["--exact-stacks"], dir.path());
    let folded_msg: Vec<u64> = folded
        .lines()
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(p, _)| is_msg_stack(p))
        .map(|(_, n)| n.parse().unwrap())
        .collect();
    assert_eq!(folded_msg, [MSGS], "{folded}");
    // Weighted by count, the widths are allocations.
    let by_count = run_to_file("svg", &["--exact-stacks", "--weight", "count"], dir.path());
    let fs = frames(&by_count);
    // --keep-allocator-frames: the allocator's entry frame is back on top.
    let kept = run_to_file(
        "svg",
        &["--exact-stacks", "--keep-allocator-frames"],
        dir.path(),
    );
    let kept_lines = unfold(&frames(&kept));
    assert!(ends_in_the_allocator(&kept_lines), "{kept_lines:#?}");
    let msg: Vec<_> = kept_lines.iter().filter(|(p, _)| is_msg_stack(p)).collect();
    assert_eq!(msg.len(), 1, "{kept_lines:#?}");
    assert_eq!(msg[0].1.count, MSGS);
    assert!(by_count.contains(&format!(
        "data-weight=\"count\" data-total=\"{}\"",
        fs[0].count
    )));

    let lint = Command::new("xmllint")
        .args(["--noout", dir.path().join("out.svg").to_str().unwrap()])
        .output()
        .expect("xmllint (scripts/setup installs libxml2-utils)");
    assert!(
        lint.status.success(),
        "{}",
        String::from_utf8_lossy(&lint.stderr)
    );
}

#[test]
fn a_browser_draws_the_graph_and_runs_its_search() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    run_to_file("svg", &["--exact-stacks"], dir.path());
    let url = format!("file://{}", dir.path().join("out.svg").display());
    let profile = dir.path().join("profile");

    // The script ran (it marks the root) and the search from the URL found
    // the workload's frame.
    let dom = chromium(&["--dump-dom"], &format!("{url}?s=load_msg"), &profile);
    assert!(dom.contains("data-flame-ready=\"1\""), "{dom}");
    let i = dom.find("data-flame-matches=\"").expect("search ran") + 20;
    let matches: u64 = dom[i..i + dom[i..].find('"').unwrap()].parse().unwrap();
    assert!(matches >= 1, "load_msg not matched");
    assert!(dom.contains("Matched: "), "the match line is shown");

    let png = dir.path().join("flame.png");
    chromium(
        &[
            &format!("--screenshot={}", png.display()),
            "--window-size=1200,700",
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
    let coloured = pixels
        .chunks(channels)
        .filter(|p| p[..3].iter().any(|&c| c < 200))
        .count();
    let total = pixels.len() / channels;
    assert!(
        coloured * 20 > total,
        "only {coloured} of {total} pixels are drawn"
    );
    // The picture in docs/, refreshed on request.
    if std::env::var_os("KHEAP_DOCS_SCREENSHOT").is_some() {
        let to = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/img/flame.png");
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&png, &to).unwrap();
    }
}

#[test]
fn svg_is_not_written_to_a_terminal() {
    require_root();
    // `script` gives kheap a terminal for stdout.
    let out = Command::new("script")
        .args([
            "-qec",
            &format!("{KHEAP} record -d 1 --format svg"),
            "/dev/null",
        ])
        .output()
        .expect("script (util-linux)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("add -o FILE"), "{text}");
    assert!(!text.contains("<svg"), "{text}");
}

#[test]
fn leaks_svg_weighs_the_outstanding_objects() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("held.svg");
    // The messages are held past the end of the run: all outstanding.
    let out = kheap(&[
        "leaks",
        "--by",
        "stack",
        "--exact-stacks",
        "-d",
        "2",
        "--format",
        "svg",
        "-o",
        path.to_str().unwrap(),
        "--",
        LOAD,
        "msg",
        "200",
        "2100",
        "30",
    ]);
    assert_ok(&out);
    let svg = std::fs::read_to_string(&path).unwrap();
    let lines = unfold(&frames(&svg));
    let msg: Vec<_> = lines.iter().filter(|(p, _)| is_msg_flame(p)).collect();
    assert_eq!(msg.len(), 1, "{lines:#?}");
    let m = &msg[0].1;
    assert_eq!(
        (m.count, m.bytes, m.waste),
        (200, 200 * 4096, 200 * (4096 - REQ))
    );
    assert!(svg.contains("outstanding"), "the bytes are named");
}

#[test]
fn diff_svg_colours_the_grown_stack_red_with_its_exact_change() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let mut reports = Vec::new();
    for (name, count) in [("before.json", "100"), ("after.json", "1000")] {
        let path = dir.path().join(name);
        let out = kheap(&[
            "record",
            "--exact-stacks",
            "--format",
            "json",
            "-o",
            path.to_str().unwrap(),
            "--",
            LOAD,
            "msg",
            count,
            "2100",
        ]);
        assert_ok(&out);
        reports.push(path.to_str().unwrap().to_string());
    }
    let svg_path = dir.path().join("diff.svg");
    // Weighed by rounding: only the 4k messages waste (the slab's own
    // bookkeeping under load_msg fits its size class), so the change is
    // exact: 900 more messages, 4096 - 2148 bytes each.
    let out = kheap(&[
        "diff",
        &reports[0],
        &reports[1],
        "--weight",
        "waste",
        "--format",
        "svg",
        "-o",
        svg_path.to_str().unwrap(),
    ]);
    assert_ok(&out);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let line = svg
        .lines()
        .find(|l| l.contains("<title>load_msg&#10;"))
        .expect("a load_msg frame");
    let change = 900 * (4096 - REQ);
    assert!(line.contains(&format!("change +{change}")), "{line}");
    assert!(line.contains("fill=\"rgb(255,"), "grew: red: {line}");

    // A legend says what red and blue mean.
    let legend = svg
        .split("<g id=\"legend\">")
        .nth(1)
        .and_then(|l| l.split("</g>").next())
        .expect("a legend");
    assert!(
        legend.contains("grew") && legend.contains("shrank"),
        "{legend}"
    );
    assert!(legend.contains("fill=\"rgb(255,80,80)\""), "{legend}");
    assert!(legend.contains("fill=\"rgb(80,80,255)\""), "{legend}");
    // The root is the later report's total, its BEFORE the earlier one's.
    let totals = |p: &str| {
        let r = parse_valid(&std::fs::read_to_string(p).unwrap());
        let t = &r["totals"];
        (u(&t["count"]), u(&t["bytes_alloc"]), u(&t["waste_bytes"]))
    };
    let (before, after) = (totals(&reports[0]), totals(&reports[1]));
    let root = &frames(&svg)[0];
    assert_eq!(root.name, "all");
    assert_eq!((root.count, root.bytes, root.waste), after, "{svg}");
    let root_line = svg.lines().find(|l| l.contains("<title>all&#10;")).unwrap();
    let change = after.2 as i128 - before.2 as i128;
    assert!(
        root_line.contains(&format!(
            "before {} wasted bytes, change {change:+}",
            before.2
        )),
        "{root_line}"
    );
    let lint = Command::new("xmllint")
        .args(["--noout", svg_path.to_str().unwrap()])
        .output()
        .expect("xmllint (scripts/setup installs libxml2-utils)");
    assert!(
        lint.status.success(),
        "{}",
        String::from_utf8_lossy(&lint.stderr)
    );
}
