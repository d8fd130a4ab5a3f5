//! The JSON contract: every JSON document kheap writes (and each line of
//! `top -b --format json` and `slab --watch --format json`) starts with
//! `"kind"` and `"schema_version"`, so a reader knows what it holds without
//! guessing from its fields. The fields that follow are described by
//! `schema/<kind>.schema.json` and docs/json.md. Pure.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// What a JSON document is: the subcommand that wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Record,
    Leaks,
    Top,
    Slab,
    Malloc,
    Diff,
}

impl Kind {
    /// Each kind's own version, bumped when a field is added, renamed or
    /// removed, or changes meaning. record, leaks, top 2: `cgroups` rows, `cgroup` on process rows,
    /// `lost.map_full_cgroups`; 3: `source` on site, stack and cache rows,
    /// `totals.sources` (`--source`); 4: `processes` on stack rows.
    pub fn schema_version(self) -> u32 {
        match self {
            // 3: per-source rows and totals (--source); leaks also retention
            // on `cgroups` rows (--by cgroup) and `cgroup` on
            // `leaks.processes` rows. 4: who made each stack (`processes`
            // on stack rows; top shares the stack row and never fills it);
            // leaks also `excluded_bytes` in `leaks.accounting` rows, which
            // `unexplained_bytes` now leaves out. 5: `lost.latency_nested`.
            // 6: `lost.kmalloc_cache_stale`. 7: the interrupt row of
            // `processes` (`interrupt`; `pid`, `comm` null there). 8:
            // `lost.recursion_misses`. 9: top's
            // `overhead.bpf_recursion_misses` removed, the same count as
            // `lost.recursion_misses` (record unchanged: they share a version).
            // 10: `run.kernel_memory_bytes`, and top's
            // `overhead.maps_read_ms`.
            Kind::Record | Kind::Top => 10,
            // leaks 5: the page row of `leaks.accounting` compares every
            // page (`counted_elsewhere_bytes` added back, frees of pages
            // allocated before the run, `frees_untracked_bytes`, taken off)
            // with `-MemFree - pcp`, beside /proc/vmstat's own counts
            // (`vmstat_pgalloc_bytes`, `vmstat_pgfree_bytes`). 8:
            // `lost.latency_nested`. 9: `lost.kmalloc_cache_stale`. 10: the interrupt row of
            // `processes` and `leaks.processes`, which is filled only where
            // every allocation's context is tested. 11:
            // `lost.recursion_misses`. 12: `leaks.recursion_misses` removed,
            // the same count as `lost.recursion_misses`. 13:
            // `run.kernel_memory_bytes`. 14: `call_site` of each
            // `leaks.timeline.series` (two series of one function apart).
            // 15: `growth_bytes_per_s` is the slope of what is still held
            // by when it was allocated, no longer the outstanding bytes
            // over the run (the same field, another meaning). 16:
            // `merged_caches` on site and cache rows: what the code asked for.
            Kind::Leaks => 16,
            // malloc 2: `frees` and `frees_null` only with --outstanding
            // (frees are not probed otherwise); 3: `cgroup` on process
            // entries; 4: `stack_depth` says how stacks were unwound
            // (frame_pointer, dwarf, unwind_samples), `lost.unwind_*`.
            // 5: `estimated` on stack rows; 6: `run.kernel_memory_bytes`;
            // 7: `lost.caller_unreadable`.
            Kind::Malloc => 7,
            // slab 2: `held_objs` and `held_bytes` on caches and their
            // `top_sites` (what the run allocated and still holds, with
            // --sort growth, which tracks every object); `top_sites` are
            // then the sites holding the most, and a cache's `frees`,
            // `net_*` those of the objects the run allocated; `call_site`
            // and `evidence` on hints, the `rounding` kind; bimodal hints
            // are per call site; `aliases` on `--watch` rows.
            Kind::Slab => 2,
            // diff 2: rows are matched by a stable identity (`name`: a
            // cache's own name, without its merge note), and `cache`, a
            // joined string, became `caches`, a list.
            Kind::Diff => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Record => "record",
            Kind::Leaks => "leaks",
            Kind::Top => "top",
            Kind::Slab => "slab",
            Kind::Malloc => "malloc",
            Kind::Diff => "diff",
        }
    }
}

/// A body with the contract's two leading fields.
#[derive(Serialize)]
struct Tagged<'a, T: Serialize> {
    kind: Kind,
    schema_version: u32,
    #[serde(flatten)]
    body: &'a T,
}

fn tagged<T: Serialize>(kind: Kind, body: &T) -> Tagged<'_, T> {
    Tagged {
        kind,
        schema_version: kind.schema_version(),
        body,
    }
}

/// A whole report, indented, with a final newline.
pub fn pretty<T: Serialize>(kind: Kind, body: &T) -> String {
    serde_json::to_string_pretty(&tagged(kind, body)).expect("kheap's reports always serialize")
        + "\n"
}

/// One record of a stream (JSON Lines): one line, newline included.
pub fn line<T: Serialize>(kind: Kind, body: &T) -> String {
    serde_json::to_string(&tagged(kind, body)).expect("kheap's reports always serialize") + "\n"
}

/// The header of a kheap JSON document.
#[derive(Deserialize)]
struct Header {
    kind: Option<serde_json::Value>,
    schema_version: Option<serde_json::Value>,
}

/// The kind of the kheap JSON document `text` (`what`: a file name, for
/// messages), checked against the schema version this kheap reads. Says in
/// one line what is wrong with anything else. Only the two header fields are
/// kept: the rest is checked to be JSON and skipped, so an input of many
/// megabytes costs no more memory than its text.
pub fn read_kind(text: &str, what: &str) -> Result<Kind> {
    let header: Header = serde_json::from_str(text).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => {
            anyhow::anyhow!("{what} is not a kheap JSON report (not a JSON object)")
        }
        _ => anyhow::Error::new(e).context(format!("{what} is not JSON")),
    })?;
    let Some(kind) = header.kind else {
        bail!(
            "{what} is not a kheap JSON report: it has no \"kind\" (write one with --format json)"
        );
    };
    let kind: Kind = serde_json::from_value(kind.clone())
        .map_err(|_| anyhow::anyhow!("{what}: unknown report kind {kind}"))?;
    let want = kind.schema_version();
    match header.schema_version.as_ref().map(|v| (v, v.as_u64())) {
        Some((_, Some(v))) if v == u64::from(want) => Ok(kind),
        Some((_, Some(v))) => bail!(
            "{what} has schema_version {v}; this kheap reads {} version {want}: use the kheap that wrote it",
            kind.name()
        ),
        Some((v, None)) => bail!(
            "{what} has schema_version {v}, which is not a whole number (kheap writes {want}): \
             it was not written by kheap, or was edited"
        ),
        None => bail!("{what} has no schema_version: it is not a kheap JSON report"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Body {
        duration_s: f64,
        rows: Vec<u32>,
    }

    #[test]
    fn kind_and_version_come_first() {
        let body = Body {
            duration_s: 1.5,
            rows: vec![1, 2],
        };
        let text = pretty(Kind::Leaks, &body);
        let leaks_head = format!(
            "{{\n  \"kind\": \"leaks\",\n  \"schema_version\": {},\n",
            Kind::Leaks.schema_version()
        );
        assert!(text.starts_with(&leaks_head), "{text}");
        assert!(text.ends_with("}\n"));
        let l = line(Kind::Top, &body);
        let top_head = format!(
            "{{\"kind\":\"top\",\"schema_version\":{},\"duration_s\":1.5",
            Kind::Top.schema_version()
        );
        assert!(l.starts_with(&top_head), "{l}");
        assert_eq!(l.lines().count(), 1);
        assert_eq!(read_kind(&text, "a.json").unwrap(), Kind::Leaks);
    }

    #[test]
    fn anything_else_is_refused_in_one_line() {
        let err = |t: &str| format!("{:#}", read_kind(t, "x.json").unwrap_err());
        assert!(err("{\"sites\": []}").contains("has no \"kind\""));
        assert!(err("{\"kind\": \"nope\", \"schema_version\": 1}").contains("unknown report kind"));
        let newer = Kind::Record.schema_version() + 1;
        let text = format!("{{\"kind\": \"record\", \"schema_version\": {newer}}}");
        assert!(err(&text).contains(&format!("schema_version {newer}")));
        assert!(err("{\"kind\": \"record\"}").contains("no schema_version"));
        let e = err("{\"kind\": \"record\", \"schema_version\": \"4\"}");
        assert!(
            e.contains("schema_version \"4\", which is not a whole number"),
            "{e}"
        );
        assert!(err("[1]").contains("not a kheap JSON report"));
        assert!(err("nope").starts_with("x.json is not JSON"));
        for e in [err("{}"), err("[1]"), err("nope")] {
            assert!(!e.contains('\n'), "{e}");
        }
    }

    /// The pure renderers' JSON of constructed reports follows the schema
    /// of its kind: record, leaks (report and snapshot), malloc (with and
    /// without --outstanding), a top interval and a diff. Slab's are
    /// checked beside its renderer.
    mod schemas {
        use super::super::*;
        use crate::diff::{self, DiffBy};
        use crate::report::fixtures::{fixture_symbols, leak_snapshot, sample_snapshot};
        use crate::report::{build, BuildOptions, Report, RunInfo};
        use crate::schema_check::{assert_valid, schema_errors};

        fn parsed(text: &str) -> serde_json::Value {
            serde_json::from_str(text).unwrap()
        }

        fn kmem(snap: &crate::model::snapshot::Snapshot, every: u32) -> Report {
            build(
                snap,
                &fixture_symbols(),
                BuildOptions {
                    stack_sample_every: every,
                    duration_s: 2.0,
                    run: RunInfo {
                        command: Some("kheap-load msg".into()),
                        ..Default::default()
                    },
                },
            )
        }

        /// Two readings of two sites (one per cgroup), a trigger fired.
        fn sample_timeline() -> crate::report::timeline::Timeline {
            use crate::model::live::Outstanding;
            use crate::model::{CgroupSlot, Source};
            use crate::report::timeline::*;
            let mut b = TimelineBuilder::new(0.5, 1, 16, 1);
            let key = |cgroup| SeriesKey {
                call_site: 0xffff_0000,
                source: Source::Kmalloc,
                cgroup: Some(cgroup),
            };
            let o = |objects| Outstanding {
                objects,
                bytes_alloc: objects * 64,
            };
            for objects in [3, 5] {
                let read = [
                    (key(CgroupSlot::Cgroup(9)), o(objects)),
                    (key(CgroupSlot::Interrupt), o(1)),
                ]
                .into_iter()
                .collect();
                b.add(objects as f64 / 2.0, &read, MemLines::default(), 12);
            }
            let label = |k: &SeriesKey| SeriesLabel {
                function: "load_msg".into(),
                call_site: "load_msg+0x1c".into(),
                cgroup: match k.cgroup {
                    Some(CgroupSlot::Cgroup(id)) => Some(crate::cgroup::CgroupRef::unnamed(id)),
                    _ => None,
                },
            };
            let fired = TriggerMark {
                t_s: 2.5,
                condition: "site:load_msg+=128".into(),
                path: Some("snapshot-site-2.5s.json".into()),
            };
            b.finish(&label, vec![fired])
        }

        #[test]
        fn record_and_leaks() {
            let mut rec = kmem(&sample_snapshot(), 10);
            let mut with_procs = sample_snapshot();
            let some_site = *with_procs.sites.values().next().unwrap();
            with_procs.procs.insert(Some(7), ("msgd".into(), some_site));
            with_procs.procs.insert(None, (String::new(), some_site));
            rec.processes = kmem(&with_procs, 10).processes;
            assert_eq!(rec.processes.len(), 2, "a process and the interrupt row");
            assert_valid(&parsed(&pretty(Kind::Record, &rec)));

            let mut snap = leak_snapshot(4);
            let mut leaks = kmem(&snap, 1);
            assert!(!leaks.leaks.as_ref().unwrap().processes.is_empty());
            assert_valid(&parsed(&pretty(Kind::Leaks, &leaks)));
            leaks.leaks.as_mut().unwrap().timeline = Some(sample_timeline());
            assert_valid(&parsed(&pretty(Kind::Leaks, &leaks)));
            snap.leaks.as_mut().unwrap().kind = "snapshot".into();
            let v = parsed(&pretty(Kind::Leaks, &kmem(&snap, 256)));
            assert_eq!(v["leaks"]["snapshot"], true);
            assert_valid(&v);
            // Rows of a merged cache name the caches their code asked for.
            let merged = kmem(&crate::report::fixtures::merged_leak_snapshot(), 1);
            let v = parsed(&pretty(Kind::Leaks, &merged));
            let asked = |rows: &str| {
                v[rows]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|r| r.get("merged_caches"))
                    .cloned()
                    .collect::<Vec<_>>()
            };
            let want = serde_json::json!([{
                "cache": "signal_cache (merged: UNIX, UNIX-STREAM)",
                "outstanding_count": 4,
                "asked": [{ "name": "UNIX-STREAM", "outstanding_count": 3 }],
            }]);
            assert_eq!(asked("sites"), std::slice::from_ref(&want));
            assert_eq!(asked("caches"), [want]);
            assert_valid(&v);
            // A record report is not a leaks report, nor the other way.
            assert!(!schema_errors(&parsed(&pretty(Kind::Leaks, &rec))).is_empty());
            assert!(!schema_errors(&parsed(&pretty(Kind::Record, &leaks))).is_empty());
        }

        #[test]
        fn a_renamed_field_fails() {
            let v = parsed(&pretty(Kind::Record, &kmem(&sample_snapshot(), 10)));
            let renamed = |path: &[&str], from: &str, to: &str| {
                let mut v = v.clone();
                let mut o = &mut v;
                for p in path {
                    o = match p.parse::<usize>() {
                        Ok(i) => &mut o[i],
                        Err(_) => &mut o[*p],
                    };
                }
                let m = o.as_object_mut().unwrap();
                let x = m.remove(from).unwrap();
                m.insert(to.into(), x);
                v
            };
            for (path, from, to) in [
                (&[][..], "duration_s", "duration"),
                (&["totals"][..], "count", "allocs"),
                (&["lost"][..], "map_full", "full"),
                (&["sites", "0"][..], "bytes_req", "bytes"),
                (&["sites", "0", "hist", "0"][..], "lo", "low"),
                (&["stacks", "0"][..], "frames", "stack"),
                (&["caches", "0"][..], "name", "cache"),
            ] {
                let errors = schema_errors(&renamed(path, from, to));
                assert!(!errors.is_empty(), "{path:?}.{from} renamed to {to} passed");
            }
        }

        #[test]
        fn malloc() {
            use crate::malloc::report::{build, tests};
            let (mut snap, frames) = tests::sample();
            let v = parsed(&pretty(Kind::Malloc, &build(&snap, &frames, tests::opts())));
            assert!(v["sites"][0].get("outstanding_count").is_some());
            assert_valid(&v);
            snap.live = None;
            let v = parsed(&pretty(Kind::Malloc, &build(&snap, &frames, tests::opts())));
            assert!(v["totals"].get("outstanding_count").is_none());
            assert_valid(&v);
        }

        #[test]
        fn top_interval() {
            use crate::top::view::{Interval, TopSort};
            let iv = Interval {
                time: "2026-11-30T21:00:00.000Z".into(),
                interval_s: 1.0,
                aged_out: 3,
                overhead: Default::default(),
                report: kmem(&sample_snapshot(), 1024),
            };
            let line = crate::top::batch::json(
                &iv,
                TopSort::Bytes,
                &crate::top::view::ObjectSizes::default(),
                Some(1),
            );
            assert_eq!(line.lines().count(), 1);
            assert_valid(&parsed(&line));
        }

        #[test]
        fn diff_of_each_comparable_kind() {
            for kind in [Kind::Record, Kind::Leaks] {
                let before = kmem(&sample_snapshot(), 10);
                let after = match kind {
                    Kind::Leaks => kmem(&leak_snapshot(1), 10),
                    _ => kmem(&sample_snapshot(), 1),
                };
                for by in [DiffBy::Site, DiffBy::Stack, DiffBy::Cache] {
                    let d = diff::diff(kind, &before, &after, by);
                    assert_valid(&parsed(&pretty(Kind::Diff, &d)));
                }
            }
        }
    }
}
