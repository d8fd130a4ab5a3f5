//! `kheap leaks`' timeline: at each interval, what the top sites hold
//! (bytes and objects outstanding), the rest as "other", per source, and
//! /proc/meminfo's kernel lines beside them as the independent check.
//!
//! Memory stays bounded over any run: each point keeps at most `top` sites,
//! and when `max_points` are held the older half is merged pairwise into
//! points twice as coarse (recent points keep their resolution; an hour at
//! one second per point ends as a few hundred points). A merged point keeps
//! the later reading (outstanding memory is a level, not a rate) and the
//! highest total of the two, so a peak between readings is not lost.
//! Pure: the command reads the kernel and /proc and hands the readings in.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::cgroup::CgroupRef;
use crate::model::live::Outstanding;
use crate::model::{CgroupSlot, SiteKey, Source};
use crate::report::meminfo::MemInfo;

/// Points held before the older half is merged (a bounded report and chart).
pub const DEFAULT_MAX_POINTS: usize = 512;
/// Sites kept per point; the rest is summed as "other".
pub const DEFAULT_TOP_SITES: usize = 10;

/// One series of the chart: a call site of one source, and (with
/// `--by cgroup`) the cgroup or interrupt context that allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeriesKey {
    pub call_site: u64,
    pub source: Source,
    pub cgroup: Option<CgroupSlot>,
}

impl SeriesKey {
    pub fn of(site: &SiteKey, cgroup: Option<CgroupSlot>) -> SeriesKey {
        SeriesKey {
            call_site: site.call_site,
            source: site.cache.source(),
            cgroup,
        }
    }
}

/// Bytes (allocated size) and objects outstanding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Amount {
    pub bytes: u64,
    pub objects: u64,
}

impl Amount {
    fn add(&mut self, o: Amount) {
        self.bytes += o.bytes;
        self.objects += o.objects;
    }
}

/// The /proc/meminfo lines that count kernel memory, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemLines {
    pub slab_bytes: u64,
    pub sunreclaim_bytes: u64,
    pub vmalloc_used_bytes: u64,
    pub percpu_bytes: u64,
}

impl MemLines {
    pub fn of(m: &MemInfo) -> MemLines {
        MemLines {
            slab_bytes: m.line("Slab"),
            sunreclaim_bytes: m.line("SUnreclaim"),
            vmalloc_used_bytes: m.line("VmallocUsed"),
            percpu_bytes: m.line("Percpu"),
        }
    }

    /// /proc/meminfo alone (the full `MemInfo::read` also reads zoneinfo
    /// and vmstat, too much for every interval).
    pub fn read() -> MemLines {
        let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        MemLines::of(&MemInfo::parse(&text))
    }
}

/// One reading, as held while running (series by key).
#[derive(Clone, Debug, PartialEq)]
struct RawPoint {
    t_s: f64,
    span_s: f64,
    read_us: u64,
    sites: Vec<(SeriesKey, Amount)>,
    other: Amount,
    total: Amount,
    peak_bytes: u64,
    sources: Vec<(Source, Amount)>,
    meminfo: MemLines,
}

/// The timeline being collected.
#[derive(Clone, Debug)]
pub struct TimelineBuilder {
    interval_s: f64,
    top: usize,
    max_points: usize,
    /// Readings are of one address in `scale`: every number is scaled.
    scale: u64,
    points: Vec<RawPoint>,
    /// Every reading's cost, kept whole while points are merged.
    read_us_sum: u64,
    read_us_max: u64,
    readings: u64,
}

impl TimelineBuilder {
    pub fn new(interval_s: f64, top: usize, max_points: usize, sample_every: u32) -> Self {
        TimelineBuilder {
            interval_s,
            top: top.max(1),
            // Merging the older half needs at least two points in it.
            max_points: max_points.max(4),
            scale: u64::from(sample_every.max(1)),
            points: Vec::new(),
            read_us_sum: 0,
            read_us_max: 0,
            readings: 0,
        }
    }

    /// Adds the reading taken `t_s` seconds into the run: the live objects
    /// folded by series, /proc/meminfo's lines, and what the read cost.
    pub fn add(
        &mut self,
        t_s: f64,
        read: &HashMap<SeriesKey, Outstanding>,
        meminfo: MemLines,
        read_us: u64,
    ) {
        let mut all: Vec<(SeriesKey, Amount)> = read
            .iter()
            .map(|(k, o)| {
                let a = Amount {
                    bytes: o.bytes_alloc * self.scale,
                    objects: o.objects * self.scale,
                };
                (*k, a)
            })
            .collect();
        let mut total = Amount::default();
        let mut sources: HashMap<Source, Amount> = HashMap::new();
        for (k, a) in &all {
            total.add(*a);
            sources.entry(k.source).or_default().add(*a);
        }
        // Largest first; ties by key so a point is the same every time.
        all.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(&b.0)));
        let mut other = Amount::default();
        for (_, a) in all.iter().skip(self.top) {
            other.add(*a);
        }
        all.truncate(self.top);
        let mut sources: Vec<(Source, Amount)> = sources.into_iter().collect();
        sources.sort_by_key(|(s, _)| *s);
        let span_s = t_s - self.points.last().map_or(0.0, |p| p.t_s);
        self.points.push(RawPoint {
            t_s,
            span_s,
            read_us,
            sites: all,
            other,
            total,
            peak_bytes: total.bytes,
            sources,
            meminfo,
        });
        self.read_us_sum += read_us;
        self.read_us_max = self.read_us_max.max(read_us);
        self.readings += 1;
        if self.points.len() >= self.max_points {
            self.downsample();
        }
    }

    /// Merges the older half of the points pairwise.
    fn downsample(&mut self) {
        let half = self.points.len() / 2;
        let recent = self.points.split_off(half);
        let mut merged = Vec::with_capacity(half / 2 + 1 + recent.len());
        let mut older = std::mem::take(&mut self.points).into_iter();
        while let Some(first) = older.next() {
            match older.next() {
                Some(second) => merged.push(merge(first, second)),
                None => merged.push(first),
            }
        }
        merged.extend(recent);
        self.points = merged;
    }

    /// The latest point's reading of one series (0 if not in its top).
    pub fn latest(&self) -> Option<LatestReading<'_>> {
        self.points.last().map(|p| LatestReading { point: p })
    }

    /// Every series any point names, for the command to label.
    pub fn series_keys(&self) -> Vec<SeriesKey> {
        let mut keys: Vec<SeriesKey> = self
            .points
            .iter()
            .flat_map(|p| p.sites.iter().map(|(k, _)| *k))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// The timeline as reported, each series named by `label`.
    pub fn finish(
        &self,
        label: &dyn Fn(&SeriesKey) -> SeriesLabel,
        triggers: Vec<TriggerMark>,
    ) -> Timeline {
        let keys = self.series_keys();
        let index: HashMap<SeriesKey, usize> =
            keys.iter().enumerate().map(|(i, k)| (*k, i)).collect();
        let series = keys
            .iter()
            .map(|k| {
                let l = label(k);
                Series {
                    function: l.function,
                    call_site: l.call_site,
                    source: k.source,
                    interrupt: k.cgroup == Some(CgroupSlot::Interrupt),
                    cgroup: l.cgroup,
                }
            })
            .collect();
        let points = self
            .points
            .iter()
            .map(|p| Point {
                t_s: round3(p.t_s),
                span_s: round3(p.span_s),
                read_us: p.read_us,
                total: p.total,
                peak_bytes: p.peak_bytes,
                sites: p
                    .sites
                    .iter()
                    .map(|(k, a)| SitePoint {
                        series: index[k],
                        bytes: a.bytes,
                        objects: a.objects,
                    })
                    .collect(),
                other: p.other,
                sources: p
                    .sources
                    .iter()
                    .map(|(source, a)| SourcePoint {
                        source: *source,
                        bytes: a.bytes,
                        objects: a.objects,
                    })
                    .collect(),
                meminfo: p.meminfo,
            })
            .collect();
        Timeline {
            interval_s: self.interval_s,
            max_points: self.max_points as u64,
            top_sites: self.top as u64,
            estimated: self.scale > 1,
            readings: self.readings,
            read_us_mean: self.read_us_sum.checked_div(self.readings).unwrap_or(0),
            read_us_max: self.read_us_max,
            series,
            points,
            triggers,
        }
    }
}

/// The latest reading, for triggers that watch it.
pub struct LatestReading<'a> {
    point: &'a RawPoint,
}

impl LatestReading<'_> {
    pub fn meminfo(&self) -> MemLines {
        self.point.meminfo
    }
    pub fn total(&self) -> Amount {
        self.point.total
    }
    /// Bytes of the top series that `matches`, summed.
    pub fn bytes_where(&self, matches: &dyn Fn(&SeriesKey) -> bool) -> u64 {
        let p = self.point;
        p.sites
            .iter()
            .filter(|(k, _)| matches(k))
            .map(|(_, a)| a.bytes)
            .sum()
    }
}

fn merge(older: RawPoint, newer: RawPoint) -> RawPoint {
    RawPoint {
        span_s: older.span_s + newer.span_s,
        read_us: older.read_us.max(newer.read_us),
        peak_bytes: older.peak_bytes.max(newer.peak_bytes),
        ..newer
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// What the command knows of a series' name.
#[derive(Clone, Debug, Default)]
pub struct SeriesLabel {
    pub function: String,
    /// The call site itself, as a site row's `call_site` says it.
    pub call_site: String,
    pub cgroup: Option<CgroupRef>,
}

/// A snapshot trigger that fired, marked on the chart.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TriggerMark {
    pub t_s: f64,
    /// The condition as given (`sunreclaim+=10M`, `oom`, …).
    pub condition: String,
    /// The snapshot written, or null if it could not be.
    pub path: Option<String>,
}

/// The timeline as the JSON report carries it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    pub interval_s: f64,
    pub max_points: u64,
    pub top_sites: u64,
    /// Address sampling (--sample): every number is scaled, an estimate.
    pub estimated: bool,
    /// Readings taken (more than points once old points were merged).
    pub readings: u64,
    /// What one reading of the object map cost kheap, in microseconds.
    pub read_us_mean: u64,
    pub read_us_max: u64,
    pub series: Vec<Series>,
    pub points: Vec<Point>,
    pub triggers: Vec<TriggerMark>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Series {
    pub function: String,
    /// The call site (`function+0xoff`), as the site row's `call_site`:
    /// with `source` (and `cgroup`), what tells two series of one function
    /// apart.
    #[serde(default)]
    pub call_site: String,
    pub source: Source,
    /// With --by cgroup: who allocated (null: no cgroup, or not by cgroup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<CgroupRef>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupt: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Seconds since tracing began, at the reading.
    pub t_s: f64,
    /// Seconds this point stands for (the interval; more once merged).
    pub span_s: f64,
    pub read_us: u64,
    pub total: Amount,
    /// The highest total of the readings merged into this point.
    pub peak_bytes: u64,
    pub sites: Vec<SitePoint>,
    pub other: Amount,
    pub sources: Vec<SourcePoint>,
    pub meminfo: MemLines,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SitePoint {
    /// Index into `series`.
    pub series: usize,
    pub bytes: u64,
    pub objects: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SourcePoint {
    pub source: Source,
    pub bytes: u64,
    pub objects: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(call_site: u64) -> SeriesKey {
        SeriesKey {
            call_site,
            source: Source::Kmalloc,
            cgroup: None,
        }
    }

    fn read(sites: &[(u64, u64, u64)]) -> HashMap<SeriesKey, Outstanding> {
        sites
            .iter()
            .map(|&(cs, objects, bytes_alloc)| {
                (
                    key(cs),
                    Outstanding {
                        objects,
                        bytes_alloc,
                    },
                )
            })
            .collect()
    }

    fn label(k: &SeriesKey) -> SeriesLabel {
        SeriesLabel {
            function: format!("f{}", k.call_site),
            call_site: format!("f{}+0x1", k.call_site),
            cgroup: None,
        }
    }

    #[test]
    fn a_point_keeps_the_top_sites_and_sums_the_rest_as_other() {
        let mut b = TimelineBuilder::new(1.0, 2, 100, 1);
        b.add(
            1.0,
            &read(&[(1, 1, 100), (2, 2, 300), (3, 3, 50), (4, 1, 10)]),
            MemLines::default(),
            7,
        );
        let t = b.finish(&label, vec![]);
        let p = &t.points[0];
        let names: Vec<&str> = p
            .sites
            .iter()
            .map(|s| t.series[s.series].function.as_str())
            .collect();
        assert_eq!(names, ["f2", "f1"]);
        assert_eq!(
            p.other,
            Amount {
                bytes: 60,
                objects: 4
            }
        );
        assert_eq!(
            p.total,
            Amount {
                bytes: 460,
                objects: 7
            }
        );
        assert_eq!(p.sources.len(), 1);
        assert_eq!(p.sources[0].bytes, 460);
        assert_eq!((t.read_us_mean, t.read_us_max), (7, 7));
    }

    #[test]
    fn sampled_readings_are_scaled() {
        let mut b = TimelineBuilder::new(1.0, 5, 100, 8);
        b.add(1.0, &read(&[(1, 2, 64)]), MemLines::default(), 1);
        let t = b.finish(&label, vec![]);
        assert!(t.estimated);
        assert_eq!(t.points[0].sites[0].bytes, 512);
        assert_eq!(t.points[0].sites[0].objects, 16);
    }

    #[test]
    fn long_runs_stay_bounded_and_keep_the_recent_points_fine() {
        let max = 16;
        let mut b = TimelineBuilder::new(1.0, 3, max, 1);
        for i in 1..=10_000u64 {
            b.add(i as f64, &read(&[(1, i, i * 10)]), MemLines::default(), i);
            assert!(b.points.len() < max);
        }
        let t = b.finish(&label, vec![]);
        assert_eq!(t.readings, 10_000);
        assert_eq!(t.read_us_max, 10_000);
        let last = t.points.last().unwrap();
        // The newest reading is kept as it was, at full resolution.
        assert_eq!((last.t_s, last.span_s), (10_000.0, 1.0));
        assert_eq!(last.sites[0].bytes, 100_000);
        // Spans cover the whole run without gaps or overlaps.
        let covered: f64 = t.points.iter().map(|p| p.span_s).sum();
        assert_eq!(covered, 10_000.0);
        for w in t.points.windows(2) {
            assert_eq!(w[1].t_s - w[1].span_s, w[0].t_s);
            assert!(w[0].span_s >= w[1].span_s, "older points are coarser");
        }
        // A merged point keeps its span's peak.
        let first = &t.points[0];
        assert_eq!(first.peak_bytes, first.total.bytes);
    }

    #[test]
    fn a_merged_point_keeps_the_later_level_and_the_higher_peak() {
        let mut b = TimelineBuilder::new(1.0, 3, 4, 1);
        b.add(1.0, &read(&[(1, 1, 500)]), MemLines::default(), 1);
        b.add(2.0, &read(&[(1, 1, 100)]), MemLines::default(), 1);
        b.add(3.0, &read(&[(1, 1, 200)]), MemLines::default(), 1);
        b.add(4.0, &read(&[(1, 1, 300)]), MemLines::default(), 1);
        let t = b.finish(&label, vec![]);
        assert_eq!(t.points.len(), 3);
        let p = &t.points[0];
        assert_eq!((p.t_s, p.span_s, p.total.bytes), (2.0, 2.0, 100));
        assert_eq!(p.peak_bytes, 500);
    }
}
