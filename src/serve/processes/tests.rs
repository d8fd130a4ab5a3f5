use super::*;

fn stats(count: u64) -> AllocStats {
    AllocStats {
        count,
        bytes_req: count * 100,
        bytes_alloc: count * 128,
        ..AllocStats::default()
    }
}

fn v(pid: &str, comm: &str) -> LabelValues {
    vec![pid.to_string(), comm.to_string()]
}

#[test]
fn a_process_is_named_by_its_name_now_or_else_the_kernels_record() {
    let mut names = ProcessNames::new();
    let delta = HashMap::from([
        (Some(10), ("bash".to_string(), stats(3))),
        (Some(11), ("bash".to_string(), stats(2))),
        (None, (String::new(), stats(1))),
    ]);
    // 10 has exec'd into "ls" since its first allocation; 11 has exited.
    let now = |pid: u32| (pid == 10).then(|| ("ls".to_string(), 500));
    let got = names.by_values(&delta, &now);
    assert_eq!(got.len(), 3);
    assert_eq!(got[&v("10", "ls")].count, 3);
    assert_eq!(got[&v("11", "bash")].count, 2);
    assert_eq!(got[&v("", INTERRUPT)].count, 1);
    // The name is given once: a later rename does not split the series.
    let later = |pid: u32| (pid == 10).then(|| ("renamed".to_string(), 500));
    let got = names.by_values(
        &HashMap::from([(Some(10), ("bash".into(), stats(4)))]),
        &later,
    );
    assert_eq!(got[&v("10", "ls")].count, 4);
}

#[test]
fn exited_and_reused_pids_end_their_series_and_the_rest_stay() {
    let mut names = ProcessNames::new();
    let mut series = Ranked::new(10);
    let delta = HashMap::from([
        (Some(10), ("a".to_string(), stats(3))),
        (Some(11), ("b".to_string(), stats(2))),
        (Some(12), ("c".to_string(), stats(5))),
        (Some(13), ("kworker/0:1-events".to_string(), stats(1))),
        (None, (String::new(), stats(1))),
    ]);
    let start = |pid: u32| u64::from(pid) * 100;
    let all = |pid: u32| Some((format!("p{pid}"), start(pid)));
    series.add_interval(names.by_values(&delta, &all));
    assert_eq!(series.remembered(), 5);
    assert_eq!(names.retire_exited(&mut series, &|pid| Some(start(pid))), 0);
    // 11 exited; 12's pid now belongs to a process started later; 13 runs
    // on (its name may have changed: a kworker's does, it is not looked at).
    let now = |pid: u32| match pid {
        10 | 13 => Some(start(pid)),
        12 => Some(99_999),
        _ => None,
    };
    assert_eq!(names.retire_exited(&mut series, &now), 2);
    assert_eq!(names.len(), 2);
    let exported: Vec<LabelValues> = series.series(2).into_iter().map(|(v, _)| v).collect();
    assert_eq!(
        exported,
        vec![
            v("", INTERRUPT),
            v("10", "p10"),
            v("13", "p13"),
            v("other", "other")
        ]
    );
    // The interrupt row is never retired.
    assert!(series.is_member(&v("", INTERRUPT)));
}

#[test]
fn a_process_first_seen_after_its_exit_ends_at_the_next_read() {
    let mut names = ProcessNames::new();
    let mut series = Ranked::new(10);
    let delta = HashMap::from([(Some(20), ("short".to_string(), stats(4)))]);
    series.add_interval(names.by_values(&delta, &|_| None));
    assert_eq!(series.series(2)[0].0, v("20", "short"));
    // Even if another process has its pid by now.
    assert_eq!(names.retire_exited(&mut series, &|_| Some(1)), 1);
    assert!(names.is_empty());
    assert_eq!(series.series(2).len(), 1);
}

#[test]
fn beyond_n_processes_go_to_other() {
    let mut names = ProcessNames::new();
    let mut series = Ranked::new(2);
    let delta: HashMap<Option<u32>, (String, AllocStats)> = (1..=5)
        .map(|pid| (Some(pid), (format!("p{pid}"), stats(u64::from(pid)))))
        .collect();
    series.add_interval(names.by_values(&delta, &|_| None));
    let rows = series.series(2);
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0].0, v("4", "p4"));
    assert_eq!(rows[1].0, v("5", "p5"));
    assert_eq!(rows[2].0, v("other", "other"));
    assert_eq!(rows[2].1.allocations, 1 + 2 + 3);
}

#[test]
fn outstanding_rows_keep_the_n_biggest_holders_and_sum_the_rest() {
    let o = |objects, bytes_alloc| Outstanding {
        objects,
        bytes_alloc,
    };
    let by = HashMap::from([
        (Some(10), o(1, 100)),
        (Some(11), o(2, 300)),
        (Some(12), o(5, 50)),
        (None, o(3, 200)),
    ]);
    let name = |pid: u32| {
        if pid == 11 {
            "b".to_string()
        } else {
            String::new()
        }
    };
    let rows = outstanding_rows(&by, 2, &name);
    assert_eq!(
        rows,
        vec![
            (v("", INTERRUPT), o(3, 200)),
            (v("11", "b"), o(2, 300)),
            (v("other", "other"), o(6, 150)),
        ]
    );
    // Nothing outstanding: only other, at zero.
    assert_eq!(
        outstanding_rows(&HashMap::new(), 2, &name),
        vec![(v("other", "other"), o(0, 0))]
    );
}
