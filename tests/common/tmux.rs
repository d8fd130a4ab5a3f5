//! A private tmux server for tests that drive kheap through a real
//! terminal (top's full-screen view, the status line of record, leaks and
//! malloc).

use std::process::{Command, Stdio};
use std::time::Duration;

/// A private tmux server with one window (200x50 unless said otherwise)
/// running a plain shell;
/// killed when dropped.
pub struct Tmux {
    socket: String,
}

impl Tmux {
    pub fn start(test: &str) -> Tmux {
        Tmux::start_sized(test, 200, 50)
    }
    /// The same with a window of `width` x `height`.
    pub fn start_sized(test: &str, width: u16, height: u16) -> Tmux {
        let (w, h) = (width.to_string(), height.to_string());
        let t = Tmux {
            socket: format!("kheap-{test}-{}", std::process::id()),
        };
        let st = t
            .cmd(&[
                "new-session",
                "-d",
                "-x",
                &w,
                "-y",
                &h,
                "-s",
                "t",
                "env",
                "PS1=$ ",
                "bash",
                "--norc",
                "--noprofile",
            ])
            .status()
            .expect("tmux is needed by the tests (scripts/setup installs it)");
        assert!(st.success());
        t
    }
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket]).args(args);
        c
    }
    pub fn send(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "t"];
        args.extend(keys);
        assert!(self.cmd(&args).status().unwrap().success());
    }
    pub fn capture(&self) -> String {
        let out = self
            .cmd(&["capture-pane", "-p", "-t", "t"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
    /// The pane's scrollback and screen, oldest line first.
    pub fn capture_history(&self) -> String {
        let out = self
            .cmd(&["capture-pane", "-p", "-S", "-", "-t", "t"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
    pub fn query(&self, format: &str) -> String {
        let out = self
            .cmd(&["display", "-p", "-t", "t", format])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
    /// Waits until the screen satisfies `pred`; panics with the screen if not.
    pub fn wait_for(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let mut screen = String::new();
        let done = super::poll_every(super::HANG_LIMIT, Duration::from_millis(100), || {
            screen = self.capture();
            pred(&screen)
        });
        assert!(done, "timed out waiting for {what}:\n{screen}");
        screen
    }
    /// The PID of the shell's child (the command running in the pane).
    pub fn foreground_child(&self) -> Option<u32> {
        let shell = self.query("#{pane_pid}");
        let children =
            std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).ok()?;
        children.split_whitespace().next()?.parse().ok()
    }
    /// Whether the terminal is back in its normal state: main screen, and
    /// canonical mode with echo (not raw).
    pub fn assert_terminal_restored(&self) {
        assert_eq!(
            self.query("#{alternate_on}"),
            "0",
            "still on the alternate screen"
        );
        // The marker is computed by the shell, so that the command line
        // (wrapped on a narrow window) never looks like its output.
        self.send(&[
            "clear; stty -a | tr ' ;' '\\n\\n' | grep -x -- '-\\?\\(icanon\\|echo\\)' | tr '\\n' ' '; echo END$((6*7))",
            "Enter",
        ]);
        let is_output = |l: &str| l.trim_end().ends_with("END42");
        let screen = self.wait_for("stty output", |s| s.lines().any(is_output));
        let line = screen.lines().find(|l| is_output(l)).unwrap();
        assert!(
            line.contains("icanon echo") && !line.contains("-icanon") && !line.contains("-echo"),
            "terminal left in raw mode: {line}"
        );
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        // Quietly: a test that closed the session has ended the server.
        let _ = self.cmd(&["kill-server"]).stderr(Stdio::null()).status();
    }
}
