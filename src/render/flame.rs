//! Interactive flame graphs as one self-contained SVG: frames sized by a
//! weight (bytes, allocations or wasted bytes), a title on every frame with
//! all three numbers, click to zoom, a reset, and a search (also from the
//! URL: `heap.svg?s=regex`). Built from the same stacks the folded renderer
//! writes. Pure string building, deterministic: children in name order,
//! colours from a hash of the name, no timestamps.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use clap::ValueEnum;

use crate::model::{human_count, human_size};

/// What sizes a frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Weight {
    /// Bytes allocated (for leaks: bytes still outstanding)
    #[default]
    Bytes,
    /// Allocations
    Count,
    /// Bytes lost to size-class rounding
    Waste,
}

/// One stack and its numbers. `frames` are outermost (caller) first, the
/// order of a folded line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    pub frames: Vec<String>,
    pub count: u64,
    pub bytes: u64,
    pub waste: u64,
    /// The same weight in the earlier run, for a differential graph.
    pub before: Option<u64>,
}

/// What the graph is about: its heading and the word for its bytes.
pub struct Labels<'a> {
    pub title: &'a str,
    pub subtitle: &'a str,
    /// "allocated" or "outstanding": what `bytes` means.
    pub bytes_word: &'a str,
}

#[derive(Default)]
struct Node {
    count: u64,
    bytes: u64,
    waste: u64,
    before: u64,
    children: BTreeMap<String, Node>,
}

impl Node {
    fn add(&mut self, s: &Sample) {
        // Saturating: inputs (diff's) can hold any u64.
        self.count = self.count.saturating_add(s.count);
        self.bytes = self.bytes.saturating_add(s.bytes);
        self.waste = self.waste.saturating_add(s.waste);
        self.before = self.before.saturating_add(s.before.unwrap_or(0));
    }

    fn weight(&self, w: Weight) -> u64 {
        match w {
            Weight::Bytes => self.bytes,
            Weight::Count => self.count,
            Weight::Waste => self.waste,
        }
    }

    fn depth(&self) -> usize {
        1 + self.children.values().map(Node::depth).max().unwrap_or(0)
    }
}

/// The deepest stack drawn: the tree is walked (drawn, measured, dropped)
/// recursively, and a 15,000-frame stack from a diff input overflowed the
/// thread's stack. Kernel stacks have at most 127 frames; deeper frames are
/// replaced by one frame that says how many were cut.
pub const MAX_FRAMES: usize = 512;

/// The frame that stands for `n` frames past [`MAX_FRAMES`].
fn cut_frame(n: usize) -> String {
    format!("[{n} deeper frames not drawn: at most {MAX_FRAMES}]")
}

fn tree(samples: &[Sample]) -> Node {
    let mut root = Node::default();
    for s in samples {
        root.add(s);
        let mut node = &mut root;
        let cut = s.frames.len().saturating_sub(MAX_FRAMES);
        let kept = if cut > 0 {
            MAX_FRAMES - 1
        } else {
            s.frames.len()
        };
        for f in &s.frames[..kept] {
            node = node.children.entry(f.clone()).or_default();
            node.add(s);
        }
        if cut > 0 {
            node = node
                .children
                .entry(cut_frame(s.frames.len() - kept))
                .or_default();
            node.add(s);
        }
    }
    root
}

const WIDTH: f64 = 1200.0;
const PAD: f64 = 10.0;
const FRAME_H: f64 = 16.0;
const TOP: f64 = 60.0;
const LEGEND_H: f64 = 18.0;
const BOTTOM: f64 = 30.0;

/// The SVG. With `Sample::before` set, a differential graph: frames sized
/// by the later run, red where the weight grew, blue where it shrank.
pub fn svg(samples: &[Sample], weight: Weight, labels: &Labels) -> String {
    let root = tree(samples);
    let differential = samples.iter().any(|s| s.before.is_some());
    let depth = root.depth();
    // A differential graph has a legend line above its frames.
    let top = if differential { TOP + LEGEND_H } else { TOP };
    let height = top + depth as f64 * FRAME_H + BOTTOM;
    let total = root.weight(weight);
    let max_delta = max_abs_delta(&root, weight).max(1);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r##"<?xml version="1.0" standalone="no"?>
<svg version="1.1" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" xmlns="http://www.w3.org/2000/svg" data-weight="{w}" data-total="{total}">
<style>
text {{ font-family: monospace; font-size: 12px; fill: #000; }}
.f rect {{ stroke: #fff; stroke-width: 0.5; }}
.f:hover rect {{ stroke: #000; }}
.f {{ cursor: pointer; }}
.btn {{ cursor: pointer; fill: #333; }}
.hide {{ display: none; }}
</style>
<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#fafafa"/>
<text x="{cx}" y="22" text-anchor="middle" style="font-size:16px">{title}</text>
<text x="{cx}" y="40" text-anchor="middle" style="fill:#555">{sub}</text>
<text id="reset" class="btn hide" x="{PAD}" y="22">Reset zoom</text>
<text id="search" class="btn" x="{sx}" y="22" text-anchor="end">Search</text>
<text id="matched" x="{sx}" y="{my}" text-anchor="end"> </text>
<text id="details" x="{PAD}" y="{my}"> </text>"##,
        // The --weight value, for scripts reading the file.
        w = format!("{weight:?}").to_lowercase(),
        cx = WIDTH / 2.0,
        sx = WIDTH - PAD,
        my = height - 10.0,
        title = escape(labels.title),
        sub = escape(labels.subtitle),
    );
    if differential {
        legend(&mut out, weight);
    }
    out.push_str("<g id=\"frames\">\n");
    let ctx = Ctx {
        top,
        weight,
        total,
        labels,
        differential,
        max_delta,
        depth,
    };
    frame(&mut out, &ctx, "all", &root, 0, 0.0);
    out.push_str("</g>\n<script><![CDATA[\n");
    out.push_str(SCRIPT);
    out.push_str("]]></script>\n</svg>\n");
    out
}

struct Ctx<'a> {
    /// Where the frames start (below the title, and the legend if any).
    top: f64,
    weight: Weight,
    total: u64,
    labels: &'a Labels<'a>,
    differential: bool,
    max_delta: u64,
    depth: usize,
}

/// Writes `node` and its children; `x` is the node's left edge as a
/// fraction of the total weight.
fn frame(out: &mut String, ctx: &Ctx, name: &str, node: &Node, level: usize, x: f64) {
    let w = node.weight(ctx.weight);
    if w == 0 || ctx.total == 0 {
        return;
    }
    let frac = w as f64 / ctx.total as f64;
    let px = PAD + x * (WIDTH - 2.0 * PAD);
    let pw = frac * (WIDTH - 2.0 * PAD);
    // Root at the bottom, callees above: the classic flame orientation.
    let y = ctx.top + (ctx.depth - 1 - level) as f64 * FRAME_H;
    let fill = if ctx.differential {
        diff_colour(
            node.weight(ctx.weight) as i128 - node.before as i128,
            ctx.max_delta,
        )
    } else if level == 0 {
        "rgb(200,200,200)".to_string()
    } else {
        colour(name)
    };
    let mut title = format!(
        "{name}\n{} allocations, {} {} ({} bytes), {} wasted ({} bytes), {:.2}% of {}",
        node.count,
        human_size(node.bytes),
        ctx.labels.bytes_word,
        node.bytes,
        human_size(node.waste),
        node.waste,
        frac * 100.0,
        weight_name(ctx.weight),
    );
    if ctx.differential {
        let delta = node.weight(ctx.weight) as i128 - node.before as i128;
        let _ = write!(
            title,
            "\nbefore {} {}, change {delta:+}",
            node.before,
            weight_name(ctx.weight)
        );
    }
    let _ = writeln!(
        out,
        r#"<g class="f" data-x="{x:.6}" data-w="{frac:.6}" data-l="{level}" data-count="{}" data-bytes="{}" data-waste="{}"><title>{}</title><rect x="{px:.2}" y="{y:.1}" width="{pw:.2}" height="{h:.1}" fill="{fill}"/><text x="{tx:.2}" y="{ty:.1}">{}</text></g>"#,
        node.count,
        node.bytes,
        node.waste,
        escape(&title),
        escape(&fit(name, pw)),
        h = FRAME_H - 1.0,
        tx = px + 3.0,
        ty = y + FRAME_H - 4.5,
    );
    let mut cx = x;
    for (child_name, child) in &node.children {
        frame(out, ctx, child_name, child, level + 1, cx);
        cx += child.weight(ctx.weight) as f64 / ctx.total as f64;
    }
}

/// What the colours of a differential graph mean, on one line under the
/// subtitle.
fn legend(out: &mut String, weight: Weight) {
    let y = TOP - 8.0;
    let swatch = |out: &mut String, x: f64, fill: &str, text: &str| {
        let _ = writeln!(
            out,
            r##"<rect x="{x:.1}" y="{:.1}" width="12" height="12" fill="{fill}" stroke="#999" stroke-width="0.5"/><text x="{:.1}" y="{y:.1}">{}</text>"##,
            y - 10.0,
            x + 16.0,
            escape(text)
        );
    };
    out.push_str("<g id=\"legend\">\n");
    let w = weight_name(weight);
    swatch(
        out,
        PAD,
        &diff_colour(1, 1),
        &format!("grew: more {w} in AFTER than BEFORE"),
    );
    swatch(
        out,
        380.0,
        &diff_colour(-1, 1),
        &format!("shrank: fewer {w} in AFTER"),
    );
    swatch(out, 640.0, &diff_colour(0, 1), "unchanged");
    let _ = writeln!(
        out,
        r##"<text x="{:.1}" y="{y:.1}" style="fill:#555">width: AFTER; deeper colour: larger change</text>"##,
        780.0
    );
    out.push_str("</g>\n");
}

fn weight_name(w: Weight) -> &'static str {
    match w {
        Weight::Bytes => "bytes",
        Weight::Count => "allocations",
        Weight::Waste => "wasted bytes",
    }
}

/// The label that fits `width` pixels of 7px monospace characters, cut
/// with "..", or nothing when not even three characters fit. The script
/// does the same after a zoom.
fn fit(name: &str, width: f64) -> String {
    let chars = ((width - 6.0) / 7.0).floor().max(0.0) as usize;
    if chars < 3 {
        String::new()
    } else if name.chars().count() <= chars {
        name.to_string()
    } else {
        let mut s: String = name.chars().take(chars - 2).collect();
        s.push_str("..");
        s
    }
}

/// A warm colour that depends only on the name, so the same function has
/// the same colour in every graph.
fn colour(name: &str) -> String {
    let h = fnv1a(name.as_bytes());
    let r = 205 + (h % 50);
    let g = 80 + ((h >> 8) % 150);
    let b = (h >> 16) % 55;
    format!("rgb({r},{g},{b})")
}

/// Red for growth, blue for shrinkage, stronger the larger the change
/// relative to the largest one; white for none.
fn diff_colour(delta: i128, max: u64) -> String {
    let strength = (delta.unsigned_abs() as f64 / max as f64).min(1.0);
    let fade = (255.0 - 175.0 * strength).round() as u8;
    match delta.signum() {
        1 => format!("rgb(255,{fade},{fade})"),
        -1 => format!("rgb({fade},{fade},255)"),
        _ => "rgb(245,245,245)".to_string(),
    }
}

fn max_abs_delta(node: &Node, w: Weight) -> u64 {
    let own = (node.weight(w) as i128 - node.before as i128).unsigned_abs() as u64;
    node.children
        .values()
        .map(|c| max_abs_delta(c, w))
        .fold(own, u64::max)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// XML text and attribute escaping (C++ and kernel symbols carry < > &).
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // A character reference keeps each frame on one line.
            '\n' => out.push_str("&#10;"),
            // Control characters are not allowed in XML 1.0.
            c if (c as u32) < 0x20 && c != '\t' => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// A flame graph with its totals under its title (record, leaks, malloc,
/// diff).
pub fn titled(samples: &[Sample], weight: Weight, title: &str, bytes_word: &str) -> String {
    let subtitle = subtitle(samples, weight, bytes_word);
    svg(
        samples,
        weight,
        &Labels {
            title,
            subtitle: &subtitle,
            bytes_word,
        },
    )
}

/// A summary line under the title: the total in all three measures.
pub fn subtitle(samples: &[Sample], weight: Weight, bytes_word: &str) -> String {
    let root = tree(samples);
    let mut line = format!(
        "{} allocations, {} {bytes_word}, {} wasted; width = {}",
        human_count(root.count),
        human_size(root.bytes),
        human_size(root.waste),
        weight_name(weight)
    );
    if samples.iter().any(|s| s.before.is_some()) {
        let (before, after) = (root.before, root.weight(weight));
        let show = |v: u64| match weight {
            Weight::Count => human_count(v),
            _ => human_size(v),
        };
        let change = after as i128 - before as i128;
        let sign = if change < 0 { "-" } else { "+" };
        let _ = write!(
            line,
            "; BEFORE {}, change {sign}{}",
            show(before),
            show(change.unsigned_abs() as u64)
        );
    }
    line.push_str("; click a frame to zoom");
    line
}

/// The frame that holds what of a report's totals no captured stack holds
/// (stacks not captured, lost, or cut from the report), so that the root
/// of a graph is the report's total.
pub const UNSTACKED: &str = "[in no captured stack]";

/// The sample that makes `samples` add up to `total` (its count, bytes
/// and waste), if anything is missing.
pub fn remainder(samples: &[Sample], total: &Sample) -> Option<Sample> {
    let root = tree(samples);
    let s = Sample {
        frames: vec![UNSTACKED.to_string()],
        count: total.count.saturating_sub(root.count),
        bytes: total.bytes.saturating_sub(root.bytes),
        waste: total.waste.saturating_sub(root.waste),
        before: None,
    };
    (s.count > 0 || s.bytes > 0 || s.waste > 0).then_some(s)
}

/// Zoom, reset, search (button or `?s=` in the URL), and the hover line.
/// Sets `data-flame-ready` on the root element once wired, and
/// `data-flame-matches` after a search, so a headless browser can show that
/// it ran.
const SCRIPT: &str = r#"(function () {
  var svg = document.documentElement;
  var frames = Array.prototype.slice.call(document.querySelectorAll('g.f'));
  var W = 1200, PAD = 10, SPAN = W - 2 * PAD;
  var details = document.getElementById('details');
  var matched = document.getElementById('matched');
  var reset = document.getElementById('reset');
  function num(g, k) { return parseFloat(g.getAttribute('data-' + k)); }
  function name(g) { return g.querySelector('title').textContent.split('\n')[0]; }
  function fit(n, w) {
    var c = Math.floor((w - 6) / 7);
    if (c < 3) return '';
    return n.length <= c ? n : n.slice(0, c - 2) + '..';
  }
  function place(g, x, w) {
    var r = g.querySelector('rect'), t = g.querySelector('text');
    r.setAttribute('x', (PAD + x * SPAN).toFixed(2));
    r.setAttribute('width', (w * SPAN).toFixed(2));
    t.setAttribute('x', (PAD + x * SPAN + 3).toFixed(2));
    t.textContent = fit(name(g), w * SPAN);
  }
  function zoom(target) {
    var x0 = num(target, 'x'), w0 = num(target, 'w'), l0 = num(target, 'l');
    frames.forEach(function (g) {
      var x = num(g, 'x'), w = num(g, 'w'), l = num(g, 'l');
      var inside = x >= x0 - 1e-9 && x + w <= x0 + w0 + 1e-9;
      if (l < l0 && x <= x0 + 1e-9 && x + w >= x0 + w0 - 1e-9) {
        g.classList.remove('hide'); place(g, 0, 1);
      } else if (l >= l0 && inside) {
        g.classList.remove('hide'); place(g, (x - x0) / w0, w / w0);
      } else {
        g.classList.add('hide');
      }
    });
    reset.classList.toggle('hide', l0 === 0);
  }
  function unzoom() { zoom(frames[0]); }
  function search(term) {
    var re;
    try { re = new RegExp(term); } catch (e) { matched.textContent = 'bad regex'; return; }
    var spans = [];
    frames.forEach(function (g) {
      var r = g.querySelector('rect');
      if (!r.hasAttribute('data-fill')) r.setAttribute('data-fill', r.getAttribute('fill'));
      var hit = term !== '' && num(g, 'l') > 0 && re.test(name(g));
      r.setAttribute('fill', hit ? 'rgb(230,0,230)' : r.getAttribute('data-fill'));
      if (hit) spans.push([num(g, 'x'), num(g, 'x') + num(g, 'w')]);
    });
    // Nested matches overlap: count each fraction of the total once.
    spans.sort(function (a, b) { return a[0] - b[0]; });
    var covered = 0, end = -1;
    spans.forEach(function (s) {
      if (s[0] >= end) { covered += s[1] - s[0]; end = s[1]; }
      else if (s[1] > end) { covered += s[1] - end; end = s[1]; }
    });
    matched.textContent = term === '' ? ' ' : 'Matched: ' + (covered * 100).toFixed(1) + '%';
    svg.setAttribute('data-flame-matches', String(spans.length));
  }
  frames.forEach(function (g) {
    g.addEventListener('click', function () { zoom(g); });
    g.addEventListener('mouseover', function () {
      details.textContent = g.querySelector('title').textContent.replace(/\n/g, ' | ');
    });
    g.addEventListener('mouseout', function () { details.textContent = ' '; });
  });
  reset.addEventListener('click', unzoom);
  document.getElementById('search').addEventListener('click', function () {
    var term = window.prompt('Search frames (regular expression):', '');
    if (term !== null) search(term);
  });
  var q = /[?&]s=([^&#]*)/.exec(window.location.search || '');
  if (q) search(decodeURIComponent(q[1].replace(/\+/g, ' ')));
  svg.setAttribute('data-flame-ready', '1');
})();
"#;

#[cfg(test)]
mod tests;
