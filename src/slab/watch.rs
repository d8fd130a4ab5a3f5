//! Differences between two static reads, for `--watch` (slabtop with
//! deltas) and for growth over a run. Caches can be created and destroyed
//! between reads (modules loading, a filesystem mounted): such caches are
//! kept and marked rather than silently dropped.

use serde::Serialize;

use super::hints::CacheSeries;
use super::snapshot::{StaticCache, StaticSnapshot};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Presence {
    /// In both reads.
    Both,
    /// Only in the later read.
    Appeared,
    /// Only in the earlier read.
    Vanished,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CacheDelta {
    pub name: String,
    /// The caches merged into this one (SLUB's aliases), as the latest
    /// read saw them: a merged cache's growth may be any of theirs.
    pub aliases: Vec<String>,
    pub presence: Presence,
    pub object_size: u64,
    /// 0 for a cache absent from that read.
    pub active_before: u64,
    pub active_after: u64,
    pub memory_before: u64,
    pub memory_after: u64,
}

impl CacheDelta {
    pub fn delta_objs(&self) -> i64 {
        self.active_after as i64 - self.active_before as i64
    }

    /// Change in slab memory (what the `Slab:` line of /proc/meminfo sees).
    pub fn delta_memory(&self) -> i64 {
        self.memory_after as i64 - self.memory_before as i64
    }
}

/// Per-cache changes from `before` to `after`, biggest memory change
/// first (by magnitude), then by name.
pub fn diff(before: &StaticSnapshot, after: &StaticSnapshot) -> Vec<CacheDelta> {
    let mut out: Vec<CacheDelta> = after
        .caches
        .iter()
        .map(|a| match before.get(&a.name) {
            Some(b) => delta(Presence::Both, Some(b), Some(a)),
            None => delta(Presence::Appeared, None, Some(a)),
        })
        .collect();
    out.extend(
        before
            .caches
            .iter()
            .filter(|b| after.get(&b.name).is_none())
            .map(|b| delta(Presence::Vanished, Some(b), None)),
    );
    out.sort_by(|x, y| {
        y.delta_memory()
            .unsigned_abs()
            .cmp(&x.delta_memory().unsigned_abs())
            .then_with(|| x.name.cmp(&y.name))
    });
    out
}

fn delta(
    presence: Presence,
    before: Option<&StaticCache>,
    after: Option<&StaticCache>,
) -> CacheDelta {
    let any = after.or(before).expect("a delta has at least one side");
    CacheDelta {
        name: any.name.clone(),
        aliases: any.aliases.clone(),
        presence,
        object_size: any.object_size,
        active_before: before.map_or(0, |c| c.active_objs),
        active_after: after.map_or(0, |c| c.active_objs),
        memory_before: before.map_or(0, |c| c.memory_bytes),
        memory_after: after.map_or(0, |c| c.memory_bytes),
    }
}

/// Active-object series per cache from timed snapshots, for growth hints.
/// A cache missing from a snapshot counts as 0 objects there (it did not
/// exist), which breaks "steady growth" only if it vanished.
pub fn series(samples: &[(f64, StaticSnapshot)]) -> Vec<CacheSeries> {
    let mut names: Vec<(&str, u64)> = samples
        .iter()
        .flat_map(|(_, s)| s.caches.iter().map(|c| (c.name.as_str(), c.object_size)))
        .collect();
    names.sort_unstable();
    names.dedup_by(|a, b| a.0 == b.0);
    names
        .into_iter()
        .map(|(name, object_size)| CacheSeries {
            cache: name.to_string(),
            object_size,
            points: samples
                .iter()
                .map(|(t, s)| (*t, s.get(name).map_or(0, |c| c.active_objs)))
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(name: &str, active: u64, slabs: u64) -> StaticCache {
        StaticCache {
            name: name.into(),
            sysfs_dir: None,
            aliases: vec![],
            object_size: 64,
            padded_size: 64,
            objs_per_slab: 64,
            pages_per_slab: 1,
            active_objs: active,
            num_objs: slabs * 64,
            num_slabs: slabs,
            memory_bytes: slabs * 4096,
            partial_bytes: None,
            loss_bytes: 0,
        }
    }

    fn snap(caches: Vec<StaticCache>) -> StaticSnapshot {
        StaticSnapshot {
            caches,
            sysfs: true,
            page_size: 4096,
            notes: vec![],
        }
    }

    #[test]
    fn deltas_keep_vanished_and_new_caches() {
        let before = snap(vec![
            cache("dentry", 100, 2),
            cache("gone", 64, 1),
            cache("same", 5, 1),
        ]);
        let after = snap(vec![
            cache("dentry", 300, 5),
            cache("new", 10, 1),
            cache("same", 5, 1),
        ]);
        let d = diff(&before, &after);
        let names: Vec<(&str, Presence)> =
            d.iter().map(|c| (c.name.as_str(), c.presence)).collect();
        assert_eq!(
            names,
            vec![
                ("dentry", Presence::Both),
                ("gone", Presence::Vanished),
                ("new", Presence::Appeared),
                ("same", Presence::Both),
            ]
        );
        assert_eq!(d[0].delta_objs(), 200);
        assert_eq!(d[0].delta_memory(), 3 * 4096);
        assert_eq!(d[1].delta_objs(), -64);
        assert_eq!(d[1].delta_memory(), -4096);
        assert_eq!(d[2].delta_objs(), 10);
        assert_eq!(d[3].delta_memory(), 0);
    }

    #[test]
    fn series_fill_absent_caches_with_zero() {
        let samples = vec![
            (0.0, snap(vec![cache("a", 1, 1)])),
            (1.0, snap(vec![cache("a", 2, 1), cache("b", 7, 1)])),
        ];
        let s = series(&samples);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].points, vec![(0.0, 1), (1.0, 2)]);
        assert_eq!(s[1].cache, "b");
        assert_eq!(s[1].points, vec![(0.0, 0), (1.0, 7)]);
    }
}
