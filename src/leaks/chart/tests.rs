use super::*;
use crate::model::live::Outstanding;
use crate::model::Source;
use crate::report::retention::LeakSummary;
use crate::report::rows::{SiteRow, StackRow};
use crate::report::timeline::*;
use crate::report::{ProcessIdentity, StackProcess};

const M: u64 = 1 << 20;

/// A run of `points` readings of two call sites of one function (`site 1`
/// holds `objects` 4 KiB objects, `site 2` half as many); Slab rises with
/// them while VmallocUsed falls 33M (another process freeing), as in the
/// report of issue 46.
fn report_with(points: &[u64], fired: Vec<TriggerMark>) -> Report {
    let mut b = TimelineBuilder::new(1.0, 3, 64, 1);
    let key = |call_site| SeriesKey {
        call_site,
        source: Source::Kmalloc,
        cgroup: None,
    };
    let held = |objects| Outstanding {
        objects,
        bytes_alloc: objects * 4096,
    };
    for (i, &objects) in points.iter().enumerate() {
        let read = [(key(1), held(objects)), (key(2), held(objects / 2))]
            .into_iter()
            .collect();
        let mem = MemLines {
            slab_bytes: (1 << 30) + objects * 4096,
            vmalloc_used_bytes: (100 * M).saturating_sub(i as u64 * 11 * M),
            ..MemLines::default()
        };
        b.add(i as f64 + 1.0, &read, mem, 5);
    }
    let label = |k: &SeriesKey| SeriesLabel {
        function: "load_<msg>".into(),
        call_site: format!("load_<msg>+0x{}0", k.call_site),
        cgroup: None,
    };
    let site = |call_site: &str, cache: &str| SiteRow {
        source: Source::Kmalloc,
        function: "load_<msg>".into(),
        call_site: call_site.into(),
        caches: vec![cache.into()],
        ..SiteRow::default()
    };
    let stack = |call_site: &str, comm: &str, pid| StackRow {
        source: Source::Kmalloc,
        site_call_site: Some(call_site.into()),
        processes: vec![StackProcess {
            process: ProcessIdentity {
                pid: Some(pid),
                comm: Some(comm.into()),
                ..ProcessIdentity::default()
            },
            bytes_alloc: 4096,
            ..StackProcess::default()
        }],
        ..StackRow::default()
    };
    Report {
        sites: vec![
            site("load_<msg>+0x10", "kmalloc-4k"),
            site("load_<msg>+0x20", "kmalloc-4k"),
        ],
        stacks: vec![
            stack("load_<msg>+0x10", "<script>x", 41),
            stack("load_<msg>+0x20", "sh", 42),
        ],
        leaks: Some(LeakSummary {
            timeline: Some(b.finish(&label, fired)),
            ..LeakSummary::default()
        }),
        ..Report::default()
    }
}

/// The points of every `<path class="CLASS" d="…">`, as (x, y).
fn path_points(page: &str, class: &str) -> Vec<Vec<(f64, f64)>> {
    page.split(&format!("<path class=\"{class}\" d=\""))
        .skip(1)
        .map(|rest| {
            let d = rest.split('"').next().unwrap();
            d.split(['M', 'L', 'Z'])
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (x, y) = p.split_once(',').unwrap();
                    (x.parse().unwrap(), y.parse().unwrap())
                })
                .collect()
        })
        .collect()
}

/// The legend's entries (areas and lines): (colour, label).
fn legend_entries(page: &str) -> Vec<(String, String)> {
    page.split("class=\"entry\" data-colour=\"")
        .skip(1)
        .map(|rest| {
            let colour = rest.split('"').next().unwrap().to_string();
            // Up to the end of its text: `…</i>LABEL</span>` or `…>LABEL</text>`.
            let end = ["</span>", "</text>"]
                .iter()
                .filter_map(|m| rest.find(m))
                .min()
                .unwrap();
            let label = rest[..end].rsplit('>').next().unwrap().to_string();
            (colour, label)
        })
        .collect()
}

#[test]
fn the_page_names_the_site_shows_each_level_and_marks_triggers() {
    let fired = vec![TriggerMark {
        t_s: 2.0,
        condition: "site:load_msg+=4096".into(),
        path: None,
    }];
    let page = html(&report_with(&[1, 2, 3, 0], fired), "kheap leaks");
    assert!(page.contains("load_&lt;msg&gt; [kmalloc]"));
    for bytes in [4096, 8192, 12288] {
        assert!(page.contains(&format!("<td>{bytes}</td>")), "{bytes}");
    }
    assert!(page.contains("class=\"trigger\""));
    assert!(page.contains("site:load_msg+=4096"));
    // Self-contained: nothing fetched.
    for fetch in ["src=", "href=", "@import", "url("] {
        assert!(!page.contains(fetch), "{fetch}");
    }
    // The embedded data cannot close its script element, and reads back.
    let data = page.split("application/json\">").nth(1).unwrap();
    let data = data.split("</script>").next().unwrap();
    let data: serde_json::Value = serde_json::from_str(data).unwrap();
    assert_eq!(data["series"][0]["owners"][0], "<script>x [41]");
}

#[test]
fn meminfo_lines_have_a_panel_and_scale_of_their_own() {
    let page = html(&report_with(&[1000, 2000, 3000, 3000], vec![]), "t");
    let areas = path_points(&page, "area");
    let lines = path_points(&page, "line");
    assert_eq!(areas.len(), 3, "two sites and other");
    assert_eq!(lines.len(), 4);
    let ys = |paths: &[Vec<(f64, f64)>]| {
        let all: Vec<f64> = paths.iter().flatten().map(|p| p.1).collect();
        let lo = all.iter().copied().fold(f64::MAX, f64::min);
        let hi = all.iter().copied().fold(f64::MIN, f64::max);
        (lo, hi)
    };
    // The areas fill their panel: the highest stack (4500 objects) at its
    // top, nothing at its bottom; VmallocUsed's -33M does not reach them.
    assert_eq!(ys(&areas), (AREAS_TOP, AREAS_BOTTOM));
    assert!(page.contains(&format!("data-hi=\"{}\"", 4500 * 4096)));
    // The lines span theirs, the fall at its bottom, below the areas'.
    assert_eq!(ys(&lines), (LINES_TOP, LINES_BOTTOM));
    assert!(page.contains(&format!("data-lo=\"{}\"", -33 * M as i64)));
    for (x, _) in areas.iter().chain(&lines).flatten() {
        assert!((LEFT..=WIDTH - RIGHT).contains(x), "{x}");
    }
}

#[test]
fn no_two_legend_entries_share_a_label_or_a_colour() {
    let page = html(&report_with(&[1, 2], vec![]), "t");
    let entries = legend_entries(&page);
    // Two sites, other, four meminfo lines.
    assert_eq!(entries.len(), 7, "{entries:?}");
    let labels: std::collections::HashSet<&String> = entries.iter().map(|e| &e.1).collect();
    let colours: std::collections::HashSet<&String> = entries.iter().map(|e| &e.0).collect();
    assert_eq!(labels.len(), 7, "{entries:?}");
    assert_eq!(colours.len(), 7, "{entries:?}");
    // Two call sites of one function, in one cache: told apart by where.
    assert!(labels.contains(&"load_&lt;msg&gt; [kmalloc] (at load_&lt;msg&gt;+0x10)".to_string()));
    assert!(labels.contains(&"load_&lt;msg&gt; [kmalloc] (at load_&lt;msg&gt;+0x20)".to_string()));
}

#[test]
fn the_help_and_the_readout_are_on_the_page_not_only_on_hover() {
    let page = html(&report_with(&[1, 2, 3], vec![]), "t");
    let help = page.split("<p id=\"help\">").nth(1).unwrap();
    let help = help.split("</p>").next().unwrap();
    assert!(
        help.contains("point at it") && help.contains("?t=SECONDS"),
        "{help}"
    );
    assert!(help.contains("<code>?t=1.5</code>"), "{help}");
    assert!(page.contains("<div id=\"readout\">No time chosen"));
}

#[test]
fn hostile_names_reach_the_page_escaped() {
    let mut report = report_with(&[1, 2], vec![]);
    report.run.command = Some("<img onerror=x>".into());
    let page = html(&report, "<t>");
    for raw in ["<script>x", "<img", "<msg>", "<t>"] {
        assert!(!page.contains(raw), "{raw}");
    }
    assert!(page.contains("&lt;img onerror=x&gt;"));
}

#[test]
fn a_run_without_readings_says_so() {
    assert!(html(&report_with(&[], vec![]), "t").contains("No timeline"));
}
