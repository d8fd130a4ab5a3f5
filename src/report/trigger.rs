//! `kheap leaks --snapshot-when COND`: conditions checked at every timeline
//! reading; one that holds writes a snapshot, and its baseline moves to
//! the reading that fired it (so `sunreclaim+=10M` fires once per 10 MiB
//! of growth, not at every reading after the first).
//!
//! - `sunreclaim+=N`: /proc/meminfo's SUnreclaim grew by N bytes since the
//!   start (or the last time this trigger fired);
//! - `site:PATTERN+=N`: the outstanding bytes of the sites whose function
//!   matches PATTERN (`*` for any run of characters) grew by N;
//! - `oom`: the kernel killed a process for lack of memory (the
//!   `oom_kill` count of /proc/vmstat went up; read at each reading).
//!
//! N takes K, M, G (powers of 1024). Pure: the command hands readings in.

use crate::report::budget::{glob_match, parse_bytes};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    SUnreclaimGrew(u64),
    SiteGrew { pattern: String, bytes: u64 },
    Oom,
}

/// One `--snapshot-when`, with the level it last fired at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trigger {
    /// As given, for messages and the report.
    pub text: String,
    pub condition: Condition,
    baseline: Option<u64>,
}

/// What a reading gives the triggers.
pub struct Reading<'a> {
    pub sunreclaim_bytes: u64,
    /// /proc/vmstat's oom_kill.
    pub oom_kills: u64,
    /// Outstanding bytes of every site, by function name.
    pub sites: &'a [(String, u64)],
}

pub fn parse(s: &str) -> Result<Trigger, String> {
    let text = s.trim();
    let usage = || {
        format!("--snapshot-when '{s}': expected sunreclaim+=N, site:PATTERN+=N or oom (N in bytes, K/M/G allowed)")
    };
    let condition = if text == "oom" {
        Condition::Oom
    } else if let Some(n) = text.strip_prefix("sunreclaim+=") {
        Condition::SUnreclaimGrew(parse_bytes(n).map_err(|_| usage())?)
    } else if let Some(rest) = text.strip_prefix("site:") {
        let (pattern, n) = rest.rsplit_once("+=").ok_or_else(usage)?;
        if pattern.is_empty() {
            return Err(usage());
        }
        Condition::SiteGrew {
            pattern: pattern.to_string(),
            bytes: parse_bytes(n).map_err(|_| usage())?,
        }
    } else {
        return Err(usage());
    };
    if matches!(
        condition,
        Condition::SUnreclaimGrew(0) | Condition::SiteGrew { bytes: 0, .. }
    ) {
        return Err(format!("--snapshot-when '{s}': N must be above 0"));
    }
    Ok(Trigger {
        text: text.to_string(),
        condition,
        baseline: None,
    })
}

impl Trigger {
    /// The level this trigger watches in `r`.
    fn level(&self, r: &Reading) -> u64 {
        match &self.condition {
            Condition::SUnreclaimGrew(_) => r.sunreclaim_bytes,
            Condition::SiteGrew { pattern, .. } => r
                .sites
                .iter()
                .filter(|(name, _)| glob_match(pattern, name))
                .map(|(_, b)| b)
                .sum(),
            Condition::Oom => r.oom_kills,
        }
    }

    /// Counts growth from `r`, the levels when tracing starts (no traced
    /// site has anything yet). Without it the first reading sets the
    /// baseline, and a slow start (symbols loading, a busy machine) could
    /// take an early OOM kill or growth into it and never fire.
    pub fn start_from(&mut self, r: &Reading) {
        self.baseline = Some(self.level(r));
    }

    /// Whether the condition holds at this reading (the first reading only
    /// sets the baseline, unless `start_from` did); when it does, the
    /// baseline moves here.
    pub fn check(&mut self, r: &Reading) -> bool {
        let level = self.level(r);
        let Some(base) = self.baseline else {
            self.baseline = Some(level);
            return false;
        };
        let fired = match &self.condition {
            Condition::SUnreclaimGrew(n) | Condition::SiteGrew { bytes: n, .. } => {
                level >= base.saturating_add(*n)
            }
            Condition::Oom => level > base,
        };
        // A level that went down lowers the baseline too: growth is
        // counted from the lowest point since the last firing.
        if fired || level < base {
            self.baseline = Some(level);
        }
        fired
    }

    /// A file name part: `sunreclaim`, `site-load_msg`, `oom`.
    pub fn slug(&self) -> String {
        let raw = match &self.condition {
            Condition::SUnreclaimGrew(_) => "sunreclaim".to_string(),
            Condition::SiteGrew { pattern, .. } => format!("site-{pattern}"),
            Condition::Oom => "oom".to_string(),
        };
        raw.chars()
            .map(|c| match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '-' | '.' => c,
                _ => '_',
            })
            .take(64)
            .collect()
    }
}

/// /proc/vmstat's oom_kill (0 if it cannot be read).
pub fn oom_kills(vmstat: &str) -> u64 {
    vmstat
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(sunreclaim: u64, oom: u64, site: u64) -> (u64, u64, Vec<(String, u64)>) {
        (
            sunreclaim,
            oom,
            vec![("load_msg".into(), site), ("newque".into(), 7)],
        )
    }

    fn check(t: &mut Trigger, r: &(u64, u64, Vec<(String, u64)>)) -> bool {
        t.check(&Reading {
            sunreclaim_bytes: r.0,
            oom_kills: r.1,
            sites: &r.2,
        })
    }

    #[test]
    fn conditions_parse_and_bad_ones_say_what_is_expected() {
        assert_eq!(
            parse("sunreclaim+=10M").unwrap().condition,
            Condition::SUnreclaimGrew(10 << 20)
        );
        assert_eq!(
            parse("site:load_*+=4K").unwrap().condition,
            Condition::SiteGrew {
                pattern: "load_*".into(),
                bytes: 4096
            }
        );
        assert_eq!(parse("oom").unwrap().condition, Condition::Oom);
        for bad in [
            "",
            "sunreclaim",
            "site:+=1",
            "site:x+=",
            "oom2",
            "sunreclaim+=0",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.starts_with("--snapshot-when"), "{e}");
        }
    }

    #[test]
    fn a_site_trigger_fires_once_per_growth_from_its_last_firing() {
        let mut t = parse("site:load_m*+=100").unwrap();
        let fired: Vec<bool> = [0, 50, 120, 150, 219, 220, 0, 99, 100]
            .iter()
            .map(|&b| check(&mut t, &reading(0, 0, b)))
            .collect();
        assert_eq!(
            fired,
            [false, false, true, false, false, true, false, false, true]
        );
        assert_eq!(t.slug(), "site-load_m_");
    }

    #[test]
    fn growth_counts_from_the_start_when_given() {
        let mut o = parse("oom").unwrap();
        o.start_from(&Reading {
            sunreclaim_bytes: 0,
            oom_kills: 3,
            sites: &[],
        });
        // The kill came before the first reading: it still fires.
        assert!(check(&mut o, &reading(0, 4, 0)));
        let mut s = parse("site:load_msg+=100").unwrap();
        s.start_from(&Reading {
            sunreclaim_bytes: 0,
            oom_kills: 0,
            sites: &[],
        });
        assert!(check(&mut s, &reading(0, 0, 100)));
    }

    #[test]
    fn sunreclaim_and_oom_triggers() {
        let mut s = parse("sunreclaim+=1K").unwrap();
        assert!(!check(&mut s, &reading(10_000, 0, 0)));
        assert!(!check(&mut s, &reading(11_000, 0, 0)));
        assert!(check(&mut s, &reading(11_024, 0, 0)));
        let mut o = parse("oom").unwrap();
        assert!(!check(&mut o, &reading(0, 3, 0)));
        assert!(!check(&mut o, &reading(0, 3, 0)));
        assert!(check(&mut o, &reading(0, 4, 0)));
        assert!(!check(&mut o, &reading(0, 4, 0)));
        assert_eq!(oom_kills("pgfault 3\noom_kill 12\n"), 12);
    }
}
