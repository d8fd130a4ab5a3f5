//! The one histogram drawer, in the style of bpftrace's `hist()`: a range,
//! a count, an optional note (e.g. bytes), and a bar scaled to the largest
//! count. Size, latency and age histograms all come through here.

use std::fmt::Write as _;

use crate::model::Bucket;

/// One line of a histogram.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistLine {
    /// `[lo, hi)`, already formatted.
    pub range: String,
    pub count: u64,
    /// Shown right of the count when any line has one (e.g. bytes held).
    pub note: Option<String>,
}

/// Bars are this long unless the width asks for less.
pub const BAR: usize = 52;
/// Bars never get shorter than this, however narrow the width.
const MIN_BAR: usize = 10;

/// The histogram as text, each line prefixed by `indent`, fitted to
/// `width` columns when given by shortening the bars.
pub fn draw(lines: &[HistLine], indent: &str, width: Option<u16>) -> String {
    let mut out = String::new();
    let Some(max) = lines.iter().map(|l| l.count).max() else {
        return out;
    };
    let range_w = lines
        .iter()
        .map(|l| l.range.chars().count())
        .max()
        .unwrap_or(0);
    let count_w = lines
        .iter()
        .map(|l| l.count.to_string().len())
        .max()
        .unwrap_or(0)
        .max(8);
    let note_w = lines
        .iter()
        .filter_map(|l| l.note.as_ref().map(|n| n.chars().count()))
        .max();
    // indent, range, space, count, [space, note], space, |bar|
    let fixed = indent.chars().count() + range_w + 1 + count_w + note_w.map_or(0, |w| w + 1) + 3;
    let bar_w = match width {
        Some(w) => (w as usize).saturating_sub(fixed).clamp(MIN_BAR, BAR),
        None => BAR,
    };
    for l in lines {
        let bar = (l.count * bar_w as u64).div_ceil(max.max(1)) as usize;
        let _ = write!(out, "{indent}{:<range_w$} {:>count_w$}", l.range, l.count);
        if let Some(w) = note_w {
            let _ = write!(out, " {:>w$}", l.note.as_deref().unwrap_or(""));
        }
        let _ = writeln!(out, " |{:<bar_w$}|", "@".repeat(bar));
    }
    out
}

/// A bucket bound in binary units: 512, 2K, 1M; `...` for the open end.
fn bound(v: u64) -> String {
    match v {
        u64::MAX => "...".into(),
        v if v >= 1 << 30 && v % (1 << 30) == 0 => format!("{}G", v >> 30),
        v if v >= 1 << 20 && v % (1 << 20) == 0 => format!("{}M", v >> 20),
        v if v >= 1 << 10 && v % (1 << 10) == 0 => format!("{}K", v >> 10),
        v => v.to_string(),
    }
}

/// The lines of a log2 histogram of sizes (or nanoseconds).
pub fn log2_lines(buckets: &[Bucket]) -> Vec<HistLine> {
    buckets
        .iter()
        .map(|b| HistLine {
            range: format!("[{}, {})", bound(b.lo), bound(b.hi)),
            count: b.count,
            note: None,
        })
        .collect()
}

/// A log2 histogram of sizes (or nanoseconds) as text.
pub fn log2(buckets: &[Bucket], indent: &str, width: Option<u16>) -> String {
    draw(&log2_lines(buckets), indent, width)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buckets() -> Vec<Bucket> {
        vec![
            Bucket {
                lo: 2048,
                hi: 4096,
                count: 100,
            },
            Bucket {
                lo: 4096,
                hi: 8192,
                count: 50,
            },
        ]
    }

    #[test]
    fn histogram_looks_like_bpftrace() {
        let h = log2(&buckets(), "", None);
        let lines: Vec<&str> = h.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("[2K, 4K)"), "{h}");
        assert!(lines[0].contains(&format!("|{}|", "@".repeat(BAR))), "{h}");
        assert!(
            lines[1].contains(&format!("|{}{}|", "@".repeat(BAR / 2), " ".repeat(BAR / 2))),
            "{h}"
        );
    }

    #[test]
    fn notes_get_their_own_column_and_bars_fit_the_width() {
        let lines = vec![
            HistLine {
                range: "[1.024s, 2.048s)".into(),
                count: 400,
                note: Some("1.6M".into()),
            },
            HistLine {
                range: "[1ms, 2ms)".into(),
                count: 20,
                note: Some("80K".into()),
            },
        ];
        let h = draw(&lines, "    ", Some(60));
        for l in h.lines() {
            assert_eq!(l.chars().count(), 60, "{h}");
        }
        assert!(h.contains("[1.024s, 2.048s)      400 1.6M |"), "{h}");
        assert!(h.contains("[1ms, 2ms)             20  80K |"), "{h}");
        // Too narrow: the bars keep a readable minimum.
        let h = draw(&lines, "", Some(20));
        assert!(h.contains(&format!("|{}|", "@".repeat(MIN_BAR))), "{h}");
    }

    #[test]
    fn nothing_to_draw_draws_nothing() {
        assert_eq!(draw(&[], "  ", None), "");
    }
}
