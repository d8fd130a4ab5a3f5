//! Helpers shared by the unit tests (test builds only).

use crate::model::{AllocStats, CacheId, KmallocSlab};

/// Fails, showing the whole text, unless every needle is in it.
#[track_caller]
pub fn assert_contains(text: &str, needles: &[&str]) {
    let missing: Vec<&&str> = needles.iter().filter(|n| !text.contains(**n)).collect();
    assert!(missing.is_empty(), "missing {missing:?} in:\n{text}");
}

/// Fails, showing the whole text, unless one of its lines is `line`.
#[track_caller]
pub fn assert_line(text: &str, line: &str) {
    assert!(
        text.lines().any(|l| l == line),
        "no line {line:?} in:\n{text}"
    );
}

/// Fails, naming what is missing, unless the JSON object `v` (called
/// `what`) has every one of `keys`.
#[track_caller]
pub fn assert_keys(v: &serde_json::Value, what: &str, keys: &[&str]) {
    let missing: Vec<&&str> = keys.iter().filter(|k| v.get(**k).is_none()).collect();
    assert!(missing.is_empty(), "{what} lacks {missing:?}: {v}");
}

/// Counters without a histogram.
pub fn stats(count: u64, bytes_req: u64, bytes_alloc: u64) -> AllocStats {
    AllocStats {
        count,
        bytes_req,
        bytes_alloc,
        ..Default::default()
    }
}

/// The unaccounted kmalloc cache of this size.
pub fn kmalloc(size: u64) -> CacheId {
    CacheId::Kmalloc {
        size,
        accounted: false,
        slab: KmallocSlab::SizeClass,
    }
}
