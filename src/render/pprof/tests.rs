use super::test_support::{decode_gzip, label_values};
use super::*;
use crate::report::fixtures::{owned_snapshot, report_of, sample_snapshot};

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
    let d = Diff {
        compared: crate::contract::Kind::Leaks,
        by: DiffBy::Stack,
        measure: Measure::Outstanding,
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
    let p = decode(&from_diff(&d));
    assert_valid(&p);
    let s = |i: i64| p.string_table[i as usize].as_str();
    assert_eq!(s(p.sample_type[0].r#type), "inuse_objects");
    assert_eq!(p.sample[1].value, vec![-1, -128]);
    assert_eq!(p.sample[0].location_id.len(), 2);
    assert!(s(p.comment[0]).contains("after minus before"));
}
