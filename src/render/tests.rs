use super::*;
use crate::report::fixtures::{report_of, sample_snapshot, sources_snapshot};
use crate::testing::assert_line;

fn report() -> Report {
    report_of(&sample_snapshot(), 10, 2.0)
}

#[test]
fn folded_stacks_of_several_sources_stand_on_a_root_per_source() {
    let f = folded(&report_of(&sources_snapshot(), 10, 2.0));
    assert_line(&f, "[page];do_anonymous_page;__alloc_pages_noprof 50");
    assert_line(
        &f,
        "[page];__kmalloc_noprof;allocate_slab;__alloc_pages_noprof 2",
    );
    assert_line(&f, "[kmalloc];do_msgsnd;load_msg;__kmalloc_noprof 1000");
    let samples = flame_samples(&report_of(&sources_snapshot(), 10, 2.0));
    assert!(samples.iter().all(|s| s.frames[0].starts_with('[')));
}

#[test]
fn folded_lines_are_callers_first() {
    let f = folded(&report());
    assert_line(&f, "do_msgsnd;load_msg;__kmalloc_noprof 1000");
}

#[test]
fn folded_frames_cannot_add_frames_or_stacks() {
    assert_eq!(folded_frame("do_msgsnd"), "do_msgsnd");
    assert_eq!(
        folded_frame("evil;fake_frame\nfake_stack 99\\"),
        "evil\\x3bfake_frame\\x0afake_stack 99\\x5c"
    );
    let stack = folded_stack(&["main", "a;b", "c\nd 5"]);
    assert_eq!(stack, "main;a\\x3bb;c\\x0ad 5");
    assert_eq!(stack.split(';').count(), 3);
    assert_eq!(stack.lines().count(), 1);
}
