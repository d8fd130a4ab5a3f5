//! Turning a report into text: a table for people, JSON for scripts. The
//! JSON is a flat, stable shape of its own, so internal types can change
//! without breaking consumers. Unknown values are `null` (e.g. static
//! fields of a cache absent from /proc/slabinfo, traced fields when nothing
//! was traced), never a misleading 0.

use serde::Serialize;

use super::hints::Hint;
use super::report::{CacheRow, SlabReport, TopSite};
use super::watch::{CacheDelta, Presence};
use crate::contract::{self, Kind};
use crate::model::{human_count, human_size, pct, signed_count, signed_size};
use crate::render::table::{hidden_note, new_table, render};

/// What a slab JSON document holds: the report, or one `--watch` frame.
#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum Mode {
    Report,
    Watch,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    mode: Mode,
    duration_s: Option<f64>,
    sysfs: bool,
    total_memory_bytes: u64,
    caches: Vec<JsonCache>,
    hints: &'a [Hint],
    notes: &'a [String],
}

#[derive(Serialize)]
struct JsonCache {
    name: String,
    aliases: Vec<String>,
    sysfs_dir: Option<String>,
    object_size: Option<u64>,
    padded_size: Option<u64>,
    objs_per_slab: Option<u64>,
    pages_per_slab: Option<u64>,
    active_objs: Option<u64>,
    num_objs: Option<u64>,
    num_slabs: Option<u64>,
    memory_bytes: Option<u64>,
    partial_bytes: Option<u64>,
    loss_bytes: Option<u64>,
    /// Traced allocations: `count`, as in every kind.
    count: Option<u64>,
    frees: Option<u64>,
    bytes_req: Option<u64>,
    bytes_alloc: Option<u64>,
    /// Internal fragmentation: bytes_alloc - bytes_req.
    waste_bytes: Option<u64>,
    waste_pct: Option<f64>,
    alloc_rate: Option<f64>,
    free_rate: Option<f64>,
    net_objs: Option<i64>,
    net_bytes: Option<i64>,
    /// What the run allocated and still holds (every object tracked:
    /// `--sort growth`).
    held_objs: Option<u64>,
    held_bytes: Option<u64>,
    /// Change between the first and last static read.
    growth_objs: Option<i64>,
    growth_bytes: Option<i64>,
    presence: Option<Presence>,
    top_sites: Vec<TopSite>,
}

impl From<&CacheRow> for JsonCache {
    fn from(row: &CacheRow) -> JsonCache {
        let s = row.stat.as_ref();
        let t = row.traced.as_ref();
        let g = row.growth.as_ref();
        JsonCache {
            name: row.name.clone(),
            aliases: s.map(|s| s.aliases.clone()).unwrap_or_default(),
            sysfs_dir: s.and_then(|s| s.sysfs_dir.clone()),
            object_size: s.map(|s| s.object_size),
            padded_size: s.map(|s| s.padded_size),
            objs_per_slab: s.map(|s| s.objs_per_slab),
            pages_per_slab: s.map(|s| s.pages_per_slab),
            active_objs: s.map(|s| s.active_objs),
            num_objs: s.map(|s| s.num_objs),
            num_slabs: s.map(|s| s.num_slabs),
            memory_bytes: s.map(|s| s.memory_bytes),
            partial_bytes: s.and_then(|s| s.partial_bytes),
            loss_bytes: s.map(|s| s.loss_bytes),
            count: t.map(|t| t.allocs),
            frees: t.map(|t| t.frees),
            bytes_req: t.map(|t| t.bytes_req),
            bytes_alloc: t.map(|t| t.bytes_alloc),
            waste_bytes: t.map(|t| t.waste_bytes),
            waste_pct: t.map(|t| pct(t.waste_bytes, t.bytes_alloc)),
            alloc_rate: t.map(|t| t.alloc_rate),
            free_rate: t.map(|t| t.free_rate),
            net_objs: t.map(|t| t.net_objs),
            net_bytes: t.map(|t| t.net_bytes),
            held_objs: t.and_then(|t| t.held_objs),
            held_bytes: t.and_then(|t| t.held_bytes),
            growth_objs: g.map(|g| g.delta_objs()),
            growth_bytes: g.map(|g| g.delta_memory()),
            presence: g.map(|g| g.presence),
            top_sites: t.map(|t| t.top_sites.clone()).unwrap_or_default(),
        }
    }
}

pub fn report_json(report: &SlabReport) -> String {
    let json = JsonReport {
        mode: Mode::Report,
        duration_s: report.duration_s,
        sysfs: report.sysfs,
        total_memory_bytes: report.total_memory,
        caches: report.caches.iter().map(JsonCache::from).collect(),
        hints: &report.hints,
        notes: &report.notes,
    };
    contract::pretty(Kind::Slab, &json)
}

/// The report as a table fitted to `width` columns, with hints and notes.
/// The column `--sort growth` sorts by is `growth`: the change in slab
/// memory between reads when untraced; when traced (every object tracked),
/// the bytes the run allocated and still holds, beside `held` objects and
/// the `top grower`, while the change between reads is `Δmemory`. Other
/// traced sorts show allocations minus frees (`net`) and the `top waster`.
pub fn report_table(report: &SlabReport, width: Option<u16>) -> String {
    let traced = report.caches.iter().any(|c| c.traced.is_some());
    let tracked = report
        .caches
        .iter()
        .any(|c| c.traced.as_ref().is_some_and(|t| t.held_bytes.is_some()));
    let growth = report.caches.iter().any(|c| c.growth.is_some());
    let mut header = vec![
        "cache", "active", "total", "objsize", "obj/slab", "pages", "memory", "partial", "loss",
    ];
    if growth {
        header.push(if traced { "Δmemory" } else { "growth" });
    }
    if tracked {
        header.extend(["alloc/s", "free/s", "held", "growth", "waste", "top grower"]);
    } else if traced {
        header.extend(["alloc/s", "free/s", "net", "waste", "top waster"]);
    }
    let traced_cells = header.len()
        - header
            .iter()
            .position(|&h| h == "alloc/s")
            .unwrap_or(header.len());
    // The top site is text, like the cache name.
    let text = if traced {
        vec![header.len() - 1]
    } else {
        vec![]
    };
    let mut table = new_table(&header, &text, width);
    let dash = || "-".to_string();
    for row in &report.caches {
        let mut cells: Vec<String> = Vec::with_capacity(header.len());
        cells.push(with_merges(
            &row.name,
            row.stat.as_ref().map_or(0, |s| s.aliases.len()),
        ));
        match &row.stat {
            Some(s) => {
                let size = if s.padded_size != s.object_size {
                    format!("{} ({})", s.object_size, s.padded_size)
                } else {
                    s.object_size.to_string()
                };
                cells.extend([
                    human_count(s.active_objs),
                    human_count(s.num_objs),
                    size,
                    s.objs_per_slab.to_string(),
                    s.pages_per_slab.to_string(),
                    human_size(s.memory_bytes),
                    s.partial_bytes.map_or_else(dash, human_size),
                    human_size(s.loss_bytes),
                ]);
            }
            None => cells.extend(std::iter::repeat_with(dash).take(8)),
        }
        if growth {
            cells.push(match &row.growth {
                Some(g) if g.presence == Presence::Appeared => {
                    format!("new {}", signed_size(g.delta_memory()))
                }
                Some(g) if g.presence == Presence::Vanished => "gone".into(),
                Some(g) => signed_size(g.delta_memory()),
                None => dash(),
            });
        }
        match &row.traced {
            Some(t) if traced => {
                cells.push(human_count(t.alloc_rate.round() as u64));
                cells.push(human_count(t.free_rate.round() as u64));
                if tracked {
                    cells.push(t.held_objs.map_or_else(dash, human_count));
                    cells.push(signed_size(row.growth_bytes()));
                } else {
                    cells.push(signed_count(t.net_objs));
                }
                cells.push(if t.bytes_alloc > 0 {
                    format!(
                        "{} ({:.0}%)",
                        human_size(t.waste_bytes),
                        pct(t.waste_bytes, t.bytes_alloc)
                    )
                } else {
                    "0".into()
                });
                cells.push(t.top_sites.first().map_or_else(String::new, |s| {
                    match s.held_bytes.filter(|_| tracked) {
                        Some(held) => format!("{} +{}", s.function, human_size(held)),
                        None => format!("{} {}", s.function, human_size(s.waste_bytes)),
                    }
                }));
            }
            _ => cells.extend(std::iter::repeat_with(dash).take(traced_cells)),
        }
        table.add_row(cells);
    }

    let table = render(table);
    let mut out = format!(
        "slab memory {} in all caches{}\n{table}\n",
        human_size(report.total_memory),
        report
            .duration_s
            .map_or_else(String::new, |d| format!(", traced for {d:.1} s")),
    );
    out.push_str(&hidden_note(report.hidden));
    if !report.hints.is_empty() {
        out.push_str("\nhints:\n");
        for h in &report.hints {
            out.push_str(&format!("  - {}\n", h.text));
        }
    }
    for n in &report.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

/// One `--watch` frame: changes since the previous read over `secs`,
/// fitted to `width` columns.
/// A cache's name in the tables, with how many caches SLUB merged into it.
fn with_merges(name: &str, merged: usize) -> String {
    match merged {
        0 => name.to_string(),
        n => format!("{name} (+{n} merged)"),
    }
}

pub fn watch_table(deltas: &[CacheDelta], secs: f64, rows: usize, width: Option<u16>) -> String {
    let mut table = new_table(
        &[
            "cache", "active", "Δobjs", "memory", "Δmemory", "Δmem/s", "",
        ],
        &[6],
        width,
    );
    let total: i64 = deltas.iter().map(CacheDelta::delta_memory).sum();
    for d in deltas.iter().take(rows) {
        let rate = if secs > 0.0 {
            (d.delta_memory() as f64 / secs).round() as i64
        } else {
            0
        };
        table.add_row(vec![
            with_merges(&d.name, d.aliases.len()),
            human_count(d.active_after),
            signed_count(d.delta_objs()),
            human_size(d.memory_after),
            signed_size(d.delta_memory()),
            signed_size(rate),
            match d.presence {
                Presence::Both => String::new(),
                Presence::Appeared => "new cache".into(),
                Presence::Vanished => "cache destroyed".into(),
            },
        ]);
    }
    let table = render(table);
    format!(
        "slab memory change over {secs:.1} s: {}\n{table}\n{}",
        signed_size(total),
        hidden_note(deltas.len().saturating_sub(rows)),
    )
}

#[derive(Serialize)]
struct JsonWatchFrame {
    mode: Mode,
    elapsed_s: f64,
    interval_s: f64,
    delta_memory_bytes: i64,
    caches: Vec<JsonDelta>,
}

#[derive(Serialize)]
struct JsonDelta {
    name: String,
    aliases: Vec<String>,
    presence: Presence,
    object_size: u64,
    active_objs: u64,
    delta_objs: i64,
    memory_bytes: u64,
    delta_memory_bytes: i64,
}

/// One `--watch` frame as a single JSON line (JSON Lines, one per read).
pub fn watch_json(deltas: &[CacheDelta], elapsed_s: f64, interval_s: f64, rows: usize) -> String {
    let frame = JsonWatchFrame {
        mode: Mode::Watch,
        elapsed_s,
        interval_s,
        delta_memory_bytes: deltas.iter().map(CacheDelta::delta_memory).sum(),
        caches: deltas
            .iter()
            .take(rows)
            .map(|d| JsonDelta {
                name: d.name.clone(),
                aliases: d.aliases.clone(),
                presence: d.presence,
                object_size: d.object_size,
                active_objs: d.active_after,
                delta_objs: d.delta_objs(),
                memory_bytes: d.memory_after,
                delta_memory_bytes: d.delta_memory(),
            })
            .collect(),
    };
    contract::line(Kind::Slab, &frame)
}

#[cfg(test)]
mod tests {
    use super::super::hints::{Evidence, Hint, HintKind};
    use super::super::report::tests::fixture;
    use super::super::report::{build_report, ReportInput, SortKey};
    use super::super::traced::{TracedCache, TracedRun, TracedSite};
    use super::*;
    use crate::testing::{assert_contains, assert_keys, kmalloc, stats};

    fn traced_report() -> SlabReport {
        let snap = fixture();
        let k = kmalloc(96);
        let mut c = TracedCache::new(k.clone());
        c.allocs = 10;
        c.bytes_req = 800;
        c.bytes_alloc = 960;
        let run = TracedRun {
            duration_s: 2.0,
            caches: vec![c],
            sites: vec![TracedSite {
                function: "f".into(),
                call_site: "f+0x10".into(),
                cache: k,
                stats: stats(10, 800, 960),
                held: None,
            }],
            skipped: vec![],
            objects_tracked: false,
        };
        let mut r = build_report(
            ReportInput {
                traced: Some(&run),
                ..ReportInput::of(&snap)
            },
            SortKey::Rate,
            3,
        );
        r.hints.push(Hint {
            kind: HintKind::Boundary,
            site: Some("f".into()),
            call_site: Some("f+0x10".into()),
            cache: "kmalloc-96".into(),
            saving_bytes: 1,
            evidence: Some(Evidence::of(
                &stats(10, 800, 960),
                &kmalloc(96),
                "f+0x10",
                &[],
                2.0,
            )),
            text: "t".into(),
        });
        r
    }

    #[test]
    fn json_has_the_documented_field_names() {
        let v: serde_json::Value = serde_json::from_str(&report_json(&traced_report())).unwrap();
        let cache = &v["caches"][0];
        #[rustfmt::skip]
        assert_keys(cache, "caches[]", &[
            "name", "object_size", "active_objs", "num_objs", "count", "frees",
            "bytes_req", "bytes_alloc", "waste_bytes", "top_sites",
        ]);
        assert_eq!(cache["name"], "kmalloc-96");
        assert_eq!(cache["waste_bytes"], 160);
        assert_eq!(cache["top_sites"][0]["function"], "f");
        assert_eq!(cache["top_sites"][0]["waste_bytes"], 160);
        let hint = &v["hints"][0];
        assert_keys(
            hint,
            "hints[]",
            &[
                "kind",
                "site",
                "call_site",
                "cache",
                "saving_bytes",
                "evidence",
                "text",
            ],
        );
        assert_eq!(hint["kind"], "boundary");
        assert_eq!(hint["call_site"], "f+0x10");
        #[rustfmt::skip]
        assert_keys(&hint["evidence"], "hints[].evidence", &[
            "cache_kind", "sizes", "size_lo", "size_hi", "sized_by", "count",
            "alloc_rate", "waste_bytes", "waste_pct",
        ]);
        assert_eq!(hint["evidence"]["cache_kind"], "size_class");
        assert_eq!(hint["evidence"]["alloc_rate"], 5.0);
        assert_eq!(v["duration_s"], 2.0);
        assert_eq!((&v["kind"], &v["mode"]), (&"slab".into(), &"report".into()));
    }

    #[test]
    fn static_json_leaves_traced_fields_null() {
        let snap = fixture();
        let r = build_report(ReportInput::of(&snap), SortKey::Size, 1);
        let v: serde_json::Value = serde_json::from_str(&report_json(&r)).unwrap();
        assert!(v["caches"][0]["count"].is_null());
        assert!(v["caches"][0]["object_size"].is_u64());
        assert_eq!(v["hints"], serde_json::json!([]));
    }

    #[test]
    fn table_says_how_many_caches_it_left_out() {
        let r = build_report(ReportInput::of(&fixture()), SortKey::Size, 3);
        let text = report_table(&r, None);
        assert!(
            text.contains(&format!("({} more rows not shown", r.hidden)) && r.hidden > 0,
            "{text}"
        );
    }

    /// The table of a `--sort growth` run (every object tracked): the
    /// column it sorts by is `growth`, beside `held`, and the site named is
    /// the one growing, never the churning waster of the same cache.
    #[test]
    fn growth_table_names_the_growing_site() {
        let snap = fixture();
        let run = super::super::report::tests::tracked_run();
        let r = build_report(
            ReportInput {
                traced: Some(&run),
                ..ReportInput::of(&snap)
            },
            SortKey::Growth,
            2,
        );
        let text = report_table(&r, None);
        assert_contains(
            &text,
            &["held", "growth", "top grower", "grow +1.2M", "+1.2M"],
        );
        assert!(
            !text.contains("churn") && !text.contains("top waster"),
            "{text}"
        );
        let k4 = text.lines().find(|l| l.contains("kmalloc-4k")).unwrap();
        assert!(k4.contains(" 300 "), "{k4}");
        let v: serde_json::Value = serde_json::from_str(&report_json(&r)).unwrap();
        crate::schema_check::assert_valid(&v);
        let c = &v["caches"][0];
        assert_eq!(
            (&c["held_objs"], &c["held_bytes"]),
            (&300.into(), &(300 * 4096).into())
        );
        assert_eq!(c["top_sites"][0]["function"], "grow");
        assert_eq!(c["top_sites"][0]["held_objs"], 300);
        assert_eq!(c["top_sites"].as_array().unwrap().len(), 1);
        assert_eq!(v["schema_version"], 2);
        // Other sorts name the waster, under a header that says so.
        let text = report_table(&traced_report(), None);
        assert_contains(&text, &["top waster", "f 160", "net"]);
        assert!(
            !text.contains("top grower") && !text.contains("held"),
            "{text}"
        );
    }

    #[test]
    fn table_mentions_hints_and_traced_columns() {
        let text = report_table(&traced_report(), None);
        assert_contains(
            &text,
            &["alloc/s", "kmalloc-96", "160 (17%)", "hints:\n  - t"],
        );
    }

    #[test]
    fn watch_frame_marks_new_and_destroyed_caches() {
        let d = vec![
            CacheDelta {
                name: "new".into(),
                aliases: vec!["UNIX".into(), "UNIX-STREAM".into()],
                presence: Presence::Appeared,
                object_size: 64,
                active_before: 0,
                active_after: 10,
                memory_before: 0,
                memory_after: 4096,
            },
            CacheDelta {
                name: "old".into(),
                aliases: vec![],
                presence: Presence::Vanished,
                object_size: 64,
                active_before: 10,
                active_after: 0,
                memory_before: 8192,
                memory_after: 0,
            },
        ];
        let text = watch_table(&d, 2.0, 10, None);
        assert!(
            text.contains("new cache") && text.contains("cache destroyed"),
            "{text}"
        );
        assert_contains(&text, &["change over 2.0 s: -4.0K", "+2.0K"]);
        // A merged cache keeps its merge note, as in the static table
        // (issue 46: --watch dropped it).
        assert_contains(&text, &["new (+2 merged)"]);
        assert!(!text.contains("old (+"), "{text}");
        assert!(!text.contains("more rows"), "{text}");
        let one = watch_table(&d, 2.0, 1, None);
        assert!(
            one.contains("(1 more rows not shown") && !one.contains("old"),
            "{one}"
        );
        let v: serde_json::Value = serde_json::from_str(&watch_json(&d, 4.0, 2.0, 1)).unwrap();
        assert_eq!((&v["kind"], &v["mode"]), (&"slab".into(), &"watch".into()));
        assert_eq!(v["delta_memory_bytes"], -4096);
        assert_eq!(v["caches"].as_array().unwrap().len(), 1);
        assert_eq!(v["caches"][0]["presence"], "appeared");
        assert_eq!(v["caches"][0]["delta_objs"], 10);
        assert_eq!(
            v["caches"][0]["aliases"],
            serde_json::json!(["UNIX", "UNIX-STREAM"])
        );
    }

    #[test]
    fn json_follows_the_schema() {
        use crate::schema_check::assert_valid;
        let parsed = |t: String| serde_json::from_str::<serde_json::Value>(&t).unwrap();
        assert_valid(&parsed(report_json(&traced_report())));
        let snap = fixture();
        let r = build_report(ReportInput::of(&snap), SortKey::Size, usize::MAX);
        assert_valid(&parsed(report_json(&r)));
        let d = super::super::watch::diff(&snap, &snap);
        assert_valid(&parsed(watch_json(&d, 4.0, 2.0, usize::MAX)));
    }
}
