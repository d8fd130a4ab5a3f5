//! The snapshots and symbols tests build reports from (this module's and
//! other modules' tests): a symbolizer over a fixed table and a few
//! snapshots of known content.

use super::build::{build, BuildOptions};
use super::rows::{Report, RunInfo};
use crate::model::snapshot::{CgroupKey, CgroupSlot, Snapshot};
use crate::model::{AllocStats, CacheId, Hist, KmallocSlab, Owner, PageUse, SiteKey, Source};
use crate::symbolize::{Frame, Symbolize};

/// A symbolizer over a fixed table, for tests: (start, name), sorted.
pub struct FixtureSymbols(pub Vec<(u64, &'static str)>);

impl Symbolize for FixtureSymbols {
    fn symbolize(&self, addrs: &[u64]) -> Vec<Frame> {
        addrs
            .iter()
            .map(
                |&a| match self.0.iter().rev().find(|(start, _)| *start <= a) {
                    Some((start, name)) => Frame {
                        addr: a,
                        function: Some(name.to_string()),
                        offset: a - start,
                    },
                    None => Frame::unknown(a),
                },
            )
            .collect()
    }
}

/// `snap` built with the fixture symbols, stacks sampled 1 in `every`,
/// over `duration_s`.
pub fn report_of(snap: &Snapshot, every: u32, duration_s: f64) -> Report {
    build(
        snap,
        &fixture_symbols(),
        BuildOptions {
            stack_sample_every: every,
            duration_s,
            run: RunInfo {
                kernel: "6.18.0".into(),
                attach: vec!["kmalloc: tp_btf".into()],
                ..Default::default()
            },
        },
    )
}

pub fn fixture_symbols() -> FixtureSymbols {
    FixtureSymbols(vec![
        (0x1000, "bpf_prog_abc_kmalloc_btf"),
        (0x1100, "bpf_trace_run6"),
        (0x2000, "__kmalloc_noprof"),
        (0x2100, "__kvmalloc_node_noprof"),
        (0x3000, "load_msg"),
        (0x3100, "do_msgsnd"),
        (0x4000, "simple_xattr_alloc"),
        (0x4100, "vmemdup_user"),
        (0x4200, "setxattr_copy"),
        (0x5000, "__alloc_pages_noprof"),
        (0x5100, "do_anonymous_page"),
        (0x5200, "allocate_slab"),
    ])
}

pub fn stats(count: u64, req: u64, alloc: u64) -> AllocStats {
    let mut s = AllocStats {
        count,
        bytes_req: count * req,
        bytes_alloc: count * alloc,
        ..Default::default()
    };
    s.hist.0[Hist::bucket_of(req)] = count;
    s
}

pub const KMALLOC_CG_4K: CacheId = CacheId::Kmalloc {
    size: 4096,
    accounted: true,
    slab: KmallocSlab::SizeClass,
};

/// The two sites of the sample: load_msg, and kvmalloc's call site.
pub fn msg_and_kv() -> (SiteKey, SiteKey) {
    let site = |call_site| SiteKey {
        call_site,
        cache: KMALLOC_CG_4K,
    };
    (site(0x3010), site(0x2110))
}

pub fn sample_snapshot() -> Snapshot {
    let (msg, kv) = msg_and_kv();
    let mut snap = Snapshot::default();
    snap.sites.insert(msg.clone(), stats(1000, 2148, 4096));
    snap.sites.insert(kv.clone(), stats(300, 2100, 4096));
    // 1 in 10 sampled: 100 msg stacks, 20 + 10 for the kvmalloc site.
    snap.stacks.insert((msg, 1), stats(100, 2148, 4096));
    snap.stacks.insert((kv.clone(), 2), stats(20, 2100, 4096));
    snap.stacks.insert((kv, 3), stats(10, 2100, 4096));
    snap.stack_frames
        .insert(1, vec![0x1010, 0x1110, 0x2010, 0x3010, 0x3110]);
    snap.stack_frames
        .insert(2, vec![0x1010, 0x2010, 0x2110, 0x4010]);
    snap.stack_frames
        .insert(3, vec![0x1010, 0x2010, 0x2110, 0x4110, 0x4210]);
    snap.cache_frees.insert(KMALLOC_CG_4K, 700);
    snap.events.frees = 900;
    snap.events.stack_samples = 130;
    snap.events.lost_stack_collision = 2;
    snap
}

/// The sample snapshot of a `--source kmalloc,page` run: 50 order-0
/// pages faulted in by do_anonymous_page (40 freed), and 2 that back
/// new slabs (the page source's slab layer).
pub fn sources_snapshot() -> Snapshot {
    let mut snap = sample_snapshot();
    let page = |used_for| SiteKey {
        call_site: 0,
        cache: CacheId::Pages { order: 0, used_for },
    };
    let (anon, slab) = (page(PageUse::Direct), page(PageUse::Slab));
    snap.sites.insert(anon.clone(), stats(50, 4096, 4096));
    snap.sites.insert(slab.clone(), stats(2, 4096, 4096));
    snap.stacks.insert((anon, 4), stats(50, 4096, 4096));
    snap.stacks.insert((slab, 5), stats(2, 4096, 4096));
    snap.stack_frames.insert(4, vec![0x1010, 0x5010, 0x5110]);
    snap.stack_frames
        .insert(5, vec![0x1010, 0x5010, 0x5210, 0x2010]);
    snap.source_frees.insert(Source::Page, 40);
    snap
}

/// The sample snapshot as seen by kheap leaks: of the 1000 load_msg
/// allocations, 400 are live (40 of them with a sampled stack, 1.5 s
/// old); 20 kvmalloc objects are live (10 with stack 2, 10 with stack 3).
/// The messages are cgroup 42's (charged), the kvmalloc objects were
/// allocated in interrupt context (300 of them, not charged).
pub fn leak_snapshot(sample_every: u32) -> Snapshot {
    use crate::model::live::{LeakInput, LiveObject, Unseen};
    let mut snap = sample_snapshot();
    let (msg, kv) = msg_and_kv();
    let svc = CgroupKey {
        slot: CgroupSlot::Cgroup(42),
        accounted: true,
    };
    let irq = CgroupKey {
        slot: CgroupSlot::Interrupt,
        accounted: false,
    };
    let obj = |site: &SiteKey, stack: Option<i64>, req: u64, age_ms: u64| LiveObject {
        site: site.clone(),
        stack_id: stack,
        bytes_req: req,
        bytes_alloc: 4096,
        age_ns: age_ms * 1_000_000,
        tgid: 7,
        cgroup: if *site == msg { svc } else { irq },
        asked_cache: None,
    };
    let mut live = Vec::new();
    for i in 0..400 {
        live.push(obj(&msg, (i < 40).then_some(1), 2148, 1500));
    }
    for i in 0..20 {
        live.push(obj(&kv, Some(2 + (i % 2)), 2100, 10));
    }
    for (key, count) in [(svc, 1000), (irq, 300)] {
        snap.cgroups.insert(
            key,
            AllocStats {
                count,
                bytes_req: count * 2148,
                bytes_alloc: count * 4096,
                ..Default::default()
            },
        );
    }
    let mut leaks = LeakInput {
        live,
        sample_every,
        kind: "leaks".into(),
        max_objects: 1000,
        recursion_misses: vec![("kfree".into(), 3), ("kmalloc".into(), 0)],
        contexts_known: true,
        ..Default::default()
    };
    leaks.unseen.insert(
        kv,
        Unseen {
            count: 5,
            bytes_alloc: 5 * 4096,
        },
    );
    leaks.events.frees_untracked = 123;
    leaks.comms.insert(7, "msgd".into());
    leaks.events.frees_null = 9;
    snap.leaks = Some(leaks);
    // The total of the programs' misses listed in `leaks`.
    snap.events.recursion_misses = 3;
    snap
}

/// `leak_snapshot(1)` with a site of sk_prot_alloc allocating from a
/// cache SLUB merged UNIX and UNIX-STREAM into: 4 outstanding sockets, 3
/// known to be UNIX-STREAM's, 1 not known; and 2 from TCP's own cache.
pub fn merged_leak_snapshot() -> Snapshot {
    let mut snap = leak_snapshot(1);
    let merged = SiteKey {
        call_site: 0xffff_ffff_8100_7000,
        cache: CacheId::Named("signal_cache (merged: UNIX, UNIX-STREAM)".into()),
    };
    let tcp = SiteKey {
        cache: CacheId::Named("TCP".into()),
        ..merged.clone()
    };
    snap.sites
        .insert(merged.clone(), stats(6, 6 * 1152, 6 * 1152));
    snap.sites.insert(tcp.clone(), stats(2, 2 * 2432, 2 * 2432));
    let leaks = snap.leaks.as_mut().unwrap();
    let like = leaks.live[0].clone();
    for _ in 0..2 {
        leaks.live.push(crate::model::live::LiveObject {
            site: tcp.clone(),
            stack_id: None,
            bytes_req: 2432,
            bytes_alloc: 2432,
            ..like.clone()
        });
    }
    for i in 0..4 {
        leaks.live.push(crate::model::live::LiveObject {
            site: merged.clone(),
            stack_id: None,
            bytes_req: 1152,
            bytes_alloc: 1152,
            asked_cache: (i < 3).then(|| "UNIX-STREAM".to_string()),
            ..like.clone()
        });
    }
    snap
}

/// The load_msg stack (100 sampled allocations) as made by two
/// processes in two cgroups and by interrupt context: 60, 30 and 10.
pub fn owned_snapshot() -> Snapshot {
    let mut snap = sample_snapshot();
    let (msg, _) = msg_and_kv();
    let owners = [
        (
            Owner::Process {
                tgid: 7,
                cgroup: 42,
            },
            60,
        ),
        (
            Owner::Process {
                tgid: 8,
                cgroup: 43,
            },
            30,
        ),
        (Owner::Interrupt, 10),
    ];
    snap.stack_owners.insert(
        (msg, 1),
        owners
            .into_iter()
            .map(|(o, n)| (o, stats(n, 2148, 4096)))
            .collect(),
    );
    snap.comms.insert(7, "msgd".into());
    snap.comms.insert(8, "msgc".into());
    snap
}
