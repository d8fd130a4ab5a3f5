//! Wall-clock dates in UTC without a date-time dependency: RFC 3339
//! timestamps (top's interval headings), compact ones for file names,
//! and days (the man pages' date).

use std::time::{SystemTime, UNIX_EPOCH};

/// `2026-11-29T17:30:01.250Z`: to the millisecond, so that an interval can
/// be lined up with other timestamped data (and one-second intervals told
/// apart from their neighbours).
pub fn rfc3339_utc(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// `20261129T173001Z`: a time in a file name (no colons, sorts by time).
pub fn compact_utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let rem = secs % 86_400;
    format!(
        "{}T{:02}{:02}{:02}Z",
        date_utc(secs).replace('-', ""),
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `2026-11-29`: the day of `secs` since the epoch.
pub fn date_utc(secs: u64) -> String {
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// algorithm: eras of 400 years, years starting in March).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps() {
        let at = |s| rfc3339_utc(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00.000Z");
        assert_eq!(at(1_796_059_801), "2026-11-30T17:30:01.000Z");
        assert_eq!(at(4_102_444_799), "2099-12-31T23:59:59.000Z");
        let late = UNIX_EPOCH + Duration::from_millis(1_796_059_801_999);
        assert_eq!(rfc3339_utc(late), "2026-11-30T17:30:01.999Z");
        assert_eq!(compact_utc(late), "20261130T173001Z");
        assert_eq!(date_utc(951_782_400 + 86_399), "2000-02-29");
    }
}
