//! Draws the live status line (model::progress) on stderr while a run
//! traces, and erases it before the report. Only when stderr is a
//! terminal: a log file or a pipe gets none of it.
//!
//! The line lives on the terminal's last row, which is kept out of the
//! scrolling region while it is shown (as apt's progress bar is): a traced
//! command writes to the same terminal, and its output would otherwise land
//! after the status text and leave pieces of it on the screen. The row
//! itself is redrawn with a carriage return and clear-to-end-of-line.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Duration;

use crate::model::progress::{self, Counters, Rate};

/// The terminal rows when a status row is reserved (one stderr, one line).
static RESERVED: Mutex<Option<u16>> = Mutex::new(None);

/// Save the cursor, restore it (DECSC, DECRC).
const SAVE: &str = "\x1b7";
const RESTORE: &str = "\x1b8";
/// Carriage return, then clear to the end of the line.
const CLEAR_LINE: &str = "\r\x1b[K";

pub struct StatusLine {
    enabled: bool,
    rate: Rate,
}

impl StatusLine {
    /// A status line for this run: drawn only if stderr is a terminal.
    pub fn new() -> StatusLine {
        StatusLine {
            enabled: std::io::stderr().is_terminal(),
            rate: Rate::default(),
        }
    }

    /// Redraws the line with the counters read now (`read` is not called
    /// when stderr is no terminal). A failed read leaves the line as it
    /// was: the status is a courtesy, the report says what counts.
    pub fn show(&mut self, elapsed: Duration, read: impl FnOnce() -> anyhow::Result<Counters>) {
        if !self.enabled {
            return;
        }
        let Ok(c) = read() else {
            return;
        };
        let per_sec = self.rate.update(elapsed, c.events);
        // Too small a terminal to spare a row: no status.
        let Some((cols, rows)) = terminal_size().filter(|&(_, rows)| rows >= 3) else {
            return;
        };
        let text = progress::line(elapsed, &c, per_sec);
        let mut out = String::new();
        let mut reserved = RESERVED.lock().unwrap_or_else(|e| e.into_inner());
        if *reserved != Some(rows) {
            if let Some(old) = reserved.take() {
                out.push_str(&release(old));
            }
            out.push_str(&reserve(rows));
            *reserved = Some(rows);
        }
        // One column short of the width: a line that fills the last
        // column can wrap on some terminals.
        let text = progress::fit(&text, usize::from(cols).saturating_sub(1));
        out.push_str(&format!("{SAVE}\x1b[{rows};1H{CLEAR_LINE}{text}{RESTORE}"));
        write_stderr(&out);
    }
}

impl Default for StatusLine {
    fn default() -> Self {
        StatusLine::new()
    }
}

impl Drop for StatusLine {
    fn drop(&mut self) {
        erase();
    }
}

/// Erases the status line, if one is shown, and gives its row back to the
/// scrolling text.
pub fn erase() {
    let mut reserved = RESERVED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(rows) = reserved.take() {
        write_stderr(&release(rows));
    }
}

/// Keeps the last of `rows` rows out of the scrolling region, the cursor
/// where it was (a newline first, so that if the cursor is on the last row
/// the text scrolls up rather than being drawn over).
fn reserve(rows: u16) -> String {
    format!("\n{SAVE}\x1b[1;{}r{RESTORE}\x1b[1A", rows - 1)
}

/// Clears the last row and makes the whole screen scroll again (setting
/// the region moves the cursor: it is saved around it).
fn release(rows: u16) -> String {
    format!("{SAVE}\x1b[r\x1b[{rows};1H{CLEAR_LINE}{RESTORE}")
}

fn write_stderr(s: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(s.as_bytes());
    let _ = err.flush();
}

/// Columns and rows of the terminal on stderr.
fn terminal_size() -> Option<(u16, u16)> {
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes one struct winsize into `ws`.
    let ok = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0;
    (ok && ws.ws_col > 0 && ws.ws_row > 0).then_some((ws.ws_col, ws.ws_row))
}
