//! `kheap serve --snapshot-when COND`: the conditions a daemon watches at
//! each read, how often each fired and when it last did, and the metric
//! families that say so (`kheap_trigger_fired`,
//! `kheap_trigger_last_fired_timestamp_seconds`), so an alert or a
//! dashboard can point at the moment memory grew. Pure: the daemon hands
//! in the readings and the clock.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::report::trigger::{Reading, Trigger};
use crate::serve::exposition::{Family, Kind, Value};

/// One condition and its record.
#[derive(Clone, Debug, PartialEq)]
pub struct Watched {
    pub trigger: Trigger,
    pub fired: u64,
    pub last_fired: Option<SystemTime>,
}

/// The conditions of new settings: one given before (same text) keeps its
/// count, its last firing and the level it measures growth from; a new
/// one starts from its first reading.
pub fn reconcile(old: &[Watched], new: &[Trigger]) -> Vec<Watched> {
    new.iter()
        .map(|t| {
            old.iter()
                .find(|w| w.trigger.text == t.text)
                .cloned()
                .unwrap_or_else(|| Watched {
                    trigger: t.clone(),
                    fired: 0,
                    last_fired: None,
                })
        })
        .collect()
}

/// Checks every condition at reading `r` made at `now`; returns the
/// indexes of those that fired.
pub fn check(watched: &mut [Watched], r: &Reading, now: SystemTime) -> Vec<usize> {
    let mut fired = Vec::new();
    for (i, w) in watched.iter_mut().enumerate() {
        if w.trigger.check(r) {
            w.fired += 1;
            w.last_fired = Some(now);
            fired.push(i);
        }
    }
    fired
}

/// The families: a counter per condition from the start (0 until it
/// fires, so `increase()` sees the first firing), and the time of the last
/// firing only once there was one (a timestamp of 0 would read as 1970).
pub fn families(watched: &[Watched]) -> Vec<Family> {
    if watched.is_empty() {
        return Vec::new();
    }
    let mut count = Family::new(
        "kheap_trigger_fired",
        Kind::Counter,
        "Times a --snapshot-when condition held at a read",
        &["trigger"],
    );
    let mut last = Family::new(
        "kheap_trigger_last_fired_timestamp_seconds",
        Kind::Gauge,
        "When a --snapshot-when condition last held (Unix time)",
        &["trigger"],
    );
    for w in watched {
        count.push(vec![w.trigger.text.clone()], Value::Int(w.fired));
        if let Some(at) = w.last_fired {
            let secs = at.duration_since(UNIX_EPOCH).unwrap_or_default();
            last.push(
                vec![w.trigger.text.clone()],
                Value::Float(secs.as_millis() as f64 / 1000.0),
            );
        }
    }
    vec![count, last]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::trigger::parse;
    use crate::serve::exposition::{encode_groups, Format};
    use std::time::Duration;

    fn reading(sites: &[(String, u64)], sunreclaim: u64) -> Reading<'_> {
        Reading {
            sunreclaim_bytes: sunreclaim,
            oom_kills: 0,
            sites,
        }
    }

    #[test]
    fn firings_are_counted_and_timed_and_survive_a_reload() {
        let t = |s: &str| parse(s).unwrap();
        let mut w = reconcile(&[], &[t("site:load_*+=1K"), t("sunreclaim+=1M")]);
        let at = |s| UNIX_EPOCH + Duration::from_millis(s);
        let sites = |b| vec![("load_msg".to_string(), b), ("other_fn".to_string(), 5000)];
        assert!(check(&mut w, &reading(&sites(0), 10 << 20), at(1_000)).is_empty());
        assert!(check(&mut w, &reading(&sites(1000), 10 << 20), at(2_000)).is_empty());
        assert_eq!(
            check(&mut w, &reading(&sites(1024), 10 << 20), at(3_500)),
            [0]
        );
        assert_eq!(w[0].fired, 1);
        assert_eq!(w[0].last_fired, Some(at(3_500)));
        assert_eq!(w[1].fired, 0);

        let text = encode_groups(&[&families(&w)], Format::Prometheus);
        assert!(
            text.contains("kheap_trigger_fired_total{trigger=\"site:load_*+=1K\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("kheap_trigger_fired_total{trigger=\"sunreclaim+=1M\"} 0\n"));
        assert!(text.contains(
            "kheap_trigger_last_fired_timestamp_seconds{trigger=\"site:load_*+=1K\"} 3.5\n"
        ));
        assert!(!text.contains("last_fired_timestamp_seconds{trigger=\"sunreclaim"));

        // Reloaded with one condition kept and one new: the kept one keeps
        // its record and its baseline (1024: another 1K fires again).
        let mut w = reconcile(&w, &[t("oom"), t("site:load_*+=1K")]);
        assert_eq!((w[0].fired, w[1].fired), (0, 1));
        assert!(check(&mut w, &reading(&sites(2047), 0), at(4_000)).is_empty());
        assert_eq!(check(&mut w, &reading(&sites(2048), 0), at(5_000)), [1]);
        assert_eq!(w[1].fired, 2);
        assert!(families(&[]).is_empty());
    }
}
