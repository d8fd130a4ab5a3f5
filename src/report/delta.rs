//! Per-interval deltas from cumulative map reads, and the bookkeeping that
//! lets idle map entries be deleted without losing or double-counting an
//! event. Pure: snapshots in, snapshots out.
//!
//! The BPF maps only ever grow their counters, so an interval is the current
//! read minus the previous one, key by key. Three things complicate that:
//! - a key seen for the first time counts from zero;
//! - a counter that went backwards means its entry was deleted and recreated
//!   behind our back: the current value is all new;
//! - entries kheap deletes itself (aged out) are read in the same syscall
//!   that deletes them; whatever they gained since the last read is carried
//!   into the next interval.

use std::collections::HashMap;
use std::hash::Hash;

use crate::model::snapshot::{CgroupKey, EventCounters, ProgRunTime, Snapshot};
use crate::model::{AllocStats, CacheId, Owner, SiteKey};

use crate::model::snapshot::IdleKeys;

/// A cumulative counter value of one map entry.
pub trait Counter: Clone + Default {
    /// Whether `self` is smaller than `earlier`: the entry was reset.
    fn went_backwards(&self, earlier: &Self) -> bool;
    /// `self - earlier`, for a value that did not go backwards.
    fn minus(&self, earlier: &Self) -> Self;
    fn plus(&mut self, other: &Self);
    fn is_zero(&self) -> bool;
}

impl Counter for AllocStats {
    fn went_backwards(&self, earlier: &Self) -> bool {
        self.count < earlier.count
            || self.bytes_req < earlier.bytes_req
            || self.bytes_alloc < earlier.bytes_alloc
    }
    fn minus(&self, earlier: &Self) -> Self {
        *self - *earlier
    }
    fn plus(&mut self, other: &Self) {
        *self += *other;
    }
    fn is_zero(&self) -> bool {
        self.count == 0
    }
}

impl Counter for u64 {
    fn went_backwards(&self, earlier: &Self) -> bool {
        self < earlier
    }
    fn minus(&self, earlier: &Self) -> Self {
        self - earlier
    }
    fn plus(&mut self, other: &Self) {
        *self += other;
    }
    fn is_zero(&self) -> bool {
        *self == 0
    }
}

/// Per-process values carry the command name along with the counters.
impl Counter for (String, AllocStats) {
    fn went_backwards(&self, earlier: &Self) -> bool {
        self.1.went_backwards(&earlier.1)
    }
    fn minus(&self, earlier: &Self) -> Self {
        (self.0.clone(), self.1 - earlier.1)
    }
    fn plus(&mut self, other: &Self) {
        if self.0.is_empty() {
            self.0 = other.0.clone();
        }
        self.1 += other.1;
    }
    fn is_zero(&self) -> bool {
        self.1.count == 0
    }
}

/// What changed between two reads of one cumulative counter.
pub fn counter_delta<V: Counter>(cur: &V, prev: Option<&V>) -> V {
    match prev {
        Some(p) if !cur.went_backwards(p) => cur.minus(p),
        // New, or reset since the last read: everything in it is new.
        _ => cur.clone(),
    }
}

/// Interval deltas of one map: non-zero entries only, plus what was carried
/// over from deleted entries.
fn map_delta<K: Clone + Eq + Hash, V: Counter>(
    cur: &HashMap<K, V>,
    prev: &HashMap<K, V>,
    carry: &mut HashMap<K, V>,
) -> HashMap<K, V> {
    let mut out = HashMap::new();
    for (k, v) in cur {
        let d = counter_delta(v, prev.get(k));
        if !d.is_zero() {
            out.insert(k.clone(), d);
        }
    }
    for (k, c) in carry.drain() {
        if !c.is_zero() {
            out.entry(k).or_default().plus(&c);
        }
    }
    out
}

/// Each event counter's change, as [`counter_delta`] has it.
fn events_delta(cur: &EventCounters, prev: &EventCounters) -> EventCounters {
    cur.zip(prev, |c, p| counter_delta(&c, Some(&p)))
}

/// Consecutive idle intervals of each key of one map.
#[derive(Clone, Debug)]
struct IdleCount<K>(HashMap<K, u32>);

impl<K> Default for IdleCount<K> {
    fn default() -> Self {
        IdleCount(HashMap::new())
    }
}

impl<K: Clone + Eq + Hash> IdleCount<K> {
    /// Counts one more idle interval for keys present but unchanged; keys
    /// that moved restart at zero, keys gone from the map are dropped.
    fn observe<V>(&mut self, present: &HashMap<K, V>, active: &HashMap<K, V>) {
        self.0.retain(|k, _| present.contains_key(k));
        for k in present.keys() {
            let n = self.0.entry(k.clone()).or_insert(0);
            *n = if active.contains_key(k) { 0 } else { *n + 1 };
        }
    }
    fn at_least(&self, intervals: u32) -> Vec<K> {
        self.0
            .iter()
            .filter(|(_, &n)| n >= intervals)
            .map(|(k, _)| k.clone())
            .collect()
    }
    fn forget(&mut self, k: &K) {
        self.0.remove(k);
    }
}

/// The running state of one map: its last read, what its deleted entries
/// gained since (carried into the next interval), and how long each key
/// has been idle.
struct MapTrack<K, V> {
    prev: HashMap<K, V>,
    carry: HashMap<K, V>,
    idle: IdleCount<K>,
}

impl<K, V> Default for MapTrack<K, V> {
    fn default() -> Self {
        MapTrack {
            prev: HashMap::new(),
            carry: HashMap::new(),
            idle: IdleCount::default(),
        }
    }
}

impl<K: Clone + Eq + Hash, V: Counter> MapTrack<K, V> {
    /// The interval's deltas up to `cur`, which becomes the baseline.
    fn step(&mut self, cur: HashMap<K, V>) -> HashMap<K, V> {
        let delta = map_delta(&cur, &self.prev, &mut self.carry);
        self.idle.observe(&cur, &delta);
        self.prev = cur;
        delta
    }

    /// Entries deleted from the map, with their values at deletion:
    /// whatever they gained since the last read is carried over, and they
    /// no longer serve as a baseline.
    fn forget(&mut self, removed: &HashMap<K, V>) {
        for (k, v) in removed {
            let gained = counter_delta(v, self.prev.remove(k).as_ref());
            if !gained.is_zero() {
                self.carry.entry(k.clone()).or_default().plus(&gained);
            }
            self.idle.forget(k);
        }
    }
}

/// Turns successive cumulative snapshots into per-interval snapshots.
#[derive(Default)]
pub struct Tracker {
    sites: MapTrack<SiteKey, AllocStats>,
    stacks: MapTrack<(SiteKey, i64), AllocStats>,
    /// Stacks by who made them (kept only where the kernel keys stacks by
    /// owner: serve's profiles). Entries the kernel deleted are gone from
    /// the next read, so they stop being a baseline by themselves.
    stack_owners: MapTrack<((SiteKey, i64), Owner), AllocStats>,
    procs: MapTrack<Option<u32>, (String, AllocStats)>,
    cgroups: MapTrack<CgroupKey, AllocStats>,
    caches: MapTrack<CacheId, u64>,
    prev_events: EventCounters,
    prev_bpf_run: ProgRunTime,
    prev_source_frees: HashMap<crate::model::Source, u64>,
    /// Stack frames of carried stacks (their ids may be gone from the map).
    carried_frames: HashMap<i64, Vec<u64>>,
}

impl Tracker {
    pub fn new() -> Tracker {
        Tracker::default()
    }

    /// The events between the previous read and `cur`, which becomes the
    /// new baseline.
    pub fn interval(&mut self, cur: Snapshot) -> Snapshot {
        let events = events_delta(&cur.events, &self.prev_events);
        self.prev_events = cur.events;
        let bpf_run = cur.bpf_run.since(&self.prev_bpf_run);
        self.prev_bpf_run = cur.bpf_run;
        let source_frees = cur
            .source_frees
            .iter()
            .map(|(&s, &n)| {
                let before = self.prev_source_frees.get(&s).copied().unwrap_or(0);
                (s, n.saturating_sub(before))
            })
            .collect();
        self.prev_source_frees = cur.source_frees;
        let sites = self.sites.step(cur.sites);
        let stacks = self.stacks.step(cur.stacks);
        let flat: HashMap<((SiteKey, i64), Owner), AllocStats> = cur
            .stack_owners
            .into_iter()
            .flat_map(|(k, by)| by.into_iter().map(move |(o, s)| ((k.clone(), o), s)))
            .collect();
        let mut stack_owners: HashMap<(SiteKey, i64), HashMap<Owner, AllocStats>> = HashMap::new();
        for ((k, o), s) in self.stack_owners.step(flat) {
            stack_owners.entry(k).or_default().insert(o, s);
        }
        let procs = self.procs.step(cur.procs);
        let cgroups = self.cgroups.step(cur.cgroups);
        let cache_frees = self.caches.step(cur.cache_frees);

        let mut stack_frames = HashMap::new();
        for (_, id) in stacks.keys() {
            let frames = cur
                .stack_frames
                .get(id)
                .or_else(|| self.carried_frames.get(id));
            if let Some(f) = frames {
                stack_frames.insert(*id, f.clone());
            }
        }
        self.carried_frames.clear();
        Snapshot {
            sites,
            stacks,
            stack_frames,
            procs,
            cgroups,
            proc_cgroups: cur.proc_cgroups,
            cache_frees,
            source_frees,
            events,
            bpf_run,
            leaks: None,
            stack_owners,
            // The names of the processes that own stacks, as last read.
            comms: cur.comms,
        }
    }

    /// Keys that have been idle for at least `intervals` reads in a row.
    pub fn idle_keys(&self, intervals: u32) -> IdleKeys {
        IdleKeys {
            sites: self.sites.idle.at_least(intervals),
            stacks: self.stacks.idle.at_least(intervals),
            procs: self.procs.idle.at_least(intervals),
            cgroups: self.cgroups.idle.at_least(intervals),
            caches: self.caches.idle.at_least(intervals),
        }
    }

    /// Takes note of entries deleted from the maps, with their values at
    /// deletion: whatever they gained since the last read is reported in the
    /// next interval, and they no longer serve as a baseline.
    pub fn forget(&mut self, removed: &Snapshot) {
        self.sites.forget(&removed.sites);
        self.stacks.forget(&removed.stacks);
        self.procs.forget(&removed.procs);
        self.cgroups.forget(&removed.cgroups);
        self.caches.forget(&removed.cache_frees);
        for (id, frames) in &removed.stack_frames {
            self.carried_frames.insert(*id, frames.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CgroupSlot, Hist, KmallocSlab};

    fn stats(count: u64, size: u64) -> AllocStats {
        let mut h = Hist::default();
        h.0[Hist::bucket_of(size)] = count;
        AllocStats {
            count,
            bytes_req: count * size,
            bytes_alloc: count * size.next_power_of_two(),
            hist: h,
        }
    }

    fn key(site: u64) -> SiteKey {
        SiteKey {
            call_site: site,
            cache: CacheId::Kmalloc {
                size: 192,
                accounted: false,
                slab: KmallocSlab::SizeClass,
            },
        }
    }

    fn snap(sites: &[(u64, u64)]) -> Snapshot {
        let mut s = Snapshot::default();
        for &(site, count) in sites {
            s.sites.insert(key(site), stats(count, 144));
        }
        s
    }

    #[test]
    fn deltas_subtract_the_previous_read() {
        let mut t = Tracker::new();
        let d1 = t.interval(snap(&[(1, 100), (2, 5)]));
        assert_eq!(d1.sites[&key(1)].count, 100, "first read counts from zero");
        let d2 = t.interval(snap(&[(1, 250), (2, 5)]));
        assert_eq!(d2.sites[&key(1)], stats(150, 144));
        assert_eq!(d2.sites[&key(1)].hist.0[Hist::bucket_of(144)], 150);
        assert!(!d2.sites.contains_key(&key(2)), "idle keys have no row");
    }

    #[test]
    fn keys_that_appear_and_disappear() {
        let mut t = Tracker::new();
        t.interval(snap(&[(1, 10)]));
        let d = t.interval(snap(&[(1, 10), (3, 7)]));
        assert_eq!(d.sites.len(), 1);
        assert_eq!(d.sites[&key(3)].count, 7);
        // Key 1 vanished (deleted by someone else): no row, no negative.
        let d = t.interval(snap(&[(3, 9)]));
        assert_eq!(d.sites.len(), 1);
        assert_eq!(d.sites[&key(3)].count, 2);
        // It comes back from zero: all of it is new.
        let d = t.interval(snap(&[(1, 4), (3, 9)]));
        assert_eq!(d.sites[&key(1)].count, 4);
    }

    #[test]
    fn a_counter_that_went_backwards_was_reset() {
        let mut t = Tracker::new();
        t.interval(snap(&[(1, 1000)]));
        let d = t.interval(snap(&[(1, 30)]));
        assert_eq!(d.sites[&key(1)].count, 30, "not 0, not a wrapped u64");
        let mut prev = EventCounters {
            frees: 500,
            ..Default::default()
        };
        let cur = EventCounters {
            frees: 20,
            ..Default::default()
        };
        assert_eq!(events_delta(&cur, &prev).frees, 20);
        prev.frees = 5;
        assert_eq!(events_delta(&cur, &prev).frees, 15);
    }

    #[test]
    fn idle_keys_age_out_without_losing_events() {
        let mut t = Tracker::new();
        t.interval(snap(&[(1, 10), (2, 50)]));
        t.interval(snap(&[(1, 10), (2, 60)]));
        assert!(t.idle_keys(2).is_empty());
        t.interval(snap(&[(1, 10), (2, 70)]));
        assert_eq!(t.idle_keys(2).sites, vec![key(1)]);
        assert_eq!(t.idle_keys(2).len(), 1);
        // Deleted with 3 more events than the last read saw: they show up
        // in the next interval even though the key is gone from the map.
        let mut removed = Snapshot::default();
        removed.sites.insert(key(1), stats(13, 144));
        t.forget(&removed);
        assert!(
            t.idle_keys(1).sites.is_empty(),
            "forgotten keys are not idle"
        );
        let d = t.interval(snap(&[(2, 80)]));
        assert_eq!(d.sites[&key(1)].count, 3);
        assert_eq!(d.sites[&key(2)].count, 10);
        // Recreated by the kernel after deletion: counts from zero again,
        // nothing carried twice.
        let d = t.interval(snap(&[(1, 2), (2, 80)]));
        assert_eq!(d.sites[&key(1)].count, 2);
        assert_eq!(d.sites.len(), 1);
    }

    #[test]
    fn removed_entries_that_gained_nothing_carry_nothing() {
        let mut t = Tracker::new();
        t.interval(snap(&[(1, 10)]));
        let mut removed = Snapshot::default();
        removed.sites.insert(key(1), stats(10, 144));
        t.forget(&removed);
        let d = t.interval(Snapshot::default());
        assert!(d.sites.is_empty());
    }

    #[test]
    fn stacks_procs_and_cache_frees_are_deltas_too() {
        let mut t = Tracker::new();
        let mut a = Snapshot::default();
        a.stacks.insert((key(1), 7), stats(2, 144));
        a.stack_frames.insert(7, vec![0x10, 0x20]);
        a.procs.insert(Some(42), ("cc1".into(), stats(5, 64)));
        a.cache_frees.insert(CacheId::Named("dentry".into()), 100);
        a.events.frees = 100;
        a.events.lost_stack_collision = 1;
        t.interval(a.clone());
        let mut b = a.clone();
        b.stacks.insert((key(1), 7), stats(5, 144));
        b.procs.insert(Some(42), ("cc1".into(), stats(9, 64)));
        b.cache_frees.insert(CacheId::Named("dentry".into()), 160);
        b.events.frees = 190;
        let d = t.interval(b);
        assert_eq!(d.stacks[&(key(1), 7)].count, 3);
        assert_eq!(d.stack_frames[&7], vec![0x10, 0x20]);
        assert_eq!(d.procs[&Some(42)], ("cc1".to_string(), stats(4, 64)));
        assert_eq!(d.cache_frees[&CacheId::Named("dentry".into())], 60);
        assert_eq!(d.events.frees, 90);
        assert_eq!(d.events.lost_stack_collision, 0);
    }

    #[test]
    fn stack_owners_are_deltas_and_carry_their_names() {
        let owner = Owner::Process {
            tgid: 42,
            cgroup: 1,
        };
        let mut t = Tracker::new();
        let mut a = Snapshot::default();
        a.stack_owners
            .entry((key(1), 7))
            .or_default()
            .insert(owner, stats(2, 144));
        a.comms.insert(42, "cc1".into());
        t.interval(a.clone());
        let mut b = a.clone();
        b.stack_owners
            .entry((key(1), 7))
            .or_default()
            .insert(owner, stats(5, 144));
        b.stack_owners
            .entry((key(1), 7))
            .or_default()
            .insert(Owner::Interrupt, stats(1, 144));
        let d = t.interval(b);
        assert_eq!(d.stack_owners[&(key(1), 7)][&owner].count, 3);
        assert_eq!(d.stack_owners[&(key(1), 7)][&Owner::Interrupt].count, 1);
        assert_eq!(d.comms[&42], "cc1");
        // Deleted from the map (idle), then back: it counts from zero.
        t.interval(Snapshot::default());
        let d = t.interval(a);
        assert_eq!(d.stack_owners[&(key(1), 7)][&owner].count, 2);
    }

    #[test]
    fn idle_cgroups_age_out_and_their_last_events_are_kept() {
        let stopped = CgroupKey {
            slot: CgroupSlot::Cgroup(7),
            accounted: false,
        };
        let busy = CgroupKey {
            slot: CgroupSlot::Interrupt,
            accounted: false,
        };
        let with = |a: u64, b: u64| {
            let mut s = Snapshot::default();
            s.cgroups.insert(stopped, stats(a, 64));
            s.cgroups.insert(busy, stats(b, 64));
            s
        };
        let mut t = Tracker::new();
        t.interval(with(5, 1));
        t.interval(with(5, 2));
        t.interval(with(5, 3));
        let idle = t.idle_keys(2);
        assert_eq!(idle.cgroups, vec![stopped]);
        assert_eq!(idle.len(), 1);
        // Deleted with one more allocation than the last read saw.
        let mut removed = Snapshot::default();
        removed.cgroups.insert(stopped, stats(6, 64));
        assert_eq!(removed.map_entries(), 1);
        t.forget(&removed);
        let mut next = Snapshot::default();
        next.cgroups.insert(busy, stats(4, 64));
        let d = t.interval(next);
        assert_eq!(d.cgroups[&stopped].count, 1);
        assert_eq!(d.cgroups[&busy].count, 1);
    }

    #[test]
    fn carried_stacks_keep_their_frames() {
        let mut t = Tracker::new();
        let mut a = Snapshot::default();
        a.stacks.insert((key(1), 7), stats(2, 144));
        a.stack_frames.insert(7, vec![0x10]);
        t.interval(a);
        let mut removed = Snapshot::default();
        removed.stacks.insert((key(1), 7), stats(3, 144));
        removed.stack_frames.insert(7, vec![0x10]);
        t.forget(&removed);
        let d = t.interval(Snapshot::default());
        assert_eq!(d.stacks[&(key(1), 7)].count, 1);
        assert_eq!(d.stack_frames[&7], vec![0x10]);
    }
}
