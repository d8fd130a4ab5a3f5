//! The chart's vertical scales. The stacked areas and the meminfo lines
//! each have a panel and a range of their own: the areas' from zero to the
//! highest stack, the lines' holding every change and zero, so a
//! system-wide line (VmallocUsed falling 33M) neither sets the areas'
//! scale nor runs off the plot.

/// A range of values drawn over a band of pixels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scale {
    pub lo: i64,
    pub hi: i64,
    /// The band's top and bottom pixel (`hi` is drawn at `top`).
    pub top: f64,
    pub bottom: f64,
}

impl Scale {
    /// The stacked areas': 0 to the highest stack of any reading (at
    /// least 1, so an empty run still has a scale).
    pub fn stacked(values: &[Vec<u64>], top: f64, bottom: f64) -> Scale {
        let highest = values.iter().map(|v| v.iter().sum::<u64>()).max();
        Scale {
            lo: 0,
            hi: i64::try_from(highest.unwrap_or(0))
                .unwrap_or(i64::MAX)
                .max(1),
            top,
            bottom,
        }
    }

    /// The lines': every value, and zero (where they all start).
    pub fn holding(values: impl IntoIterator<Item = i64>, top: f64, bottom: f64) -> Scale {
        let (lo, hi) = values
            .into_iter()
            .fold((0, 0), |(lo, hi), v| (v.min(lo), v.max(hi)));
        Scale {
            lo,
            hi: hi.max(lo + 1),
            top,
            bottom,
        }
    }

    pub fn y(&self, v: i64) -> f64 {
        self.top + (self.hi - v) as f64 / (self.hi - self.lo) as f64 * (self.bottom - self.top)
    }

    /// Round values to label the axis with (see `ticks`).
    pub fn ticks(&self) -> Vec<i64> {
        ticks(self.lo, self.hi)
    }
}

/// Round values for the byte axis from `bottom` to `top`: multiples of 1,
/// 2 or 5 times a power of 1024 (so the labels read 2.0M, 4.0M, …), at
/// most eight steps of them, zero among them whenever the range holds it.
pub fn ticks(bottom: i64, top: i64) -> Vec<i64> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn the_areas_range_is_the_highest_stack_whatever_the_lines_do() {
        let m = 1u64 << 20;
        // Two readings of three series: stacks of 6M and 9M.
        let s = Scale::stacked(&[vec![m, 2 * m, 3 * m], vec![4 * m, 0, 5 * m]], 20.0, 320.0);
        assert_eq!((s.lo, s.hi), (0, 9 * m as i64));
        assert_eq!(s.y(s.hi), 20.0);
        assert_eq!(s.y(0), 320.0);
        assert_eq!(s.y(9 * m as i64 / 2), 170.0);
        assert_eq!(Scale::stacked(&[], 0.0, 10.0).hi, 1);
    }

    #[test]
    fn the_lines_range_holds_a_fall_a_rise_and_zero() {
        let m = 1i64 << 20;
        let s = Scale::holding([0, -33 * m, 5 * m, 2 * m], 370.0, 480.0);
        assert_eq!((s.lo, s.hi), (-33 * m, 5 * m));
        for v in [-33 * m, 0, 5 * m] {
            let y = s.y(v);
            assert!((370.0..=480.0).contains(&y), "{v}: {y}");
        }
        assert_eq!(s.y(-33 * m), 480.0);
        let only_rise = Scale::holding([m, 3 * m], 0.0, 100.0);
        assert_eq!((only_rise.lo, only_rise.hi), (0, 3 * m));
        let flat = Scale::holding([0, 0], 0.0, 100.0);
        assert_eq!((flat.lo, flat.hi), (0, 1));
    }
}
