//! Numbers for people: two decimals for JSON, binary and SI units for
//! table cells, signed changes.

/// Two decimals, for ratios and rates in JSON.
pub fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// `n` divided by `base` until it is under `base` (or the units run out),
/// with the unit it ends in.
fn in_units(n: u64, base: f64, units: &[&'static str]) -> (f64, &'static str) {
    let mut v = n as f64;
    let mut u = 0;
    while v >= base && u < units.len() - 1 {
        v /= base;
        u += 1;
    }
    (v, units[u])
}

/// Bytes in binary units, for table cells: 512, 1.5K, 2.0M, 3.1G.
pub fn human_size(bytes: u64) -> String {
    match in_units(bytes, 1024.0, &["", "K", "M", "G", "T"]) {
        (_, "") => format!("{bytes}"),
        (v, unit) if v >= 100.0 => format!("{v:.0}{unit}"),
        (v, unit) => format!("{v:.1}{unit}"),
    }
}

/// A change in bytes, signed, in binary units: "+1.5M", "-300K", "0".
pub fn signed_size(v: i64) -> String {
    signed(v, human_size)
}

/// [`human_size`] of a sum or difference of u64s (diff): past 2^64-1 in
/// the largest unit too (the JSON has the exact number).
pub fn human_size_wide(bytes: u128) -> String {
    u64::try_from(bytes).map_or_else(
        |_| format!("{:.0}T", bytes as f64 / (1u64 << 40) as f64),
        human_size,
    )
}

/// [`signed_size`] of a difference of u64s (diff), never wrapped.
pub fn signed_size_wide(v: i128) -> String {
    match v {
        0 => "0".into(),
        v if v > 0 => format!("+{}", human_size_wide(v as u128)),
        v => format!("-{}", human_size_wide(v.unsigned_abs())),
    }
}

/// A change in a count, signed, with SI suffixes: "+1.2k", "-3", "0".
pub fn signed_count(v: i64) -> String {
    signed(v, human_count)
}

fn signed(v: i64, magnitude: fn(u64) -> String) -> String {
    match v {
        0 => "0".into(),
        v if v > 0 => format!("+{}", magnitude(v as u64)),
        v => format!("-{}", magnitude(v.unsigned_abs())),
    }
}

/// Counts with SI suffixes, for table cells: 999, 1.2k, 3.4M.
pub fn human_count(n: u64) -> String {
    match in_units(n, 1000.0, &["", "k", "M", "G"]) {
        (_, "") => format!("{n}"),
        (v, unit) => format!("{v:.1}{unit}"),
    }
}
