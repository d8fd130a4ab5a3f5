use super::test_support::{decode_gzip, label_values};
use super::*;
use crate::report::fixtures::{
    leak_snapshot, msg_and_kv, owned_snapshot, report_of, sample_snapshot, stats, KMALLOC_CG_4K,
};

fn decode(b: &Builder) -> proto::Profile {
    decode_gzip(&b.encode_gzip())
}

/// What pprof's CheckValid demands: string 0 empty, non-zero unique
/// ids, every sample with one value per type, every location with a
/// known mapping, every line with a known function.
fn assert_valid(p: &proto::Profile) {
    assert_eq!(p.string_table[0], "");
    let s = |i: i64| &p.string_table[i as usize];
    for (i, m) in p.mapping.iter().enumerate() {
        assert_eq!(m.id, i as u64 + 1);
    }
    for (i, f) in p.function.iter().enumerate() {
        assert_eq!(f.id, i as u64 + 1);
    }
    for (i, l) in p.location.iter().enumerate() {
        assert_eq!(l.id, i as u64 + 1);
        assert!(l.mapping_id >= 1 && l.mapping_id as usize <= p.mapping.len());
        for line in &l.line {
            assert!(line.function_id >= 1 && line.function_id as usize <= p.function.len());
        }
    }
    for smp in &p.sample {
        assert_eq!(smp.value.len(), p.sample_type.len());
        for &id in &smp.location_id {
            assert!(id >= 1 && id as usize <= p.location.len());
        }
    }
    assert!(p
        .sample_type
        .iter()
        .any(|t| s(t.r#type) == s(p.default_sample_type)));
}

#[test]
fn builder_interns_and_round_trips() {
    let mut b = Builder::new(
        &[SampleType::AllocObjects, SampleType::AllocSpace],
        SampleType::AllocSpace,
        1_000_000_000,
    );
    let f = Frame::kernel("load_msg+0x10");
    assert_eq!((f.function.as_str(), f.address), ("load_msg", 0x10));
    let user = Frame {
        function: "main".into(),
        mapping: "/usr/bin/app".into(),
        address: 0x1234,
        file: Some("app.c".into()),
        line: Some(42),
    };
    for _ in 0..2 {
        b.add(&Sample {
            frames: vec![f.clone(), user.clone()],
            values: vec![3, 300],
            labels: vec![
                Label::Str("cache".into(), "kmalloc-128".into()),
                Label::Num("pid".into(), 7, None),
            ],
        });
    }
    b.comment("hello");
    let p = decode(&b);
    assert_valid(&p);
    assert_eq!(p.sample.len(), 2);
    assert_eq!(
        (p.location.len(), p.function.len(), p.mapping.len()),
        (2, 2, 2)
    );
    let s = |i: i64| p.string_table[i as usize].as_str();
    assert_eq!(s(p.default_sample_type), "alloc_space");
    assert_eq!(s(p.period_type.as_ref().unwrap().r#type), "space");
    assert_eq!(s(p.mapping[0].filename), KERNEL_MAPPING);
    assert!(p.mapping[1].has_line_numbers && !p.mapping[0].has_line_numbers);
    assert_eq!(p.location[1].line[0].line, 42);
    assert_eq!(s(p.comment[0]), "hello");
    assert_eq!(p.sample[0].value, vec![3, 300]);
}

#[test]
fn samples_beyond_the_slab_are_labelled_with_their_source() {
    let label_values = |r: &Report| label_values(&decode(&from_report(r)), "source");
    let plain = label_values(&report_of(&sample_snapshot(), 10, 2.0));
    assert!(plain.iter().all(|(l, _)| l.is_none()), "{plain:?}");
    let mixed = label_values(&report_of(
        &crate::report::fixtures::sources_snapshot(),
        10,
        2.0,
    ));
    let count = |source: &str| -> i64 {
        mixed
            .iter()
            .filter(|(l, _)| l.as_deref() == Some(source))
            .map(|(_, n)| n)
            .sum()
    };
    assert_eq!((count("page"), count("kmalloc")), (52, 1300), "{mixed:?}");
    assert!(mixed.iter().all(|(l, _)| l.is_some()));
}

#[test]
fn report_stacks_become_samples_with_exact_totals() {
    let r = report_of(&sample_snapshot(), 10, 2.0);
    let p = decode(&from_report(&r));
    assert_valid(&p);
    assert_eq!(p.sample.len(), r.stacks.len());
    let total: i64 = p.sample.iter().map(|s| s.value[1]).sum();
    let want: u64 = r.stacks.iter().map(|s| s.counts.bytes_alloc).sum();
    assert_eq!(total, want as i64);
    let s = |i: i64| p.string_table[i as usize].as_str();
    assert!(p.comment.iter().any(|&c| s(c).contains("estimates")));
    assert!(p
        .sample
        .iter()
        .all(|smp| smp.label.iter().any(|l| s(l.key) == "cache")));
}

/// The profile's total of each sample type, and the one-frame samples of
/// `function` (the site-only samples) with their labels.
fn totals_and_site_samples(p: &proto::Profile, function: &str) -> (Vec<i64>, Vec<Vec<i64>>) {
    let s = |i: i64| p.string_table[i as usize].as_str();
    let mut totals = vec![0; p.sample_type.len()];
    let mut site_only = Vec::new();
    for smp in &p.sample {
        totals.iter_mut().zip(&smp.value).for_each(|(t, v)| *t += v);
        let loc = &p.location[smp.location_id[0] as usize - 1];
        let f = &p.function[loc.line[0].function_id as usize - 1];
        if smp.location_id.len() == 1 && s(f.name) == function {
            site_only.push(smp.value.clone());
        }
    }
    (totals, site_only)
}

#[test]
fn every_site_is_in_the_profile_with_its_exact_totals() {
    // A short leaks run: a third site, 7 objects of do_msgsnd+0x20 still
    // live, none of them with a sampled stack. And of the load_msg
    // site's 1000 allocations only 100 were sampled.
    let mut snap = leak_snapshot(1);
    let quiet = crate::model::SiteKey {
        call_site: 0x3120,
        cache: KMALLOC_CG_4K,
    };
    snap.sites.insert(quiet.clone(), stats(9, 1000, 4096));
    let leaks = snap.leaks.as_mut().unwrap();
    let like = leaks.live[0].clone();
    for _ in 0..7 {
        leaks.live.push(crate::model::live::LiveObject {
            site: quiet.clone(),
            stack_id: None,
            bytes_req: 1000,
            ..like.clone()
        });
    }
    let r = report_of(&snap, 10, 8.0);
    let quiet_row = r
        .sites
        .iter()
        .find(|s| s.location == "do_msgsnd+0x20")
        .unwrap();
    let ret = quiet_row.retention.as_ref().unwrap();
    assert_eq!(
        (ret.outstanding_count, ret.outstanding_bytes),
        (7, 7 * 4096)
    );
    assert!(r
        .stacks
        .iter()
        .all(|s| !s.frames.iter().any(|f| f == "do_msgsnd+0x20")));

    let p = decode(&from_report(&r));
    assert_valid(&p);
    let s = |i: i64| p.string_table[i as usize].as_str();
    let types: Vec<&str> = p.sample_type.iter().map(|t| s(t.r#type)).collect();
    assert_eq!(
        types,
        [
            "alloc_objects",
            "alloc_space",
            "inuse_objects",
            "inuse_space"
        ]
    );
    // The profile adds up to the exact rows: every site's allocations and
    // what is outstanding, as the JSON's summary has it.
    let sum = |f: &dyn Fn(&crate::report::SiteRow) -> u64| -> i64 {
        r.sites.iter().map(|s| f(s) as i64).sum()
    };
    let l = &r.leaks.as_ref().unwrap().retention;
    let (totals, quiet_samples) = totals_and_site_samples(&p, "do_msgsnd");
    assert_eq!(
        totals,
        vec![
            sum(&|s| s.counts.count),
            sum(&|s| s.counts.bytes_alloc),
            l.outstanding_count as i64,
            l.outstanding_bytes as i64,
        ]
    );
    assert_eq!(totals, vec![1309, 1309 * 4096, 427, 427 * 4096]);
    // The unsampled site is one sample of its own frame, with its exact
    // numbers, labelled as such.
    assert_eq!(quiet_samples, vec![vec![9, 9 * 4096, 7, 7 * 4096]]);
    let labelled: Vec<&proto::Sample> = p
        .sample
        .iter()
        .filter(|smp| {
            smp.label
                .iter()
                .any(|l| s(l.key) == "unsampled" && s(l.str) == "true")
        })
        .collect();
    assert_eq!(labelled.len(), 1);
    assert!(p.comment.iter().any(|&c| s(c).contains("unsampled=true")));

    // Read back from JSON, a stack's site is not known: the stacks alone,
    // as before, rather than sites counted twice.
    let back: crate::report::Report =
        serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    let p = decode(&from_report(&back));
    assert_eq!(p.sample.len(), r.stacks.len());
}

#[test]
fn stacks_scaled_past_their_site_are_trimmed_not_negative() {
    // 11 kvmalloc allocations, one sampled on each of its two stacks: each
    // scales to 5.5, rounded to 6, 12 in all.
    let mut snap = sample_snapshot();
    let (_, kv) = msg_and_kv();
    snap.sites.insert(kv.clone(), stats(11, 2100, 4096));
    snap.stacks.insert((kv.clone(), 2), stats(1, 2100, 4096));
    snap.stacks.insert((kv, 3), stats(1, 2100, 4096));
    let r = report_of(&snap, 10, 1.0);
    let kv_stacks: Vec<u64> = r
        .stacks
        .iter()
        .filter(|s| s.function != "load_msg")
        .map(|s| s.counts.count)
        .collect();
    assert_eq!(kv_stacks, [6, 6], "the JSON's scaled stacks");
    let p = decode(&from_report(&r));
    assert_valid(&p);
    assert!(p.sample.iter().all(|s| s.value.iter().all(|&v| v >= 0)));
    let (totals, _) = totals_and_site_samples(&p, "");
    assert_eq!(totals, vec![1011, 1011 * 4096]);
}

#[test]
fn kernel_stacks_have_one_sample_per_process_with_labels() {
    let r = report_of(&owned_snapshot(), 10, 2.0);
    let p = decode(&from_report(&r));
    assert_valid(&p);
    let s = |i: i64| p.string_table[i as usize].as_str();
    // load_msg's stack thrice (two processes, interrupt context), the
    // two others once each.
    assert_eq!(p.sample.len(), r.stacks.len() + 2);
    let label = |smp: &proto::Sample, key: &str| {
        smp.label.iter().find(|l| s(l.key) == key).map(|l| {
            if l.str != 0 {
                s(l.str).to_string()
            } else {
                l.num.to_string()
            }
        })
    };
    let mut by_process: Vec<_> = p
        .sample
        .iter()
        .filter_map(|smp| {
            Some((
                label(smp, "process")?,
                label(smp, "pid"),
                label(smp, "cgroup"),
                smp.value[0],
            ))
        })
        .collect();
    by_process.sort();
    assert_eq!(
        by_process,
        [
            ("interrupt".to_string(), None, None, 100),
            (
                "msgc [8]".into(),
                Some("8".into()),
                Some("cgroup id 43".into()),
                300
            ),
            (
                "msgd [7]".into(),
                Some("7".into()),
                Some("cgroup id 42".into()),
                600
            ),
        ]
    );
    // The profile still adds up to the stacks.
    let total: i64 = p.sample.iter().map(|s| s.value[1]).sum();
    let want: u64 = r.stacks.iter().map(|s| s.counts.bytes_alloc).sum();
    assert_eq!(total, want as i64);
}

#[test]
fn diff_values_are_signed_changes() {
    let d = crate::diff::Diff {
        compared: crate::contract::Kind::Leaks,
        by: crate::diff::DiffBy::Stack,
        measure: crate::diff::Measure::Outstanding,
        grew_bytes: 4096,
        shrank_bytes: 128,
        net_bytes: 3968,
        rows: vec![
            crate::diff::DiffRow {
                name: "__kmalloc+0x1;load_msg+0x41".into(),
                caches: vec!["kmalloc-4k".into()],
                change_count: 1,
                change_bytes: 4096,
                ..Default::default()
            },
            crate::diff::DiffRow {
                name: "kmem_cache_alloc+0x2;newque+0x10".into(),
                caches: vec!["kmalloc-128".into()],
                change_count: -1,
                change_bytes: -128,
                ..Default::default()
            },
        ],
    };
    let p = decode(&crate::diff::pprof(&d));
    assert_valid(&p);
    let s = |i: i64| p.string_table[i as usize].as_str();
    assert_eq!(s(p.sample_type[0].r#type), "inuse_objects");
    assert_eq!(p.sample[1].value, vec![-1, -128]);
    assert_eq!(p.sample[0].location_id.len(), 2);
    assert!(s(p.comment[0]).contains("after minus before"));
}
