//! `kheap top`'s full-screen layout at 80x24 and 200x50, in tmux. Apart
//! from tests/kernel_dependent/top.rs because it checks the layout, which does not depend on
//! the kernel, and runs on the host only (.ci/run): in a qemu TCG guest the
//! header lines grow (slower BPF programs, longer numbers) and wrap at 80
//! columns, pushing rows off a 24-line screen — a layout gap to close (the
//! header lines should be fitted like the key line), not a kernel one.

use crate::common;

use std::process::{Child, Command, Stdio};

use common::tmux::Tmux;
use common::*;

/// kheap-load writing 20000 times a second (one kmalloc each) for SECS;
/// killed when dropped.
struct WritevLoop(Child);

impl WritevLoop {
    fn start(secs: u32) -> WritevLoop {
        let child = Command::new(LOAD)
            .args(["writev-rate", "20000", &secs.to_string()])
            .stdout(Stdio::null())
            .spawn()
            .expect("starting kheap-load");
        WritevLoop(child)
    }
}

impl Drop for WritevLoop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether a screen shows the table header of a view, starting with its
/// key column, and a real row under it.
fn shows_view(screen: &str, key: &str, row: &str) -> bool {
    let mut lines = screen
        .lines()
        .skip_while(|l| !(l.starts_with(&format!("{key} ")) && l.contains("alloc")));
    lines.next().is_some() && lines.any(|l| l.starts_with(row))
}

#[test]
fn every_view_keeps_its_key_column_at_80x24_and_200x50() {
    require_root();
    let load = WritevLoop::start(60);
    let pid = load.0.id().to_string();
    for (w, h) in [(80, 24), (200, 50)] {
        let tmux = Tmux::start_sized(&format!("views{w}"), w, h);
        assert_eq!(
            tmux.query("#{window_width}x#{window_height}"),
            format!("{w}x{h}")
        );
        tmux.send(&[
            &format!("{KHEAP} top -i 0.5 --by process -p {pid}"),
            "Enter",
        ]);
        tmux.wait_for("the process view", |s| shows_view(s, "pid", &pid));
        let views = [
            ("1", "site", "iovec_from_user"),
            ("2", "stack", "iovec_from_user"),
            ("3", "cache", "kmalloc-192"),
            ("4", "pid", pid.as_str()),
        ];
        for (k, key, row) in views {
            tmux.send(&[k]);
            let s = tmux.wait_for(&format!("{w}x{h}: the {key} view"), |s| {
                shows_view(s, key, row)
            });
            // The key line fits: its last key is whole.
            let keys = s.lines().rev().find(|l| !l.trim().is_empty()).unwrap();
            assert!(keys.trim_end().ends_with("? help"), "{w}x{h}: {s}");
            assert!(s.lines().all(|l| l.chars().count() <= w as usize));
        }
        tmux.send(&["?"]);
        tmux.wait_for("the help overlay", |s| {
            s.contains("kheap top: keys") && s.contains("any key closes this help")
        });
        tmux.send(&["x"]);
        tmux.wait_for("the help closed", |s| {
            !s.contains("kheap top: keys") && shows_view(s, "pid", &pid)
        });
        tmux.send(&["h"]);
        tmux.wait_for("the help overlay on h", |s| s.contains("kheap top: keys"));
        tmux.send(&["q"]);
        tmux.wait_for("the help closed by q", |s| !s.contains("kheap top: keys"));
        tmux.send(&["q"]);
        tmux.wait_for("the shell prompt", |s| !s.contains("kheap top  20"));
        tmux.assert_terminal_restored();
    }
}
