//! The C malloc workload (tests/data/malloc_workload.c), built with the
//! system compiler for the tests that trace it.

use std::path::PathBuf;
use std::process::Command;

pub const MALLOC_SOURCE: &str = include_str!("../data/malloc_workload.c");

/// The workload, compiled into a temporary directory (removed on drop).
pub struct Workload {
    pub dir: tempfile::TempDir,
    pub exe: PathBuf,
}

impl Workload {
    /// Builds it with frame pointers and debug information (function names
    /// and lines), plus `extra` compiler arguments.
    pub fn build(extra: &[&str]) -> Workload {
        Self::build_from(MALLOC_SOURCE, extra)
    }

    /// The same for another C source.
    pub fn build_from(source: &str, extra: &[&str]) -> Workload {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("malloc_workload.c");
        std::fs::write(&src, source).unwrap();
        let exe = dir.path().join("workload");
        let out = Command::new("cc")
            .args(["-O1", "-g", "-fno-omit-frame-pointer", "-fno-inline", "-o"])
            .arg(&exe)
            .arg(&src)
            .args(extra)
            .output()
            .expect("cc is needed by the tests (scripts/setup installs it)");
        assert!(
            out.status.success(),
            "building the workload failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Workload { dir, exe }
    }

    pub fn path(&self) -> &str {
        self.exe.to_str().unwrap()
    }
}

/// The line of the workload's source that contains `text` (1-based).
pub fn line_of(text: &str) -> usize {
    MALLOC_SOURCE
        .lines()
        .position(|l| l.contains(text))
        .unwrap_or_else(|| panic!("'{text}' not in the workload source"))
        + 1
}
