//! The chart's colours: one of its own for every series, however many,
//! spread around the colour wheel (not cycled from a short list, which
//! gave the 11th series the 1st one's colour); "other" and the meminfo
//! lines grey, apart from every area's.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rgb(pub u8, pub u8, pub u8);

impl fmt::Display for Rgb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{:02x}{:02x}{:02x}", self.0, self.1, self.2)
    }
}

/// The "other" area.
pub const OTHER: Rgb = Rgb(0xb4, 0xb4, 0xb4);

/// The meminfo lines (Slab, SUnreclaim, VmallocUsed, Percpu): greys, in
/// a panel of their own and told apart by their dashes too (`DASHES`);
/// no area's colour is a grey.
pub const LINES: [Rgb; 4] = [
    Rgb(0x00, 0x00, 0x00),
    Rgb(0x2a, 0x2a, 0x2a),
    Rgb(0x54, 0x54, 0x54),
    Rgb(0x7e, 0x7e, 0x7e),
];
pub const DASHES: [&str; 4] = ["none", "6,3", "2,2", "9,3,2,3"];

/// The areas' bands (lightness, saturation): neighbours in the stack
/// alternate between them, so two adjacent areas differ in lightness as
/// well as hue. Chosen, with `OFFSETS`, for the largest smallest distance
/// between any two colours of a legend of up to thirty series.
const BANDS: [(f64, f64); 3] = [(0.49, 0.81), (0.66, 0.88), (0.31, 0.93)];
/// Each band's hues are offset from the first band's by this part of the
/// step between hues (by the number of bands in use).
const OFFSETS: [[f64; 3]; 3] = [[0.0; 3], [0.0, 0.85, 0.0], [0.0, 0.26, 0.29]];
/// Hues per band before a further band is used (36° apart at most 10).
const HUES_PER_BAND: usize = 10;

/// `n` colours, all different: evenly spaced hues in one band for up to
/// ten, in two or three alternating bands beyond (each band's hues offset
/// from the others'), hues closer together past thirty.
pub fn series(n: usize) -> Vec<Rgb> {
    let bands = n.div_ceil(HUES_PER_BAND).clamp(1, BANDS.len());
    let step = 360.0 / n.div_ceil(bands).max(1) as f64;
    (0..n)
        .map(|i| {
            let band = i % bands;
            let hue = ((i / bands) as f64 + OFFSETS[bands - 1][band]) * step;
            let (lightness, saturation) = BANDS[band];
            hsl(hue, saturation, lightness)
        })
        .collect()
}

/// Hue in degrees, saturation and lightness in 0..=1.
fn hsl(hue: f64, s: f64, l: f64) -> Rgb {
    let c = (1.0 - (2.0 * l - 1.0).abs()) * s;
    let h = hue.rem_euclid(360.0) / 60.0;
    let x = c * (1.0 - (h % 2.0 - 1.0).abs());
    let (r, g, b) = match h as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = l - c / 2.0;
    let byte = |v: f64| ((v + m) * 255.0).round().clamp(0.0, 255.0) as u8;
    Rgb(byte(r), byte(g), byte(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn distance(a: Rgb, b: Rgb) -> f64 {
        let d = |x: u8, y: u8| (f64::from(x) - f64::from(y)).powi(2);
        (d(a.0, b.0) + d(a.1, b.1) + d(a.2, b.2)).sqrt()
    }

    fn closest(colours: &[Rgb]) -> f64 {
        let mut min = f64::MAX;
        for (i, a) in colours.iter().enumerate() {
            for b in &colours[i + 1..] {
                min = min.min(distance(*a, *b));
            }
        }
        min
    }

    /// What a legend shows: the areas, other, the meminfo lines.
    fn legend(n: usize) -> Vec<Rgb> {
        let mut all = series(n);
        all.push(OTHER);
        all.extend(LINES);
        all
    }

    #[test]
    fn up_to_thirty_series_every_legend_colour_is_far_from_every_other() {
        for n in 0..=30 {
            let c = legend(n);
            assert_eq!(c.len(), n + 5);
            // 60 of a possible 441: no two are shades a reader confuses.
            assert!(closest(&c) >= 60.0, "{n}: {:.1} {c:?}", closest(&c));
        }
        // 22 series, the report's case that cycled ten colours.
        let c = series(22);
        assert!(closest(&c) >= 60.0, "{c:?}");
    }

    #[test]
    fn many_series_still_get_colours_of_their_own() {
        for n in [31, 50, 100, 300] {
            let c = legend(n);
            let strings: std::collections::BTreeSet<String> =
                c.iter().map(Rgb::to_string).collect();
            assert_eq!(strings.len(), n + 5, "{n}");
            assert!(closest(&c) >= 3.0, "{n}: {:.1}", closest(&c));
        }
    }

    #[test]
    fn neighbours_in_the_stack_differ_in_lightness_past_ten() {
        let c = series(20);
        let light = |c: Rgb| u32::from(c.0.max(c.1).max(c.2)) + u32::from(c.0.min(c.1).min(c.2));
        for w in c.windows(2) {
            assert!(light(w[0]).abs_diff(light(w[1])) > 60, "{w:?}");
        }
    }

    #[test]
    fn hsl_is_the_usual_conversion() {
        assert_eq!(hsl(0.0, 1.0, 0.5), Rgb(255, 0, 0));
        assert_eq!(hsl(120.0, 1.0, 0.5), Rgb(0, 255, 0));
        assert_eq!(hsl(240.0, 1.0, 0.5), Rgb(0, 0, 255));
        assert_eq!(hsl(360.0, 1.0, 0.5), Rgb(255, 0, 0));
        assert_eq!(hsl(200.0, 0.0, 0.5), Rgb(128, 128, 128));
        assert_eq!(Rgb(0xb4, 0x0a, 0xff).to_string(), "#b40aff");
    }
}
