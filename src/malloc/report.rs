//! From the kernel's per-(process, function, caller, stack) counters to
//! symbolized per-site and per-stack rows. Pure: tested with fixtures.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::merge::{self, DepthAcc, Method, SampledStack};
use crate::cgroup::CgroupRef;
use crate::model::{AllocStats, Counts};
use crate::report::RunInfo;
use crate::symbolize::user::UserFrame;

use crate::model::malloc::{AllocatorCode, Key, Snapshot};

/// Blocks not freed by the end, flattened into rows and totals under the
/// names every kind uses.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Outstanding {
    #[serde(rename = "outstanding_count")]
    pub count: u64,
    #[serde(rename = "outstanding_bytes")]
    pub bytes: u64,
}

/// A process a row's calls came from.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Process {
    pub pid: u32,
    /// Its command name when last seen (empty if it was never seen alive).
    pub comm: String,
    /// Its cgroup v2 when last seen (null if it was never seen alive).
    #[serde(default)]
    pub cgroup: Option<CgroupRef>,
}

/// Malloc sees the sizes asked for, not what the allocator rounded them up
/// to: its rows carry `count`, `bytes_req`, `avg_size` and `hist`, and no
/// `bytes_alloc` or waste, which would only repeat `bytes_req` and 0.
mod request_counts {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::model::Bucket;
    use crate::model::Counts;

    #[derive(Serialize, Deserialize)]
    struct RequestCounts {
        count: u64,
        bytes_req: u64,
        avg_size: f64,
        hist: Vec<Bucket>,
    }

    pub fn serialize<S: Serializer>(c: &Counts, s: S) -> Result<S::Ok, S::Error> {
        RequestCounts {
            count: c.count,
            bytes_req: c.bytes_req,
            avg_size: c.avg_size,
            hist: c.hist.clone(),
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Counts, D::Error> {
        let r = RequestCounts::deserialize(d)?;
        Ok(Counts {
            count: r.count,
            bytes_req: r.bytes_req,
            bytes_alloc: r.bytes_req,
            avg_size: r.avg_size,
            hist: r.hist,
            ..Default::default()
        })
    }
}

/// One allocator function called from one place (a site: the direct caller)
/// or along one stack.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MallocRow {
    /// The allocator function: malloc, calloc, realloc…
    pub allocator: String,
    /// The function that called it.
    pub function: String,
    /// The call's return address: `function+0xoff (file:line)`.
    pub location: String,
    /// Stack rows: innermost (the direct caller) first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frames: Vec<String>,
    /// The same frames with their binaries and addresses, for pprof (not
    /// in JSON: `frames` carries them for people and scripts).
    #[serde(skip)]
    pub user_frames: Vec<UserFrame>,
    /// Processes the row's calls came from, by PID.
    pub processes: Vec<Process>,
    #[serde(flatten, with = "request_counts")]
    pub counts: Counts,
    /// With --outstanding: blocks from this row not freed by the end.
    #[serde(flatten)]
    pub outstanding: Option<Outstanding>,
    /// Stack rows: the counts are the site's calls attributed to this stack
    /// in proportion to the sampled calls unwound along it
    /// (`merge::Share::estimated`). Absent when exact.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MallocTotals {
    /// Calls counted: `count`, as in every row.
    #[serde(rename = "count")]
    pub allocs: u64,
    /// Bytes asked for.
    #[serde(rename = "bytes_req")]
    pub bytes: u64,
    /// Calls of free: counted only with --outstanding (without it free is
    /// not probed, which halves the cost per malloc+free pair).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frees: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frees_null: Option<u64>,
    pub failed_allocs: u64,
    /// Calls the allocator made to itself while serving a call (glibc's
    /// realloc calls malloc): counted once, as the outer call.
    #[serde(default)]
    pub nested_calls: u64,
    #[serde(flatten)]
    pub outstanding: Option<Outstanding>,
    /// Frees of blocks allocated before tracing began (--outstanding).
    #[serde(default)]
    pub frees_untracked: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MallocLost {
    /// Calls counted whose user stack could not be captured (rows show
    /// the direct caller only).
    pub stacks: u64,
    /// Events not aggregated because a map was full: the sum of the
    /// map_full_* fields, as in every kind.
    pub map_full: u64,
    /// Calls not counted because the per-site map was full.
    pub map_full_sites: u64,
    /// Blocks not tracked as outstanding (map full).
    pub map_full_live: u64,
    /// Calls not counted: the thread's state could not be allocated.
    pub no_thread_state: u64,
    /// Frames whose mapping could not be recorded (shown as addresses):
    /// the map was full, or the lookup found the address space busy.
    pub map_full_vmas: u64,
    pub vma_lookup_failed: u64,
    /// Sampled stack copies not sent: the ring buffer was full.
    #[serde(default)]
    pub unwind_dropped: u64,
    /// Sampled stacks that could not be read.
    #[serde(default)]
    pub unwind_copy_failed: u64,
    /// Sampled stacks not unwound: the process was gone before its
    /// mappings were read, and none were recorded.
    #[serde(default)]
    pub unwind_no_mappings: u64,
    /// Calls counted whose return address could not be read at the stack
    /// pointer: counted under a row named `[caller unreadable]`, never a
    /// guessed caller.
    #[serde(default)]
    pub caller_unreadable: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StackDepth {
    pub stacks: u64,
    /// Stacks of one or two frames: the frame-pointer walk stopped at code
    /// built without frame pointers, and no deeper stack was unwound.
    pub shallow: u64,
    /// Calls whose user stack was copied to be unwound from .eh_frame
    /// (sampled, and each row's first).
    #[serde(default)]
    pub unwind_samples: u64,
    /// Stacks shown as the frame-pointer walk found them.
    #[serde(default)]
    pub frame_pointer: UnwindDepth,
    /// Stacks shown as unwound from .eh_frame (deeper than the walk).
    #[serde(default)]
    pub dwarf: UnwindDepth,
}

/// How many distinct stacks one unwinding method gave, and how deep
/// (frames, the direct caller included).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UnwindDepth {
    pub stacks: u64,
    pub max_depth: u64,
    pub mean_depth: f64,
}

impl From<DepthAcc> for UnwindDepth {
    fn from(d: DepthAcc) -> Self {
        UnwindDepth {
            stacks: d.stacks,
            max_depth: d.max,
            mean_depth: d.mean(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MallocReport {
    pub duration_s: f64,
    pub run: RunInfo,
    /// Each probed library and the functions probed in it.
    pub probes: Vec<String>,
    pub totals: MallocTotals,
    pub lost: MallocLost,
    pub stack_depth: StackDepth,
    pub sites: Vec<MallocRow>,
    pub stacks: Vec<MallocRow>,
    /// What differs on this kernel (malloc's path for kernels before 5.17),
    /// in one line of the header; the counts do not, and JSON has none.
    #[serde(skip)]
    pub kernel_note: Option<String>,
}

pub struct BuildOptions {
    pub duration_s: f64,
    pub run: RunInfo,
    pub probes: Vec<String>,
    /// Row label of each attach cookie.
    pub func_names: Vec<String>,
    /// Calls from here are the allocator's own.
    pub allocator_code: Vec<AllocatorCode>,
    /// Command names of the traced processes, as last seen.
    pub comms: HashMap<u32, String>,
    /// Their cgroups, as last seen.
    pub cgroups: HashMap<u32, CgroupRef>,
}

/// The frames of a key: the direct caller, then the walked stack past the
/// allocator's own frame.
pub fn key_frames(key: &Key, stacks: &HashMap<i64, Vec<u64>>) -> Vec<u64> {
    let mut frames = vec![key.caller];
    if key.stack_id >= 0 {
        if let Some(s) = stacks.get(&key.stack_id) {
            frames.extend(s.iter().skip(1));
        }
    }
    frames
}

/// Every (address space, address) the report needs symbolized.
pub fn addresses(snap: &Snapshot) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = snap
        .sites
        .keys()
        .flat_map(|k| {
            key_frames(k, &snap.stacks)
                .into_iter()
                .map(move |a| (k.mm, a))
        })
        .collect();
    for (k, unwound) in &snap.unwound {
        for s in unwound {
            out.extend(s.frames.iter().map(|&a| (k.mm, a)));
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[derive(Default)]
struct Acc {
    stats: AllocStats,
    live: Option<Outstanding>,
    pids: Vec<u32>,
    first: Option<UserFrame>,
    frames: Vec<String>,
    user_frames: Vec<UserFrame>,
    estimated: bool,
}

impl Acc {
    fn add(&mut self, key: &Key, stats: &AllocStats, live: Option<(u64, u64)>, tracking: bool) {
        self.stats += *stats;
        if tracking {
            let o = self.live.get_or_insert_with(Outstanding::default);
            if let Some((c, b)) = live {
                o.count += c;
                o.bytes += b;
            }
        }
        if !self.pids.contains(&key.tgid) {
            self.pids.push(key.tgid);
            self.pids.sort_unstable();
        }
    }

    fn row(self, allocator: &str, comms: &HashMap<u32, String>) -> MallocRow {
        let first = self.first.unwrap_or_default();
        MallocRow {
            allocator: allocator.to_string(),
            function: first.name(),
            location: first.display(),
            frames: self.frames,
            user_frames: self.user_frames,
            processes: self
                .pids
                .iter()
                .map(|&pid| Process {
                    pid,
                    comm: comms.get(&pid).cloned().unwrap_or_default(),
                    cgroup: None,
                })
                .collect(),
            counts: (&self.stats).into(),
            outstanding: self.live,
            estimated: self.estimated,
        }
    }
}

/// Builds the report. Rows of different processes running the same code
/// merge: they are keyed by their symbolized frames, not raw addresses.
pub fn build(
    snap: &Snapshot,
    frames: &HashMap<(u64, u64), UserFrame>,
    opts: BuildOptions,
) -> MallocReport {
    let tracking = snap.live.is_some();
    let name_of = |func: u32| {
        opts.func_names
            .get(func as usize)
            .cloned()
            .unwrap_or_else(|| format!("function#{func}"))
    };
    let frame = |mm: u64, a: u64| {
        frames.get(&(mm, a)).cloned().unwrap_or(UserFrame {
            addr: a,
            ..Default::default()
        })
    };
    let mut sites: HashMap<(u32, String), Acc> = HashMap::new();
    let mut stacks: HashMap<(u32, Vec<String>), Acc> = HashMap::new();
    let mut total = AllocStats::default();
    let mut depth = StackDepth::default();
    let (mut by_fp, mut by_dwarf) = (DepthAcc::default(), DepthAcc::default());
    let mut seen_stacks: std::collections::HashSet<(u64, Vec<u64>)> = Default::default();
    let mut nested = snap.events.nested;
    for (key, stats) in &snap.sites {
        let live = snap.live.as_ref().and_then(|l| l.get(key).copied());
        let addrs = key_frames(key, &snap.stacks);
        let user = walked_frames(addrs.iter().map(|&a| frame(key.mm, a)).collect());
        if opts.allocator_code.iter().any(|c| c.contains(&user[0])) {
            nested += stats.count;
            continue;
        }
        total += *stats;
        let site = sites.entry((key.func, user[0].display())).or_default();
        site.add(key, stats, live, tracking);
        site.first.get_or_insert_with(|| user[0].clone());

        let sampled = sampled_stacks(key, snap, &frame);
        let walked = (user.clone(), addrs[..user.len()].to_vec());
        for share in merge::shares(walked, sampled, stats, live) {
            let counted = key.stack_id >= 0 || share.method == Method::Dwarf;
            if counted && seen_stacks.insert((key.mm, share.addrs.clone())) {
                depth.stacks += 1;
                if share.frames.len() <= 2 {
                    depth.shallow += 1;
                }
                match share.method {
                    Method::FramePointer => by_fp.add(share.frames.len()),
                    Method::Dwarf => by_dwarf.add(share.frames.len()),
                }
            }
            let shown: Vec<String> = share.frames.iter().map(UserFrame::display).collect();
            let stack = stacks.entry((key.func, shown.clone())).or_default();
            stack.add(key, &share.stats, share.live, tracking);
            stack.estimated |= share.estimated;
            stack.first.get_or_insert_with(|| user[0].clone());
            if stack.frames.is_empty() {
                stack.frames = shown;
                stack.user_frames = share.frames;
            }
        }
    }
    depth.unwind_samples = snap.unwind.sampled;
    depth.frame_pointer = by_fp.into();
    depth.dwarf = by_dwarf.into();
    let live_total = snap.live.as_ref().map(|l| {
        l.values()
            .fold(Outstanding::default(), |o, &(c, b)| Outstanding {
                count: o.count + c,
                bytes: o.bytes + b,
            })
    });
    let ev = &snap.events;
    MallocReport {
        duration_s: (opts.duration_s * 100.0).round() / 100.0,
        run: opts.run,
        probes: opts.probes,
        totals: MallocTotals {
            allocs: total.count,
            bytes: total.bytes_req,
            frees: tracking.then_some(ev.frees),
            frees_null: tracking.then_some(ev.frees_null),
            failed_allocs: ev.failed,
            nested_calls: nested,
            outstanding: live_total,
            frees_untracked: ev.frees_untracked,
        },
        lost: MallocLost {
            stacks: ev.lost_stacks,
            map_full: ev.map_full_sites + ev.map_full_live + ev.map_full_vmas,
            map_full_sites: ev.map_full_sites,
            map_full_live: ev.map_full_live,
            no_thread_state: ev.no_thread_state,
            map_full_vmas: ev.map_full_vmas,
            vma_lookup_failed: ev.vma_lookup_failed,
            unwind_dropped: snap.unwind.dropped,
            unwind_copy_failed: snap.unwind.copy_failed,
            unwind_no_mappings: snap.unwind.no_mappings,
            caller_unreadable: ev.caller_unreadable,
        },
        stack_depth: depth,
        sites: with_cgroups(rows(sites, &name_of, &opts.comms), &opts.cgroups),
        stacks: with_cgroups(rows(stacks, &name_of, &opts.comms), &opts.cgroups),
        kernel_note: None,
    }
}

/// Names the cgroup of every process of the rows.
fn with_cgroups(mut rows: Vec<MallocRow>, cgroups: &HashMap<u32, CgroupRef>) -> Vec<MallocRow> {
    for p in rows.iter_mut().flat_map(|r| &mut r.processes) {
        p.cgroup = cgroups.get(&p.pid).cloned();
    }
    rows
}

/// The stacks unwound for a key's sampled calls, symbolized and cut like
/// walked ones.
fn sampled_stacks(
    key: &Key,
    snap: &Snapshot,
    frame: &dyn Fn(u64, u64) -> UserFrame,
) -> Vec<SampledStack> {
    let Some(unwound) = snap.unwound.get(key) else {
        return Vec::new();
    };
    unwound
        .iter()
        .map(|u| {
            let frames = walked_frames(u.frames.iter().map(|&a| frame(key.mm, a)).collect());
            SampledStack {
                addrs: u.frames[..frames.len()].to_vec(),
                frames,
                samples: u.samples,
                bytes: u.bytes,
            }
        })
        .collect()
}

/// The frames of a stack worth showing: the direct caller (read from the
/// stack pointer, always real), then walked frames up to the first one that
/// is in no mapped file. A frame-pointer walk through code built without
/// frame pointers wanders into data, and what follows is garbage.
pub fn walked_frames(mut frames: Vec<UserFrame>) -> Vec<UserFrame> {
    let keep = 1 + frames
        .iter()
        .skip(1)
        .take_while(|f| f.module.is_some())
        .count();
    frames.truncate(keep);
    frames
}

/// Rows of one grouping, heaviest first (by bytes, then location).
fn rows<K>(
    groups: HashMap<(u32, K), Acc>,
    name_of: &dyn Fn(u32) -> String,
    comms: &HashMap<u32, String>,
) -> Vec<MallocRow> {
    let mut v: Vec<MallocRow> = groups
        .into_iter()
        .map(|((func, _), acc)| acc.row(&name_of(func), comms))
        .collect();
    v.sort_by(|a, b| {
        b.counts
            .bytes_req
            .cmp(&a.counts.bytes_req)
            .then_with(|| a.location.cmp(&b.location))
    });
    v
}

#[cfg(test)]
pub mod tests;
