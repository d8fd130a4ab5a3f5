//! The pprof profiles `kheap serve` answers on `/pprof/alloc` and
//! `/pprof/inuse`, from state the reading thread keeps. Pure: interval
//! deltas and outstanding groups in, profile rows and pprof bytes out.
//!
//! - Site totals are exact (every allocation counted) and cumulative since
//!   the daemon started; stacks are sampled (about one allocation in
//!   `--stack-sample-every`), so each site's exact totals are apportioned
//!   over its sampled stacks (largest remainder: the rows of a site add up
//!   to its exact totals to the unit) and those rows carry
//!   `estimated=true`. A site with no sampled stack is one single-frame row.
//! - Memory is bounded: at most `max_stacks` stacks keep their own
//!   cumulative counts. A stack idle for [`FORGET_AFTER`] intervals, or the
//!   least recently active ones beyond the cap, are folded into their
//!   site's "stack aged out" share: the site's totals never change, only
//!   that part of its breakdown loses its frames.
//! - Outstanding memory (`inuse_*`) is the live-object map read that
//!   interval: exact per site, apportioned over the site's sampled stacks
//!   the same way.
//! - Who allocated: each stack's allocations are apportioned over the
//!   processes that made its sampled ones (the kernel keys sampled stacks
//!   by owner), and those rows carry `process` (`comm [pid]`) and `pid`
//!   (or `process=interrupt`). At most [`MAX_OWNERS`] processes per stack
//!   keep their own share; the rest, the stacks folded away and the
//!   outstanding objects (the live objects are not read by owner) are rows
//!   without a process.

use std::collections::HashMap;
use std::sync::Arc;

use crate::model::live::Outstanding;
use crate::model::snapshot::Snapshot;
use crate::model::{apportion, AllocStats, Owner, SiteKey, Source};
use crate::render::pprof::{heap_profile, process_labels, source_label, Frame, Label, Sample};
use crate::render::SourceColumn;
use crate::serve::series::FORGET_AFTER;
use crate::symbolize::{caller_frames, strip_tracing_frames, Symbolize};

/// The stack id of rows without a stack (the site's own frame).
const NO_STACK: i64 = 0;

/// Processes per stack that keep a share of their own; later ones go to
/// the stack's share without a process.
pub const MAX_OWNERS: usize = 16;

#[derive(Clone, Debug, Default)]
struct StackState {
    /// Sampled allocations, cumulative.
    sampled: AllocStats,
    /// Intervals since the stack was last sampled.
    idle: u32,
    /// Sampled allocations by process (`None`: interrupt context), at most
    /// MAX_OWNERS of them.
    owners: HashMap<Option<u32>, AllocStats>,
}

/// Who made a row's allocations: a process (its pid and name) or
/// interrupt context (`pid` None).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowOwner {
    pub pid: Option<u32>,
    pub comm: Arc<str>,
}

/// Cumulative per-site and per-stack allocation counts of the daemon.
#[derive(Default)]
pub struct ProfileState {
    sites: HashMap<SiteKey, AllocStats>,
    stacks: HashMap<(SiteKey, i64), StackState>,
    /// Per site: sampled counts of stacks folded away (aged out, capped).
    folded: HashMap<SiteKey, AllocStats>,
    /// Symbolized frames of the stacks held, innermost first.
    frames: HashMap<i64, Arc<[Frame]>>,
    /// Names of the processes the stacks' owners are, as first learned.
    comms: HashMap<u32, Arc<str>>,
    /// The call site's frame and the cache name of each site.
    site_frames: HashMap<SiteKey, (Arc<[Frame]>, Arc<str>)>,
    max_stacks: usize,
    stack_sample_every: u32,
    /// Keep the allocator's entry frames on top of each stack
    /// (`--keep-allocator-frames`; by default the leaf is the caller).
    keep_allocator_frames: bool,
    /// Stacks folded away so far.
    pub stacks_folded: u64,
}

/// One row of a profile: a stack (or a site's own frame) and its values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileRow {
    pub frames: Arc<[Frame]>,
    pub cache: Arc<str>,
    pub source: Source,
    /// alloc_objects, alloc_space, inuse_objects, inuse_space.
    pub values: [i64; 4],
    pub estimated: bool,
    /// The site's share of stacks folded away (aged out or over the cap).
    pub aged_out: bool,
    /// Who made these allocations, where known.
    pub owner: Option<RowOwner>,
}

/// What the HTTP threads encode on request.
#[derive(Clone, Debug, Default)]
pub struct ProfileSnapshot {
    pub rows: Vec<ProfileRow>,
    /// Whether outstanding memory is known (`--track-outstanding`).
    pub inuse: bool,
    pub duration_s: f64,
    pub stack_sample_every: u32,
    /// Whether samples carry a `source` label: once an allocator beyond
    /// the slab has been seen (as reports do, `SourceColumn`).
    pub sources: SourceColumn,
}

impl ProfileState {
    pub fn new(max_stacks: usize, stack_sample_every: u32) -> ProfileState {
        ProfileState {
            max_stacks,
            stack_sample_every,
            ..Default::default()
        }
    }

    /// With the allocator's own entry frames kept on top of each stack.
    pub fn keeping_allocator_frames(mut self, keep: bool) -> ProfileState {
        self.keep_allocator_frames = keep;
        self
    }

    /// New settings (SIGHUP): the cap applies from the next interval; the
    /// sampling period is what the profiles' comment states.
    pub fn set_limits(&mut self, max_stacks: usize, stack_sample_every: u32) {
        self.max_stacks = max_stacks;
        self.stack_sample_every = stack_sample_every;
    }

    /// Adds one interval's deltas (sites exact, stacks sampled), with the
    /// frames of new stacks symbolized once.
    pub fn add_interval(&mut self, delta: &Snapshot, syms: &dyn Symbolize) {
        for (k, s) in &delta.sites {
            *self.sites.entry(k.clone()).or_default() += *s;
            if !self.site_frames.contains_key(k) {
                let frame = match k.whole_allocator() {
                    Some(name) => Arc::from([Frame::kernel(&name)]),
                    None => syms
                        .symbolize(&[k.call_site])
                        .into_iter()
                        .map(|f| Frame::kernel(&f.display()))
                        .collect(),
                };
                self.site_frames
                    .insert(k.clone(), (frame, Arc::from(k.cache.name())));
            }
        }
        for s in self.stacks.values_mut() {
            s.idle = s.idle.saturating_add(1);
        }
        for ((site, id), s) in &delta.stacks {
            let e = self.stacks.entry((site.clone(), *id)).or_default();
            e.sampled += *s;
            e.idle = 0;
            if !self.frames.contains_key(id) {
                if let Some(addrs) = delta.stack_frames.get(id) {
                    let names: Vec<String> = strip_tracing_frames(syms.symbolize(addrs))
                        .iter()
                        .map(|f| f.display())
                        .collect();
                    let names = if self.keep_allocator_frames {
                        &names[..]
                    } else {
                        caller_frames(&names)
                    };
                    let frames = names.iter().map(|f| Frame::kernel(f)).collect();
                    self.frames.insert(*id, frames);
                }
            }
        }
        self.add_owners(delta);
        self.fold_stale_stacks();
    }

    /// Adds the interval's sampled stacks by owner (up to MAX_OWNERS a
    /// stack) and learns the owners' names.
    fn add_owners(&mut self, delta: &Snapshot) {
        for (k, by) in &delta.stack_owners {
            let Some(e) = self.stacks.get_mut(k) else {
                continue;
            };
            for (owner, s) in by {
                let pid = match *owner {
                    Owner::Process { tgid, .. } => Some(tgid),
                    Owner::Interrupt => None,
                };
                if e.owners.len() >= MAX_OWNERS && !e.owners.contains_key(&pid) {
                    continue;
                }
                *e.owners.entry(pid).or_default() += *s;
                if let Some(tgid) = pid {
                    self.comms.entry(tgid).or_insert_with(|| {
                        Arc::from(delta.comms.get(&tgid).map(String::as_str).unwrap_or(""))
                    });
                }
            }
        }
    }

    /// Folds stacks idle too long, then the least recently active beyond
    /// the cap, into their site's aged-out share.
    fn fold_stale_stacks(&mut self) {
        let mut fold: Vec<(SiteKey, i64)> = self
            .stacks
            .iter()
            .filter(|(_, s)| s.idle >= FORGET_AFTER)
            .map(|(k, _)| k.clone())
            .collect();
        let over = self
            .stacks
            .len()
            .saturating_sub(fold.len() + self.max_stacks);
        if over > 0 {
            let mut live: Vec<(&(SiteKey, i64), &StackState)> = self
                .stacks
                .iter()
                .filter(|(_, s)| s.idle < FORGET_AFTER)
                .collect();
            // Longest idle first, then the smallest.
            live.sort_by(|a, b| {
                b.1.idle
                    .cmp(&a.1.idle)
                    .then(a.1.sampled.bytes_alloc.cmp(&b.1.sampled.bytes_alloc))
                    .then(a.0 .1.cmp(&b.0 .1))
            });
            fold.extend(live.into_iter().take(over).map(|(k, _)| k.clone()));
        }
        for k in &fold {
            if let Some(s) = self.stacks.remove(k) {
                *self.folded.entry(k.0.clone()).or_default() += s.sampled;
                self.stacks_folded += 1;
            }
        }
        if !fold.is_empty() {
            let used: std::collections::HashSet<i64> =
                self.stacks.keys().map(|(_, id)| *id).collect();
            self.frames.retain(|id, _| used.contains(id));
            let named: std::collections::HashSet<u32> = self
                .stacks
                .values()
                .flat_map(|s| s.owners.keys().flatten().copied())
                .collect();
            self.comms.retain(|pid, _| named.contains(pid));
        }
    }

    /// Stacks with their own cumulative counts now.
    pub fn stacks_held(&self) -> usize {
        self.stacks.len()
    }

    /// The rows of both profiles: allocations since the start and, given
    /// the live objects grouped by (site, stack), what is outstanding now.
    pub fn rows(
        &self,
        outstanding: Option<&HashMap<(SiteKey, i64), Outstanding>>,
    ) -> Vec<ProfileRow> {
        // Per site: its stacks (sampled alloc, sampled outstanding).
        #[derive(Default)]
        struct Parts {
            alloc: HashMap<i64, (u64, u64)>,
            inuse: HashMap<i64, (u64, u64)>,
            inuse_exact: (u64, u64),
        }
        let mut by_site: HashMap<&SiteKey, Parts> = HashMap::new();
        for ((site, id), s) in &self.stacks {
            let p = by_site.entry(site).or_default();
            p.alloc
                .insert(*id, (s.sampled.count, s.sampled.bytes_alloc));
        }
        for (site, s) in &self.folded {
            let p = by_site.entry(site).or_default();
            p.alloc.insert(NO_STACK, (s.count, s.bytes_alloc));
        }
        for ((site, id), o) in outstanding.into_iter().flatten() {
            // Only sites the daemon has counted can be named.
            let Some((site, _)) = self.sites.get_key_value(site) else {
                continue;
            };
            let p = by_site.entry(site).or_default();
            p.inuse_exact.0 += o.objects;
            p.inuse_exact.1 += o.bytes_alloc;
            if *id != NO_STACK && self.frames.contains_key(id) {
                let e = p.inuse.entry(*id).or_default();
                e.0 += o.objects;
                e.1 += o.bytes_alloc;
            }
        }
        let mut rows = Vec::new();
        for (site, exact) in &self.sites {
            let parts = by_site.remove(site).unwrap_or_default();
            let mut values: HashMap<i64, [u64; 4]> = HashMap::new();
            split(
                &parts.alloc,
                (exact.count, exact.bytes_alloc),
                0,
                &mut values,
            );
            split(&parts.inuse, parts.inuse_exact, 2, &mut values);
            // The rows are estimates where the stacks do not add up to the
            // exact totals (sampled stacks, or stacks lost) and were
            // scaled; every stack captured (--exact-stacks) splits nothing.
            let estimated = !adds_up(&parts.alloc, (exact.count, exact.bytes_alloc))
                || !adds_up(&parts.inuse, parts.inuse_exact);
            let (site_frame, cache) = &self.site_frames[site];
            for (id, v) in values {
                if v == [0; 4] {
                    continue;
                }
                let frames = match self.frames.get(&id) {
                    Some(f) if id != NO_STACK => f.clone(),
                    _ => site_frame.clone(),
                };
                let row = ProfileRow {
                    frames,
                    cache: cache.clone(),
                    source: site.cache.source(),
                    values: v.map(|x| x as i64),
                    estimated,
                    aged_out: id == NO_STACK && parts.alloc.contains_key(&NO_STACK),
                    owner: None,
                };
                match self.stacks.get(&(site.clone(), id)) {
                    Some(s) if id != NO_STACK && !s.owners.is_empty() => {
                        self.split_by_owner(row, s, &mut rows)
                    }
                    _ => rows.push(row),
                }
            }
        }
        rows.sort_by(|a, b| {
            b.values[1].cmp(&a.values[1]).then_with(|| {
                let names = |r: &ProfileRow| {
                    r.frames
                        .iter()
                        .map(|f| f.function.clone())
                        .collect::<Vec<_>>()
                };
                names(a).cmp(&names(b))
            })
        });
        rows
    }

    /// Splits a stack's row over the processes that made its sampled
    /// allocations: one row per process with its share of the allocations
    /// (largest remainder, so they add up to the row's), and the row
    /// without a process keeps the outstanding values and what no process
    /// kept (owners beyond MAX_OWNERS).
    fn split_by_owner(&self, row: ProfileRow, s: &StackState, rows: &mut Vec<ProfileRow>) {
        let mut owners: Vec<(&Option<u32>, &AllocStats)> = s.owners.iter().collect();
        owners.sort_by_key(|(pid, _)| **pid);
        let kept = owners
            .iter()
            .fold((0, 0), |t, (_, a)| (t.0 + a.count, t.1 + a.bytes_alloc));
        // The share no process kept, as one more part.
        let rest = (
            s.sampled.count.saturating_sub(kept.0),
            s.sampled.bytes_alloc.saturating_sub(kept.1),
        );
        let mut weights_objects: Vec<u64> = owners.iter().map(|(_, a)| a.count).collect();
        let mut weights_bytes: Vec<u64> = owners.iter().map(|(_, a)| a.bytes_alloc).collect();
        weights_objects.push(rest.0);
        weights_bytes.push(rest.1);
        if weights_objects.iter().all(|&w| w == 0) || weights_bytes.iter().all(|&w| w == 0) {
            rows.push(row);
            return;
        }
        let objects = apportion(row.values[0] as u64, &weights_objects);
        let bytes = apportion(row.values[1] as u64, &weights_bytes);
        for (i, (pid, _)) in owners.iter().enumerate() {
            if objects[i] == 0 && bytes[i] == 0 {
                continue;
            }
            let comm = match pid {
                Some(p) => self.comms.get(p).cloned().unwrap_or_else(|| Arc::from("")),
                None => Arc::from(""),
            };
            rows.push(ProfileRow {
                values: [objects[i] as i64, bytes[i] as i64, 0, 0],
                owner: Some(RowOwner { pid: **pid, comm }),
                ..row.clone()
            });
        }
        let last = owners.len();
        let values = [
            objects[last] as i64,
            bytes[last] as i64,
            row.values[2],
            row.values[3],
        ];
        if values != [0; 4] {
            rows.push(ProfileRow { values, ..row });
        }
    }

    pub fn snapshot(
        &self,
        outstanding: Option<&HashMap<(SiteKey, i64), Outstanding>>,
        duration_s: f64,
    ) -> ProfileSnapshot {
        ProfileSnapshot {
            rows: self.rows(outstanding),
            inuse: outstanding.is_some(),
            duration_s,
            stack_sample_every: self.stack_sample_every,
            sources: SourceColumn(
                self.sites
                    .keys()
                    .any(|k| k.cache.source() != Source::Kmalloc),
            ),
        }
    }
}

/// Whether a site's stacks hold its exact totals between them (none at all
/// is a site shown whole, also exact).
fn adds_up(parts: &HashMap<i64, (u64, u64)>, exact: (u64, u64)) -> bool {
    parts.is_empty() || parts.values().fold((0, 0), |t, v| (t.0 + v.0, t.1 + v.1)) == exact
}

/// Apportions a site's exact (objects, bytes) over its sampled parts (by
/// stack id) into `values[at]` and `values[at + 1]`; with no sampled part
/// all of it goes to the site's own row.
fn split(
    parts: &HashMap<i64, (u64, u64)>,
    exact: (u64, u64),
    at: usize,
    values: &mut HashMap<i64, [u64; 4]>,
) {
    let mut ids: Vec<i64> = parts.keys().copied().collect();
    ids.sort_unstable();
    let sampled_objects: u64 = ids.iter().map(|id| parts[id].0).sum();
    if sampled_objects == 0 {
        if exact != (0, 0) {
            let v = values.entry(NO_STACK).or_default();
            v[at] += exact.0;
            v[at + 1] += exact.1;
        }
        return;
    }
    let objects = apportion(
        exact.0,
        &ids.iter().map(|id| parts[id].0).collect::<Vec<_>>(),
    );
    let bytes = apportion(
        exact.1,
        &ids.iter().map(|id| parts[id].1).collect::<Vec<_>>(),
    );
    for (i, id) in ids.iter().enumerate() {
        let v = values.entry(*id).or_default();
        v[at] += objects[i];
        v[at + 1] += bytes[i];
    }
}

/// Which profile a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// Allocations since the daemon started (`alloc_*`).
    Alloc,
    /// Outstanding memory now, with the allocations beside it, as in Go's
    /// heap profiles (`inuse_*` shown by default).
    Inuse,
}

impl ProfileSnapshot {
    /// The gzip-compressed profile.proto of `which`.
    pub fn encode(&self, which: Which) -> Vec<u8> {
        let inuse = which == Which::Inuse;
        let mut b = heap_profile(inuse, self.duration_s);
        b.comment(&format!(
            "kheap serve: kernel heap, {} since the daemon started ({:.0} s)",
            if inuse {
                "outstanding objects now, allocations"
            } else {
                "allocations"
            },
            self.duration_s
        ));
        if self.stack_sample_every > 1 {
            b.comment(&format!(
                "stacks sampled 1 in {}: per-stack values are estimates (label estimated=true), apportioned so that each site's stacks add up to its exact totals",
                self.stack_sample_every
            ));
        }
        let n = if inuse { 4 } else { 2 };
        for r in &self.rows {
            if r.values[..n].iter().all(|&v| v == 0) {
                continue;
            }
            let mut labels = vec![Label::Str("cache".into(), r.cache.to_string())];
            labels.extend(source_label(self.sources, r.source));
            if r.estimated {
                labels.push(Label::Str("estimated".into(), "true".into()));
            }
            if r.aged_out {
                labels.push(Label::Str("stack".into(), "aged out".into()));
            }
            if let Some(o) = &r.owner {
                labels.extend(process_labels(o.pid, &o.comm));
            }
            b.add(&Sample {
                frames: r.frames.to_vec(),
                values: r.values[..n].to_vec(),
                labels,
            });
        }
        b.encode_gzip()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::CacheId;
    use crate::symbolize::Frame as SymFrame;

    struct Syms;
    impl Symbolize for Syms {
        fn symbolize(&self, addrs: &[u64]) -> Vec<SymFrame> {
            addrs
                .iter()
                .map(|&a| SymFrame {
                    addr: a,
                    function: Some(format!("f{a:x}")),
                    offset: 0x40,
                })
                .collect()
        }
    }

    fn key(site: u64, cache: &str) -> SiteKey {
        SiteKey {
            call_site: site,
            cache: CacheId::Named(cache.into()),
        }
    }

    fn stats(count: u64, size: u64) -> AllocStats {
        AllocStats {
            count,
            bytes_req: count * size,
            bytes_alloc: count * size,
            ..Default::default()
        }
    }

    /// One site (call site 0x10, cache "c") with `total` allocations of
    /// `size` bytes and sampled stacks (id, count) of frames [0x10, 0x100 + id].
    fn site_with_stacks(total: u64, size: u64, stacks: &[(i64, u64)]) -> (SiteKey, Snapshot) {
        let site = key(0x10, "c");
        let mut d = Snapshot::default();
        d.sites.insert(site.clone(), stats(total, size));
        for &(id, count) in stacks {
            d.stacks.insert((site.clone(), id), stats(count, size));
            d.stack_frames.insert(id, vec![0x10, 0x100 + id as u64]);
        }
        (site, d)
    }

    use crate::render::pprof::test_support::{decode_gzip as decode, label_values};

    /// Address 0xa is the allocator's entry, the rest are callers.
    struct AllocatorSyms;
    impl Symbolize for AllocatorSyms {
        fn symbolize(&self, addrs: &[u64]) -> Vec<SymFrame> {
            let mut frames = Syms.symbolize(addrs);
            for f in &mut frames {
                if f.addr == 0xa {
                    f.function = Some("kmem_cache_alloc_noprof".into());
                }
            }
            frames
        }
    }

    #[test]
    fn stacks_start_at_the_caller_unless_allocator_frames_are_kept() {
        for keep in [false, true] {
            let mut p = ProfileState::new(10, 1024).keeping_allocator_frames(keep);
            let site = key(0x10, "c");
            let mut d = Snapshot::default();
            d.sites.insert(site.clone(), stats(4, 64));
            d.stacks.insert((site, 1), stats(4, 64));
            d.stack_frames.insert(1, vec![0xa, 0x10, 0x20]);
            p.add_interval(&d, &AllocatorSyms);
            let rows = p.rows(None);
            let names: Vec<&str> = rows[0].frames.iter().map(|f| f.function.as_str()).collect();
            if keep {
                assert_eq!(names, ["kmem_cache_alloc_noprof", "f10", "f20"]);
            } else {
                assert_eq!(names, ["f10", "f20"]);
            }
        }
    }

    /// A stack's exact share is split over the processes that made its
    /// sampled allocations, to the unit; outstanding values stay on a row
    /// without a process; the encoded samples carry process and pid.
    #[test]
    fn stacks_are_split_over_their_owners_and_samples_name_them() {
        let mut p = ProfileState::new(10, 1024);
        // 100 allocations of 64 bytes, one stack sampled 3 times: twice by
        // pid 7 ("cc1"), once in interrupt context.
        let (site, mut d) = site_with_stacks(100, 64, &[(1, 3)]);
        let by = d.stack_owners.entry((site.clone(), 1)).or_default();
        by.insert(Owner::Process { tgid: 7, cgroup: 1 }, stats(2, 64));
        by.insert(Owner::Interrupt, stats(1, 64));
        d.comms.insert(7, "cc1".into());
        p.add_interval(&d, &Syms);
        let live = HashMap::from([(
            (site, 1),
            Outstanding {
                objects: 5,
                bytes_alloc: 320,
            },
        )]);
        let rows = p.rows(Some(&live));
        let find = |pid: Option<u32>, owned: bool| {
            rows.iter()
                .find(|r| match &r.owner {
                    Some(o) => owned && o.pid == pid,
                    None => !owned,
                })
                .unwrap_or_else(|| panic!("{pid:?} {owned} in {rows:?}"))
        };
        // Objects and bytes are each apportioned to the unit (6400 bytes).
        assert_eq!(find(Some(7), true).values, [67, 4267, 0, 0]);
        assert_eq!(&*find(Some(7), true).owner.as_ref().unwrap().comm, "cc1");
        assert_eq!(find(None, true).values, [33, 2133, 0, 0]);
        assert_eq!(find(None, false).values, [0, 0, 5, 320]);
        assert_eq!(rows.len(), 3);
        let snap = p.snapshot(Some(&live), 1.0);
        let prof = decode(&snap.encode(Which::Alloc));
        let mut processes = label_values(&prof, "process");
        processes.sort();
        assert_eq!(
            processes,
            vec![
                (Some("cc1 [7]".to_string()), 67),
                (Some("interrupt".to_string()), 33)
            ]
        );
    }

    #[test]
    fn sites_without_stacks_are_exact_single_frame_rows() {
        let mut p = ProfileState::new(10, 1024);
        let mut d = Snapshot::default();
        d.sites.insert(key(0x10, "kmalloc-4k"), stats(300, 4096));
        p.add_interval(&d, &Syms);
        p.add_interval(&d, &Syms);
        let rows = p.rows(None);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].values, [600, 600 * 4096, 0, 0]);
        assert!(!rows[0].estimated);
        assert_eq!(rows[0].frames[0].function, "f10");
        assert_eq!(&*rows[0].cache, "kmalloc-4k");
    }

    #[test]
    fn page_sites_are_the_whole_allocator_and_samples_name_their_source() {
        let mut p = ProfileState::new(10, 1024);
        let mut d = Snapshot::default();
        d.sites.insert(key(0x10, "kmalloc-4k"), stats(3, 4096));
        let labels = |p: &ProfileState| {
            label_values(
                &decode(&p.snapshot(None, 1.0).encode(Which::Alloc)),
                "source",
            )
        };
        p.add_interval(&d, &Syms);
        assert_eq!(labels(&p), [(None, 3)], "slab only: no source label");
        let pages = SiteKey {
            call_site: 0,
            cache: CacheId::Pages {
                order: 0,
                used_for: crate::model::PageUse::Direct,
            },
        };
        let mut d = Snapshot::default();
        d.sites.insert(pages, stats(5, 4096));
        p.add_interval(&d, &Syms);
        let rows = p.rows(None);
        let page = rows.iter().find(|r| r.source == Source::Page).unwrap();
        assert_eq!(page.frames[0].function, "[page]");
        let mut got = labels(&p);
        got.sort();
        assert_eq!(got, [(Some("kmalloc".into()), 3), (Some("page".into()), 5)]);
    }

    #[test]
    fn stacks_share_the_exact_site_totals_and_inuse_follows_live_objects() {
        let mut p = ProfileState::new(10, 1024);
        let (site, d) = site_with_stacks(1001, 64, &[(7, 2), (9, 1)]);
        p.add_interval(&d, &Syms);
        let mut live = HashMap::new();
        let obj = |objects, bytes_alloc| Outstanding {
            objects,
            bytes_alloc,
        };
        live.insert((site.clone(), 0), obj(99, 99 * 64));
        live.insert((site.clone(), 9), obj(1, 64));
        let rows = p.rows(Some(&live));
        assert_eq!(rows.len(), 2);
        let sum = |i: usize| rows.iter().map(|r| r.values[i]).sum::<i64>();
        assert_eq!((sum(0), sum(1)), (1001, 1001 * 64));
        assert_eq!(
            (sum(2), sum(3)),
            (100, 6400),
            "outstanding is exact per site"
        );
        let r9 = rows
            .iter()
            .find(|r| r.frames[1].function == "f109")
            .unwrap();
        // One third of the sampled stacks: a third of each exact total.
        assert_eq!(r9.values, [334, 21_355, 100, 6400]);
        assert!(rows.iter().all(|r| r.estimated));
        // Read back as pprof: the inuse profile has four types, alloc two.
        let snap = p.snapshot(Some(&live), 5.0);
        let inuse = decode(&snap.encode(Which::Inuse));
        assert_eq!(inuse.sample_type.len(), 4);
        let total: i64 = inuse.sample.iter().map(|s| s.value[3]).sum();
        assert_eq!(total, 6400);
        let alloc = decode(&snap.encode(Which::Alloc));
        assert_eq!(alloc.sample_type.len(), 2);
        let s = |i: i64| alloc.string_table[i as usize].as_str();
        assert!(alloc.comment.iter().any(|&c| s(c).contains("1 in 1024")));
    }

    #[test]
    fn stacks_that_hold_every_allocation_are_not_estimates() {
        let mut p = ProfileState::new(10, 1);
        let (_, d) = site_with_stacks(3, 64, &[(7, 2), (9, 1)]);
        p.add_interval(&d, &Syms);
        let mut rows = p.rows(None);
        rows.sort_by_key(|r| r.values[0]);
        let values: Vec<[i64; 4]> = rows.iter().map(|r| r.values).collect();
        assert_eq!(values, [[1, 64, 0, 0], [2, 128, 0, 0]]);
        assert!(rows.iter().all(|r| !r.estimated));
        // One stack of the site lost: the other is scaled up to the
        // site's total, an estimate.
        let mut p = ProfileState::new(10, 1);
        let (_, d) = site_with_stacks(3, 64, &[(7, 2)]);
        p.add_interval(&d, &Syms);
        let rows = p.rows(None);
        assert_eq!(rows[0].values, [3, 192, 0, 0]);
        assert!(rows[0].estimated);
    }

    #[test]
    fn stale_and_excess_stacks_fold_into_their_site_keeping_totals() {
        let mut p = ProfileState::new(2, 1024);
        let (_, d) = site_with_stacks(100, 8, &[(1, 1), (2, 2), (3, 3), (4, 4)]);
        p.add_interval(&d, &Syms);
        assert_eq!(p.stacks_held(), 2, "capped");
        assert_eq!(p.stacks_folded, 2);
        let rows = p.rows(None);
        assert_eq!(rows.iter().map(|r| r.values[0]).sum::<i64>(), 100);
        let folded = rows.iter().find(|r| r.aged_out).unwrap();
        // Stacks 1 and 2 (the smallest) folded: 3 of 10 sampled.
        assert_eq!(folded.values[0], 30);
        // Idle long enough, the rest fold too; the site total stays.
        for _ in 0..FORGET_AFTER {
            p.add_interval(&Snapshot::default(), &Syms);
        }
        assert_eq!(p.stacks_held(), 0);
        let rows = p.rows(None);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].values[0], 100);
        assert!(rows[0].aged_out);
    }
}
