//! The live status line shown on a terminal while a run traces: how long,
//! how many events, how fast, how many were lost, and how full the fullest
//! aggregation map is. Pure: the kernel layer fills `Counters` from the
//! per-CPU counters (never by walking the big maps), `session::status`
//! draws and erases the line.

use std::time::Duration;

use crate::model::human_count;

/// How full one BPF map is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapFill {
    pub name: &'static str,
    pub entries: u64,
    pub capacity: u64,
}

impl MapFill {
    /// Percent of the capacity in use (0 for a map of no capacity).
    pub fn percent(&self) -> f64 {
        if self.capacity == 0 {
            return 0.0;
        }
        self.entries as f64 * 100.0 / self.capacity as f64
    }
}

/// What the tracer counted so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Allocation events counted.
    pub events: u64,
    /// Stacks that could not be recorded.
    pub lost_stacks: u64,
    /// Events not aggregated because a map was full.
    pub not_aggregated: u64,
    /// Events the kernel skipped: one of kheap's programs was already
    /// running on their CPU (the programs' recursion misses).
    pub skipped: u64,
    /// The aggregation maps in use.
    pub maps: Vec<MapFill>,
}

impl Counters {
    /// Everything the report will show as lost.
    pub fn lost(&self) -> u64 {
        self.lost_stacks + self.not_aggregated + self.skipped
    }

    /// The map closest to full (the first of equals).
    pub fn fullest(&self) -> Option<&MapFill> {
        self.maps
            .iter()
            .reduce(|a, b| if b.percent() > a.percent() { b } else { a })
    }
}

/// Events per second over the last refresh, from successive readings.
#[derive(Debug, Default)]
pub struct Rate {
    last: Option<(Duration, u64)>,
}

impl Rate {
    /// Takes a reading; returns the rate since the previous one (none for
    /// the first reading, or when no time passed).
    pub fn update(&mut self, elapsed: Duration, events: u64) -> Option<f64> {
        let rate = self.last.and_then(|(t, n)| {
            let dt = elapsed.checked_sub(t)?.as_secs_f64();
            (dt > 0.0).then(|| events.saturating_sub(n) as f64 / dt)
        });
        self.last = Some((elapsed, events));
        rate
    }
}

/// The status line (no line ending): `kheap: 12s, 1.2M events (98.1k/s),
/// lost 0, map fill 3% (sites)`.
pub fn line(elapsed: Duration, c: &Counters, per_sec: Option<f64>) -> String {
    let rate = match per_sec {
        Some(r) => format!(" ({}/s)", human_count(r.round() as u64)),
        None => String::new(),
    };
    let fill = match c.fullest() {
        Some(m) => format!(", map fill {} ({})", percent(m.percent()), m.name),
        None => String::new(),
    };
    format!(
        "kheap: {}s, {} events{rate}, lost {}{fill}",
        elapsed.as_secs(),
        human_count(c.events),
        human_count(c.lost()),
    )
}

/// Whole percents, except that a map with anything in it never shows 0%
/// and one not quite full never shows 100%.
fn percent(p: f64) -> String {
    if p > 0.0 && p < 1.0 {
        "<1%".into()
    } else if p > 99.0 && p < 100.0 {
        ">99%".into()
    } else {
        format!("{p:.0}%")
    }
}

/// `s` cut to at most `width` characters, so the line never wraps (a
/// wrapped line could not be erased with one carriage return).
pub fn fit(s: &str, width: usize) -> &str {
    match s.char_indices().nth(width) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters() -> Counters {
        Counters {
            events: 12_345,
            lost_stacks: 2,
            not_aggregated: 3,
            skipped: 4,
            maps: vec![
                MapFill {
                    name: "sites",
                    entries: 82,
                    capacity: 8192,
                },
                MapFill {
                    name: "stacks",
                    entries: 2048,
                    capacity: 8192,
                },
            ],
        }
    }

    #[test]
    fn the_line_shows_every_field() {
        let l = line(Duration::from_millis(3_900), &counters(), Some(4_115.4));
        assert_eq!(
            l,
            "kheap: 3s, 12.3k events (4.1k/s), lost 9, map fill 25% (stacks)"
        );
    }

    #[test]
    fn no_rate_or_maps_leaves_them_out() {
        let c = Counters {
            events: 7,
            ..Counters::default()
        };
        assert_eq!(
            line(Duration::ZERO, &c, None),
            "kheap: 0s, 7 events, lost 0"
        );
    }

    #[test]
    fn lost_sums_stacks_full_maps_and_skipped_runs() {
        assert_eq!(counters().lost(), 9);
    }

    #[test]
    fn the_fullest_map_wins_and_small_fills_are_not_zero() {
        let mut c = counters();
        assert_eq!(c.fullest().unwrap().name, "stacks");
        c.maps.truncate(1);
        c.maps[0].entries = 8;
        let l = line(Duration::ZERO, &c, None);
        assert!(l.ends_with("map fill <1% (sites)"), "{l}");
        c.maps[0].entries = 8191;
        assert!(line(Duration::ZERO, &c, None).ends_with("map fill >99% (sites)"));
        c.maps[0].entries = 8192;
        assert!(line(Duration::ZERO, &c, None).ends_with("map fill 100% (sites)"));
        c.maps[0].capacity = 0;
        assert_eq!(c.maps[0].percent(), 0.0);
    }

    #[test]
    fn the_rate_is_per_second_between_readings() {
        let mut r = Rate::default();
        assert_eq!(r.update(Duration::from_secs(1), 100), None);
        assert_eq!(r.update(Duration::from_millis(1_500), 600), Some(1000.0));
        // No time passed: no rate rather than a division by zero.
        assert_eq!(r.update(Duration::from_millis(1_500), 700), None);
    }

    #[test]
    fn fit_cuts_at_characters() {
        assert_eq!(fit("abcdef", 4), "abcd");
        assert_eq!(fit("abc", 10), "abc");
        assert_eq!(fit("añb", 2), "añ");
        assert_eq!(fit("abc", 0), "");
    }
}
