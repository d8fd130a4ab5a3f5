//! `kheap leaks --format html`: the timeline as one self-contained page.
//! Two panels of inline SVG on one time axis: outstanding bytes over time
//! stacked by site, on a scale of their own; below, the change of
//! /proc/meminfo's kernel lines since the first reading, on theirs (a
//! system-wide line neither squashes the areas nor runs off the plot).
//! Every series has a colour (`palette`) and a label (`labels`) of its
//! own; the snapshot triggers that fired are marked; a readout on the page
//! shows the values at the time under the pointer (or `?t=SECONDS`) with
//! who allocated each series (`owners`), and a help line says so
//! (`readout`); every reading is in a table. No network fetch, no library:
//! a file a person opens anywhere. Every name is escaped.

mod labels;
mod owners;
mod palette;
mod readout;
mod scale;

use std::fmt::Write as _;

use crate::model::human_size;
use crate::render::flame::escape;
use crate::report::timeline::{MemLines, Series, Timeline};
use crate::report::Report;
use labels::Candidate;
use palette::Rgb;
use scale::Scale;

const WIDTH: f64 = 960.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
/// The stacked areas' panel.
const AREAS_TOP: f64 = 20.0;
const AREAS_BOTTOM: f64 = 320.0;
/// The meminfo lines' panel, below it, with a title line between.
const LINES_TOP: f64 = 372.0;
const LINES_BOTTOM: f64 = 482.0;
const HEIGHT: f64 = 504.0;
// The panels do not overlap, and both fit the picture.
const _: () = assert!(AREAS_BOTTOM < LINES_TOP && LINES_BOTTOM < HEIGHT);

/// The meminfo lines drawn, as their change since the first reading.
type MemLine = (&'static str, fn(&MemLines) -> u64);
const MEM_LINES: [MemLine; 4] = [
    ("Slab", |m| m.slab_bytes),
    ("SUnreclaim", |m| m.sunreclaim_bytes),
    ("VmallocUsed", |m| m.vmalloc_used_bytes),
    ("Percpu", |m| m.percpu_bytes),
];

/// The page for `report`'s timeline (a page saying there is none if the
/// run took no reading).
pub fn html(report: &Report, title: &str) -> String {
    let timeline = report.leaks.as_ref().and_then(|l| l.timeline.as_ref());
    let mut page = String::new();
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title>\n<style>{STYLE}</style></head>\n<body>\n<h1>{t}</h1>\n",
        t = escape(title)
    );
    match timeline.filter(|t| !t.points.is_empty()) {
        Some(t) => body(&mut page, t, report),
        None => page.push_str("<p>No timeline: the run took no reading.</p>\n"),
    }
    page.push_str("</body></html>\n");
    page
}

const STYLE: &str = "body{font:13px sans-serif;margin:16px}svg{background:#fff}\
#help{color:#333}#readout{font:12px monospace;white-space:pre-wrap;border:1px solid #888;padding:4px 6px;min-height:3em;max-width:940px}\
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:1px 4px;text-align:right}\
.legend span{display:inline-block;margin-right:12px}.sw{width:10px;height:10px;display:inline-block;margin-right:3px}";

/// One series as drawn: its label, colour and who allocated it.
struct Drawn {
    label: String,
    colour: Rgb,
    owners: Vec<owners::Owner>,
}

/// The series' labels, made unique with what the report knows of each:
/// the caches its site allocates from, then the call site.
fn series_labels(series: &[Series], report: &Report) -> Vec<String> {
    let candidates: Vec<Candidate> = series
        .iter()
        .map(|s| {
            let mut name = format!("{} [{}]", s.function, s.source);
            if let Some(c) = &s.cgroup {
                let _ = write!(name, " {}", c.path.as_deref().unwrap_or("?"));
            } else if s.interrupt {
                name.push_str(" (interrupt)");
            }
            let caches = report
                .sites
                .iter()
                .find(|r| r.source == s.source && r.call_site == s.call_site)
                .map(|r| r.caches.join(", "))
                .filter(|c| !c.is_empty());
            Candidate {
                name,
                details: caches
                    .map(|c| format!("cache {c}"))
                    .into_iter()
                    .chain((!s.call_site.is_empty()).then(|| format!("at {}", s.call_site)))
                    .collect(),
            }
        })
        .collect();
    labels::unique(&candidates)
}

fn body(page: &mut String, t: &Timeline, report: &Report) {
    let colours = palette::series(t.series.len());
    let series: Vec<Drawn> = series_labels(&t.series, report)
        .into_iter()
        .zip(colours)
        .zip(owners::of_series(report, &t.series))
        .map(|((label, colour), owners)| Drawn {
            label,
            colour,
            owners,
        })
        .collect();
    // Each point's values per series (0 where it was not among the top).
    let values: Vec<Vec<u64>> = t
        .points
        .iter()
        .map(|p| {
            let mut v = vec![0u64; series.len() + 1];
            for s in &p.sites {
                v[s.series] = s.bytes;
            }
            v[series.len()] = p.other.bytes;
            v
        })
        .collect();
    let first_mem = t.points[0].meminfo;
    let deltas: Vec<[i64; 4]> = t
        .points
        .iter()
        .map(|p| MEM_LINES.map(|(_, f)| f(&p.meminfo) as i64 - f(&first_mem) as i64))
        .collect();
    let areas = Scale::stacked(&values, AREAS_TOP, AREAS_BOTTOM);
    let lines = Scale::holding(deltas.iter().flatten().copied(), LINES_TOP, LINES_BOTTOM);
    let t_end = t.points.last().map_or(1.0, |p| p.t_s).max(t.interval_s);
    let x = |ts: f64| LEFT + ts / t_end * (WIDTH - LEFT - RIGHT);

    if let Some(c) = report.run.command.as_deref() {
        let _ = writeln!(page, "<p>Command: <code>{}</code></p>", escape(c));
    }
    let _ = writeln!(
        page,
        "<p>Outstanding bytes of what was allocated while tracing, stacked by site (the {} largest at each reading, the rest as other), read every {} s{}. Below, on a scale of their own: the change of /proc/meminfo's kernel lines (the whole machine's) since the first reading.</p>",
        t.top_sites,
        t.interval_s,
        if t.estimated { " (estimates: --sample)" } else { "" }
    );
    legend(page, &series);
    let _ = writeln!(
        page,
        "<svg id=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\">"
    );
    areas_panel(page, t, &series, &values, &areas, &x, t_end);
    lines_panel(page, t, &deltas, &lines, &x, t_end);
    triggers(page, t, &x);
    let _ = writeln!(
        page,
        "<line id=\"cursor\" y1=\"{AREAS_TOP}\" y2=\"{LINES_BOTTOM}\" stroke=\"#000\" stroke-width=\"0.5\" visibility=\"hidden\"/>\n<rect id=\"hover\" x=\"{LEFT}\" y=\"{AREAS_TOP}\" width=\"{}\" height=\"{}\" fill=\"transparent\"/>\n</svg>",
        WIDTH - LEFT - RIGHT,
        LINES_BOTTOM - AREAS_TOP
    );
    readout::help_and_readout(page, t);
    readings_table(page, t, &series, &values);
    readout::script(page, t, &series, &values, &deltas, &x);
}

fn legend(page: &mut String, series: &[Drawn]) {
    page.push_str("<p class=\"legend\" id=\"legend-areas\">");
    let areas = series
        .iter()
        .map(|s| (s.label.as_str(), s.colour))
        .chain([("other", palette::OTHER)]);
    for (label, colour) in areas {
        let _ = write!(
            page,
            "<span class=\"entry\" data-colour=\"{colour}\"><i class=\"sw\" style=\"background:{colour}\"></i>{}</span>",
            escape(label)
        );
    }
    page.push_str("</p>\n");
}

/// Where the lines' legend starts, right of their panel's title.
const LINES_LEGEND_LEFT: f64 = WIDTH - RIGHT - 4.0 * 110.0;

/// The lines' own legend, at their panel.
fn lines_legend(page: &mut String, y: f64) {
    let mut px = LINES_LEGEND_LEFT;
    let styles = palette::LINES.iter().zip(palette::DASHES);
    for ((name, _), (colour, dash)) in MEM_LINES.iter().zip(styles) {
        let _ = write!(
            page,
            "<g class=\"entry\" data-colour=\"{colour}\"><line x1=\"{px:.1}\" x2=\"{:.1}\" y1=\"{ly:.1}\" y2=\"{ly:.1}\" stroke=\"{colour}\" stroke-width=\"2\" stroke-dasharray=\"{dash}\"/><text x=\"{:.1}\" y=\"{y:.1}\" font-size=\"11\">{name}</text></g>",
            px + 20.0,
            px + 24.0,
            ly = y - 4.0,
        );
        px += 110.0;
    }
}

fn areas_panel(
    page: &mut String,
    t: &Timeline,
    series: &[Drawn],
    values: &[Vec<u64>],
    scale: &Scale,
    x: &dyn Fn(f64) -> f64,
    t_end: f64,
) {
    open_panel(page, "areas", scale);
    axes(page, scale, t_end, x);
    // Stacked areas, bottom up in series order, then other.
    let mut below = vec![0u64; t.points.len()];
    let colours = series.iter().map(|s| s.colour).chain([palette::OTHER]);
    for (i, colour) in colours.enumerate() {
        let lower: Vec<(f64, f64)> = t
            .points
            .iter()
            .zip(&below)
            .map(|(p, &b)| (x(p.t_s), scale.y(b as i64)))
            .collect();
        for (b, v) in below.iter_mut().zip(values) {
            *b += v[i];
        }
        let upper = t
            .points
            .iter()
            .zip(&below)
            .map(|(p, &b)| (x(p.t_s), scale.y(b as i64)));
        let mut d = path_through(upper);
        for (px, py) in lower.iter().rev() {
            let _ = write!(d, "L{px:.1},{py:.1}");
        }
        let name = series.get(i).map_or("other", |s| s.label.as_str());
        let _ = writeln!(
            page,
            "<path class=\"area\" d=\"{d}Z\" fill=\"{colour}\" fill-opacity=\"0.9\"><title>{}</title></path>",
            escape(name)
        );
    }
    page.push_str("</g>\n");
}

fn lines_panel(
    page: &mut String,
    t: &Timeline,
    deltas: &[[i64; 4]],
    scale: &Scale,
    x: &dyn Fn(f64) -> f64,
    t_end: f64,
) {
    open_panel(page, "meminfo", scale);
    let _ = writeln!(
        page,
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">/proc/meminfo, change since the first reading:</text>",
        LINES_LEGEND_LEFT - 10.0,
        LINES_TOP - 10.0
    );
    lines_legend(page, LINES_TOP - 6.0);
    axes(page, scale, t_end, x);
    let styles = palette::LINES.iter().zip(palette::DASHES);
    for (k, ((name, _), (colour, dash))) in MEM_LINES.iter().zip(styles).enumerate() {
        let d = path_through(
            t.points
                .iter()
                .zip(deltas)
                .map(|(p, dl)| (x(p.t_s), scale.y(dl[k]))),
        );
        let _ = writeln!(
            page,
            "<path class=\"line\" d=\"{d}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" stroke-dasharray=\"{dash}\"><title>{name} (change)</title></path>"
        );
    }
    page.push_str("</g>\n");
}

/// Marks across both panels; marks close together (two conditions met at
/// one reading) get their labels on lines of their own.
fn triggers(page: &mut String, t: &Timeline, x: &dyn Fn(f64) -> f64) {
    let mut placed: Vec<f64> = Vec::new();
    for m in &t.triggers {
        let px = x(m.t_s);
        let line = placed
            .iter()
            .filter(|&&p| (p - px).abs() < LABEL_WIDTH)
            .count();
        placed.push(px);
        let _ = writeln!(
            page,
            "<g class=\"trigger\"><line x1=\"{px:.1}\" x2=\"{px:.1}\" y1=\"{AREAS_TOP}\" y2=\"{LINES_BOTTOM}\" stroke=\"#c00\" stroke-width=\"2\"/><text x=\"{:.1}\" y=\"{:.1}\" fill=\"#c00\">{}</text><title>{} at {:.1}s</title></g>",
            px + 3.0,
            AREAS_TOP + 12.0 + 14.0 * line as f64,
            escape(&m.condition),
            escape(&m.condition),
            m.t_s
        );
    }
}

/// One panel's axes: its value ticks, zero's line, the time under it.
/// Opens a panel's group, with the pixel and value range the page's
/// readout script maps the pointer through.
fn open_panel(page: &mut String, id: &str, scale: &Scale) {
    let _ = writeln!(
        page,
        "<g id=\"{id}\" data-top=\"{}\" data-bottom=\"{}\" data-lo=\"{}\" data-hi=\"{}\">",
        scale.top, scale.bottom, scale.lo, scale.hi
    );
}

/// An SVG path's data through the points, in order.
fn path_through(points: impl Iterator<Item = (f64, f64)>) -> String {
    let mut d = String::new();
    for (j, (px, py)) in points.enumerate() {
        let _ = write!(d, "{}{px:.1},{py:.1}", if j == 0 { "M" } else { "L" });
    }
    d
}

fn axes(page: &mut String, scale: &Scale, t_end: f64, x: &dyn Fn(f64) -> f64) {
    let _ = writeln!(
        page,
        "<line x1=\"{LEFT}\" x2=\"{LEFT}\" y1=\"{}\" y2=\"{}\" stroke=\"#444\"/><line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y0:.1}\" y2=\"{y0:.1}\" stroke=\"#444\"/>",
        scale.top,
        scale.bottom,
        WIDTH - RIGHT,
        y0 = scale.y(0)
    );
    for v in scale.ticks() {
        let label = if v < 0 {
            format!("-{}", human_size(v.unsigned_abs()))
        } else {
            human_size(v as u64)
        };
        let _ = writeln!(
            page,
            "<text class=\"tick\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"11\">{label}</text>",
            LEFT - 4.0,
            scale.y(v) + 4.0
        );
    }
    for k in 0..=5 {
        let ts = t_end * k as f64 / 5.0;
        let _ = writeln!(
            page,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"11\">{ts:.1}s</text>",
            x(ts),
            scale.bottom + 15.0
        );
    }
}

/// Where a trigger's label may overlap the next one's (pixels).
const LABEL_WIDTH: f64 = 150.0;

/// Every reading with exact numbers (bytes), for reading off and copying.
fn readings_table(page: &mut String, t: &Timeline, series: &[Drawn], values: &[Vec<u64>]) {
    page.push_str("<details><summary>Readings (bytes)</summary>\n<table id=\"readings\"><tr><th>t (s)</th><th>total</th>");
    for s in series {
        let _ = write!(page, "<th>{}</th>", escape(&s.label));
    }
    page.push_str("<th>other</th>");
    for (name, _) in MEM_LINES {
        let _ = write!(page, "<th>{name}</th>");
    }
    page.push_str("</tr>\n");
    for (p, v) in t.points.iter().zip(values) {
        let _ = write!(page, "<tr><td>{}</td><td>{}</td>", p.t_s, p.total.bytes);
        for b in v {
            let _ = write!(page, "<td>{b}</td>");
        }
        for (_, f) in MEM_LINES {
            let _ = write!(page, "<td>{}</td>", f(&p.meminfo));
        }
        page.push_str("</tr>\n");
    }
    page.push_str("</table></details>\n");
}

#[cfg(test)]
mod tests;
