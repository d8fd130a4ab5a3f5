//! Fitting a view's columns into the terminal's width: the key column (the
//! site in the site view, the cache in the cache view, …) is always shown;
//! the others shrink, then hide, lowest priority first; a name too long for
//! its column is elided in the middle (`kmalloc…192`), so both its kind and
//! its size stay readable. Pure: the full-screen view draws what this says.

/// Gap between two columns (ratatui's default column spacing).
pub const SPACING: usize = 1;

/// The key column never gets narrower than this while other columns can
/// still hide (a site like `getname_flags.part.0+0x24` stays whole).
const KEY_MIN: usize = 24;
/// A naming column other than the key: most cache names whole
/// (`vm_area_struct`, `kmalloc-cg-192`), a rarer rate column hidden for it.
const NAME_MIN: usize = 16;
/// Naming columns wider than this are not worth the numbers they push out.
const NAME_MAX: usize = 40;

/// One column to lay out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    /// Widest of its header and cells, in characters.
    pub natural: usize,
    /// A naming column (can shrink, cells elided) rather than a number.
    pub name: bool,
    /// Lower hides first; the key column is never hidden.
    pub priority: u8,
}

/// Where each column goes: `Some(width)`, or `None` when hidden.
pub type Widths = Vec<Option<usize>>;

/// Fits `cols` (the key column first) into `width` characters.
pub fn fit(cols: &[Column], width: usize) -> Widths {
    let min_of = |i: usize, c: &Column| -> usize {
        match (i, c.name) {
            (0, _) => c.natural.min(KEY_MIN),
            (_, true) => c.natural.min(NAME_MIN),
            (_, false) => c.natural,
        }
    };
    let mut shown: Vec<bool> = vec![true; cols.len()];
    let needed = |shown: &[bool]| -> usize {
        let (sum, n) = cols
            .iter()
            .enumerate()
            .filter(|(i, _)| shown[*i])
            .fold((0usize, 0usize), |(s, n), (i, c)| (s + min_of(i, c), n + 1));
        sum + SPACING * n.saturating_sub(1)
    };
    // Hide the lowest priority (the rightmost among equals) until the
    // minimum widths fit; the key column stays even when nothing else does.
    while needed(&shown) > width {
        let victim = (1..cols.len())
            .filter(|&i| shown[i])
            .min_by_key(|&i| (cols[i].priority, std::cmp::Reverse(i)));
        match victim {
            Some(i) => shown[i] = false,
            None => break,
        }
    }
    let mut widths: Vec<usize> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| if shown[i] { min_of(i, c) } else { 0 })
        .collect();
    let mut spare = width.saturating_sub(needed(&shown));
    // Spare room goes to the key column up to its natural width, then to
    // the other naming columns, then to the key column again.
    let mut grow = |i: usize, up_to: usize, spare: &mut usize| {
        let add = up_to.saturating_sub(widths[i]).min(*spare);
        widths[i] += add;
        *spare -= add;
    };
    if !cols.is_empty() {
        grow(0, cols[0].natural, &mut spare);
        for (i, c) in cols.iter().enumerate().skip(1) {
            if shown[i] && c.name {
                grow(i, c.natural.min(NAME_MAX), &mut spare);
            }
        }
        grow(0, usize::MAX, &mut spare);
        // A terminal narrower than the key column's minimum: it takes all.
        widths[0] = widths[0].min(width);
    }
    widths
        .into_iter()
        .zip(shown)
        .map(|(w, s)| s.then_some(w))
        .collect()
}

/// `s` in at most `width` characters: whole if it fits, else its start and
/// its end around a `…` (the end of a cache or site name says the most:
/// its size, its offset).
pub fn elide_middle(s: &str, width: usize) -> String {
    let len = s.chars().count();
    if len <= width {
        return s.to_string();
    }
    match width {
        0 => String::new(),
        1 => "…".to_string(),
        _ => {
            let tail = (width - 1) / 2;
            let head = width - 1 - tail;
            let start: String = s.chars().take(head).collect();
            let end: String = s.chars().skip(len - tail).collect();
            format!("{start}…{end}")
        }
    }
}

/// The key line: the longest of `variants` (most complete first) that fits
/// in `width`, else the last one elided.
pub fn fitting_line<'a>(variants: &[&'a str], width: usize) -> std::borrow::Cow<'a, str> {
    for v in variants {
        if v.chars().count() <= width {
            return (*v).into();
        }
    }
    elide_middle(variants.last().copied().unwrap_or(""), width).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(natural: usize, priority: u8) -> Column {
        Column {
            natural,
            name: true,
            priority,
        }
    }
    fn num(natural: usize, priority: u8) -> Column {
        Column {
            natural,
            name: false,
            priority,
        }
    }

    /// A site view: site, cache, then the seven rates.
    fn site_view() -> Vec<Column> {
        vec![
            name(30, 255),
            name(14, 9),
            num(8, 7),
            num(6, 4),
            num(7, 8),
            num(7, 3),
            num(6, 5),
            num(4, 2),
            num(5, 1),
        ]
    }

    fn total(w: &Widths) -> usize {
        let shown: Vec<usize> = w.iter().flatten().copied().collect();
        shown.iter().sum::<usize>() + SPACING * shown.len().saturating_sub(1)
    }

    #[test]
    fn everything_shows_when_there_is_room() {
        let w = fit(&site_view(), 200);
        assert!(w.iter().all(Option::is_some), "{w:?}");
        assert_eq!(w[1], Some(14));
        assert_eq!(total(&w), 200, "the key column takes the rest");
    }

    #[test]
    fn eighty_columns_keep_the_key_and_hide_by_priority() {
        let w = fit(&site_view(), 80);
        assert!(total(&w) <= 80, "{w:?}");
        assert!(w[0].unwrap() >= KEY_MIN, "{w:?}");
        // The cache names stay whole: net/s (priority 1) and avg (2) go.
        assert_eq!(w[1], Some(14), "{w:?}");
        assert_eq!((w[7], w[8]), (None, None), "{w:?}");
        assert!(w[..7].iter().all(Option::is_some), "{w:?}");
        // Narrower: waste/s (3) and req/s (4) go too.
        let w = fit(&site_view(), 64);
        assert!(total(&w) <= 64, "{w:?}");
        let hidden: Vec<usize> = (0..w.len()).filter(|&i| w[i].is_none()).collect();
        assert_eq!(hidden, [3, 5, 7, 8], "{w:?}");
        assert!(w[0] >= Some(KEY_MIN), "{w:?}");
    }

    #[test]
    fn a_tiny_terminal_still_shows_the_key() {
        let w = fit(&site_view(), 10);
        assert_eq!(w[0], Some(10));
        assert!(w[1..].iter().all(Option::is_none), "{w:?}");
        assert_eq!(fit(&site_view(), 0)[0], Some(0));
    }

    #[test]
    fn names_are_elided_in_the_middle() {
        assert_eq!(elide_middle("kmalloc-192", 11), "kmalloc-192");
        assert_eq!(elide_middle("kmalloc-cg-192", 11), "kmall…g-192");
        assert_eq!(elide_middle("kmalloc-rnd-01-192", 11), "kmall…1-192");
        assert_eq!(elide_middle("kmalloc-1k", 9), "kmal…c-1k");
        assert_eq!(elide_middle("abc", 1), "…");
        assert_eq!(elide_middle("abc", 0), "");
        assert_eq!(elide_middle("ünïcödé", 5), "ün…dé");
    }

    #[test]
    fn the_key_line_picks_the_longest_that_fits() {
        let v = ["a long line of keys", "short keys", "k"];
        assert_eq!(fitting_line(&v, 80), "a long line of keys");
        assert_eq!(fitting_line(&v, 12), "short keys");
        assert_eq!(fitting_line(&v, 1), "k");
    }
}
