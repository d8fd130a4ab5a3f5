//! `kheap leaks --format html`: the timeline as one self-contained page —
//! outstanding bytes over time stacked by site (inline SVG), the change of
//! /proc/meminfo's kernel lines since the first reading drawn over them,
//! the snapshot triggers that fired as marks, values on hover (a few lines
//! of inline JS) and every reading in a table. No network fetch, no
//! library: a file a person opens anywhere.

use std::fmt::Write as _;

use crate::model::human_size;
use crate::render::flame::escape;
use crate::report::timeline::{MemLines, Timeline};
use crate::report::Report;

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 20.0;
const BOTTOM: f64 = 40.0;

/// Areas, one per series in turn; "other" is grey.
const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#8cd17d",
];
const OTHER: &str = "#bab0ac";

/// The meminfo lines drawn, as their change since the first reading.
type MemLine = (&'static str, &'static str, fn(&MemLines) -> u64);
const MEM_LINES: [MemLine; 4] = [
    ("Slab", "#222222", |m| m.slab_bytes),
    ("SUnreclaim", "#d62728", |m| m.sunreclaim_bytes),
    ("VmallocUsed", "#1f77b4", |m| m.vmalloc_used_bytes),
    ("Percpu", "#2ca02c", |m| m.percpu_bytes),
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
        Some(t) => body(&mut page, t, report.run.command.as_deref()),
        None => page.push_str("<p>No timeline: the run took no reading.</p>\n"),
    }
    page.push_str("</body></html>\n");
    page
}

const STYLE: &str = "body{font:13px sans-serif;margin:16px}svg{background:#fff}\
#tip{position:absolute;display:none;background:#fffe;border:1px solid #888;padding:4px 6px;pointer-events:none;white-space:pre;font:12px monospace}\
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:1px 4px;text-align:right}\
.legend span{display:inline-block;margin-right:12px}.sw{width:10px;height:10px;display:inline-block;margin-right:3px}";

/// One series as drawn: its label and colour.
struct Drawn {
    label: String,
    colour: &'static str,
}

fn body(page: &mut String, t: &Timeline, command: Option<&str>) {
    let series: Vec<Drawn> = t
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut label = format!("{} [{}]", s.function, s.source);
            if let Some(c) = &s.cgroup {
                let _ = write!(label, " {}", c.path.as_deref().unwrap_or("?"));
            } else if s.interrupt {
                label.push_str(" (interrupt)");
            }
            Drawn {
                label,
                colour: PALETTE[i % PALETTE.len()],
            }
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
        .map(|p| MEM_LINES.map(|(_, _, f)| f(&p.meminfo) as i64 - f(&first_mem) as i64))
        .collect();
    let top = values
        .iter()
        .map(|v| v.iter().sum::<u64>() as i64)
        .chain(deltas.iter().flatten().copied())
        .max()
        .unwrap_or(0)
        .max(1);
    let bottom = deltas.iter().flatten().copied().min().unwrap_or(0).min(0);
    let t_end = t.points.last().map_or(1.0, |p| p.t_s).max(t.interval_s);
    let x = |ts: f64| LEFT + ts / t_end * (WIDTH - LEFT - RIGHT);
    let y = |b: i64| TOP + (top - b) as f64 / (top - bottom) as f64 * (HEIGHT - TOP - BOTTOM);

    if let Some(c) = command {
        let _ = writeln!(page, "<p>Command: <code>{}</code></p>", escape(c));
    }
    let _ = writeln!(
        page,
        "<p>Outstanding bytes of what was allocated while tracing, stacked by site (the {} largest at each reading, the rest as other), read every {} s{}; lines: the change of /proc/meminfo's kernel lines since the first reading.</p>",
        t.top_sites,
        t.interval_s,
        if t.estimated { " (estimates: --sample)" } else { "" }
    );
    legend(page, &series);
    let _ = writeln!(
        page,
        "<svg id=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\">"
    );
    axes(page, top, bottom, t_end, &x, &y);
    // Stacked areas, bottom up in series order, then other.
    let mut below = vec![0u64; t.points.len()];
    for (i, colour) in series.iter().map(|s| s.colour).chain([OTHER]).enumerate() {
        let lower: Vec<(f64, f64)> = t
            .points
            .iter()
            .zip(&below)
            .map(|(p, &b)| (x(p.t_s), y(b as i64)))
            .collect();
        for (b, v) in below.iter_mut().zip(&values) {
            *b += v[i];
        }
        let upper = t
            .points
            .iter()
            .zip(&below)
            .map(|(p, &b)| (x(p.t_s), y(b as i64)));
        let mut d = String::new();
        for (j, (px, py)) in upper.enumerate() {
            let _ = write!(d, "{}{px:.1},{py:.1}", if j == 0 { "M" } else { "L" });
        }
        for (px, py) in lower.iter().rev() {
            let _ = write!(d, "L{px:.1},{py:.1}");
        }
        let name = series.get(i).map_or("other", |s| s.label.as_str());
        let _ = writeln!(
            page,
            "<path class=\"area\" d=\"{d}Z\" fill=\"{colour}\" fill-opacity=\"0.85\"><title>{}</title></path>",
            escape(name)
        );
    }
    for (k, (name, colour, _)) in MEM_LINES.iter().enumerate() {
        let mut d = String::new();
        for (j, (p, dl)) in t.points.iter().zip(&deltas).enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1}",
                if j == 0 { "M" } else { "L" },
                x(p.t_s),
                y(dl[k])
            );
        }
        let _ = writeln!(
            page,
            "<path class=\"meminfo\" d=\"{d}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" stroke-dasharray=\"5,3\"><title>{name} (change)</title></path>"
        );
    }
    // Marks close together (two conditions met at one reading) get their
    // labels on lines of their own, not printed over each other.
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
            "<g class=\"trigger\"><line x1=\"{px:.1}\" x2=\"{px:.1}\" y1=\"{TOP}\" y2=\"{:.1}\" stroke=\"#c00\" stroke-width=\"2\"/><text x=\"{:.1}\" y=\"{:.1}\" fill=\"#c00\">{}</text><title>{} at {:.1}s</title></g>",
            HEIGHT - BOTTOM,
            px + 3.0,
            TOP + 12.0 + 14.0 * line as f64,
            escape(&m.condition),
            escape(&m.condition),
            m.t_s
        );
    }
    let _ = writeln!(
        page,
        "<line id=\"cursor\" y1=\"{TOP}\" y2=\"{}\" stroke=\"#000\" stroke-width=\"0.5\" visibility=\"hidden\"/>\n<rect id=\"hover\" x=\"{LEFT}\" y=\"{TOP}\" width=\"{}\" height=\"{}\" fill=\"transparent\"/>\n</svg>\n<div id=\"tip\"></div>",
        HEIGHT - BOTTOM,
        WIDTH - LEFT - RIGHT,
        HEIGHT - TOP - BOTTOM
    );
    readings_table(page, t, &series, &values);
    hover_script(page, t, &series, &values, &deltas, &x);
}

fn legend(page: &mut String, series: &[Drawn]) {
    page.push_str("<p class=\"legend\">");
    for s in series {
        let _ = write!(
            page,
            "<span><i class=\"sw\" style=\"background:{}\"></i>{}</span>",
            s.colour,
            escape(&s.label)
        );
    }
    let _ = write!(
        page,
        "<span><i class=\"sw\" style=\"background:{OTHER}\"></i>other</span>"
    );
    for (name, colour, _) in MEM_LINES {
        let _ = write!(
            page,
            "<span><i class=\"sw\" style=\"border-top:2px dashed {colour};height:0\"></i>{name} (change)</span>"
        );
    }
    page.push_str("</p>\n");
}

fn axes(
    page: &mut String,
    top: i64,
    bottom: i64,
    t_end: f64,
    x: &dyn Fn(f64) -> f64,
    y: &dyn Fn(i64) -> f64,
) {
    let _ = writeln!(
        page,
        "<line x1=\"{LEFT}\" x2=\"{LEFT}\" y1=\"{TOP}\" y2=\"{}\" stroke=\"#444\"/><line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y0:.1}\" y2=\"{y0:.1}\" stroke=\"#444\"/>",
        HEIGHT - BOTTOM,
        WIDTH - RIGHT,
        y0 = y(0)
    );
    for v in ticks(bottom, top) {
        let label = if v < 0 {
            format!("-{}", human_size(v.unsigned_abs()))
        } else {
            human_size(v as u64)
        };
        let _ = writeln!(
            page,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"11\">{label}</text>",
            LEFT - 4.0,
            y(v) + 4.0
        );
    }
    for k in 0..=5 {
        let ts = t_end * k as f64 / 5.0;
        let _ = writeln!(
            page,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"11\">{ts:.1}s</text>",
            x(ts),
            HEIGHT - BOTTOM + 16.0
        );
    }
}

/// Where a trigger's label may overlap the next one's (pixels).
const LABEL_WIDTH: f64 = 150.0;

/// Round values for the byte axis from `bottom` to `top`: multiples of 1,
/// 2 or 5 times a power of 1024 (so the labels read 2.0M, 4.0M, …), four
/// to ten of them, zero among them whenever the range holds it.
fn ticks(bottom: i64, top: i64) -> Vec<i64> {
    let span = (top - bottom).max(1) as f64;
    let step = (0..5)
        .flat_map(|p| {
            [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0].map(|m| m * 1024f64.powi(p))
        })
        .find(|&s| span / s <= 8.0)
        .unwrap_or(span) as i64;
    let first = bottom.div_euclid(step) * step;
    let first = if first < bottom { first + step } else { first };
    (0..)
        .map(|k| first + k * step)
        .take_while(|&v| v <= top)
        .collect()
}

/// Every reading with exact numbers (bytes), for reading off and copying.
fn readings_table(page: &mut String, t: &Timeline, series: &[Drawn], values: &[Vec<u64>]) {
    page.push_str("<details><summary>Readings (bytes)</summary>\n<table id=\"readings\"><tr><th>t (s)</th><th>total</th>");
    for s in series {
        let _ = write!(page, "<th>{}</th>", escape(&s.label));
    }
    page.push_str("<th>other</th>");
    for (name, _, _) in MEM_LINES {
        let _ = write!(page, "<th>{name}</th>");
    }
    page.push_str("</tr>\n");
    for (p, v) in t.points.iter().zip(values) {
        let _ = write!(page, "<tr><td>{}</td><td>{}</td>", p.t_s, p.total.bytes);
        for b in v {
            let _ = write!(page, "<td>{b}</td>");
        }
        for (_, _, f) in MEM_LINES {
            let _ = write!(page, "<td>{}</td>", f(&p.meminfo));
        }
        page.push_str("</tr>\n");
    }
    page.push_str("</table></details>\n");
}

/// The values the tooltip shows, as JSON in the page, and the few lines
/// that show the nearest reading's under the pointer.
fn hover_script(
    page: &mut String,
    t: &Timeline,
    series: &[Drawn],
    values: &[Vec<u64>],
    deltas: &[[i64; 4]],
    x: &dyn Fn(f64) -> f64,
) {
    let names: Vec<&str> = series
        .iter()
        .map(|s| s.label.as_str())
        .chain(["other"])
        .collect();
    let data = serde_json::json!({
        "names": names,
        "mem": MEM_LINES.map(|(n, _, _)| n),
        "points": t.points.iter().zip(values).zip(deltas).map(|((p, v), d)| serde_json::json!({
            "x": (x(p.t_s) * 10.0).round() / 10.0,
            "t": p.t_s,
            "total": p.total.bytes,
            "v": v,
            "mem": MEM_LINES.map(|(_, _, f)| f(&p.meminfo)),
            "d": d,
        })).collect::<Vec<_>>(),
        "triggers": t.triggers.iter().map(|m| serde_json::json!({"x": x(m.t_s), "c": m.condition})).collect::<Vec<_>>(),
    });
    // Inside <script>, "</" would end it early.
    let data = data.to_string().replace("</", "<\\/");
    let _ = writeln!(
        page,
        "<script id=\"kheap-data\" type=\"application/json\">{data}</script>\n<script>{HOVER_JS}</script>"
    );
}

/// Shows the reading nearest the pointer; `?t=SECS` in the URL shows the
/// one nearest that time at load (a link to a moment, and a test's hook).
const HOVER_JS: &str = r#"(function(){
const D=JSON.parse(document.getElementById('kheap-data').textContent);
const svg=document.getElementById('chart'),hover=document.getElementById('hover'),
cur=document.getElementById('cursor'),tip=document.getElementById('tip');
function size(b){const u=['B','K','M','G','T'];let i=0,v=Math.abs(b);while(v>=1024&&i<4){v/=1024;i++;}
return (b<0?'-':'')+(i?v.toFixed(1)+u[i]:String(v)+' B');}
function nearest(key,v){let best=D.points[0];for(const p of D.points){if(Math.abs(p[key]-v)<Math.abs(best[key]-v))best=p;}return best;}
function show(best,px,py){
cur.setAttribute('x1',best.x);cur.setAttribute('x2',best.x);cur.setAttribute('visibility','visible');
const lines=[best.t.toFixed(2)+'s  total '+size(best.total)+' ('+best.total+' bytes)'];
best.v.forEach(function(b,i){if(b>0)lines.push(D.names[i]+': '+size(b)+' ('+b+' bytes)');});
D.mem.forEach(function(n,i){lines.push(n+': '+size(best.mem[i])+' ('+(best.d[i]>=0?'+':'')+size(best.d[i])+')');});
for(const m of D.triggers){if(Math.abs(m.x-best.x)<6)lines.push('trigger: '+m.c);}
tip.textContent=lines.join('\n');tip.style.display='block';
tip.style.left=Math.max(0,Math.min(px,window.scrollX+document.documentElement.clientWidth-tip.offsetWidth-8))+'px';tip.style.top=py+'px';
svg.setAttribute('data-shown-t',String(best.t));}
hover.addEventListener('mousemove',function(e){
const r=svg.getBoundingClientRect(),sx=(e.clientX-r.left)*svg.viewBox.baseVal.width/r.width;
show(nearest('x',sx),e.pageX+12,e.pageY+12);});
hover.addEventListener('mouseleave',function(){tip.style.display='none';cur.setAttribute('visibility','hidden');});
const t=parseFloat(new URLSearchParams(location.search).get('t'));
if(!isNaN(t)){const b=nearest('t',t),r=svg.getBoundingClientRect();show(b,r.left+window.scrollX+b.x+12,r.top+window.scrollY+40);}
svg.setAttribute('data-chart-ready','1');
})();"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::live::Outstanding;
    use crate::model::Source;
    use crate::report::retention::LeakSummary;
    use crate::report::timeline::*;

    fn report_with(points: &[u64], fired: Vec<TriggerMark>) -> Report {
        let mut b = TimelineBuilder::new(1.0, 3, 64, 1);
        for (i, &objects) in points.iter().enumerate() {
            let key = SeriesKey {
                call_site: 1,
                source: Source::Kmalloc,
                cgroup: None,
            };
            let read = [(
                key,
                Outstanding {
                    objects,
                    bytes_alloc: objects * 4096,
                },
            )]
            .into_iter()
            .collect();
            let mem = MemLines {
                slab_bytes: (1 << 30) + objects * 4096,
                ..MemLines::default()
            };
            b.add(i as f64 + 1.0, &read, mem, 5);
        }
        let label = |_: &SeriesKey| SeriesLabel {
            function: "load_<msg>".into(),
            cgroup: None,
        };
        Report {
            leaks: Some(LeakSummary {
                timeline: Some(b.finish(&label, fired)),
                ..LeakSummary::default()
            }),
            ..Report::default()
        }
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
        // The embedded data cannot close its script element.
        let data = page.split("application/json\">").nth(1).unwrap();
        let data = data.split("</script>").next().unwrap();
        assert!(serde_json::from_str::<serde_json::Value>(data).is_ok());
    }

    #[test]
    fn axis_ticks_are_round_and_hold_zero() {
        let m = 1i64 << 20;
        let t = ticks(-23 * m - m / 3, 24 * m - m / 3);
        assert!(t.contains(&0), "{t:?}");
        assert!((4..=10).contains(&t.len()), "{t:?}");
        assert!(t.iter().all(|v| v % (5 * m) == 0), "{t:?}");
        assert_eq!(ticks(0, 1000), [0, 200, 400, 600, 800, 1000]);
        assert!(ticks(0, 0).contains(&0));
    }

    #[test]
    fn a_run_without_readings_says_so() {
        assert!(html(&report_with(&[], vec![]), "t").contains("No timeline"));
    }
}
