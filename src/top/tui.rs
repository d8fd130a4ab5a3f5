//! The full-screen view: key handling (a pure state machine), drawing with
//! ratatui, and a terminal guard that restores the terminal on every exit
//! path (return, error, panic; signals end the loop and return).

use std::io::{self, Stdout};
use std::time::Duration;

use anyhow::{Context, Result};
use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use crossterm::terminal::{self, EnterAlternateScreen, LeaveAlternateScreen};
use ratatui::backend::CrosstermBackend;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Cell, Clear, Paragraph, Row, Table, TableState};
use ratatui::{Frame, Terminal};

use crate::model::human_size;
use crate::output::terminal_safe;
use crate::render::{hist, GroupBy, SourceColumn};
use crate::top::columns::{elide_middle, fit, fitting_line, Column, SPACING};
use crate::top::view::{
    cells, header_lines, headers, next_group, per_sec, source_column, Interval, TopRow, TopSort,
    ViewOptions,
};

/// Refresh intervals offered by + and -.
const INTERVALS: [f64; 7] = [0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0];

/// What the loop must do after a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Nothing,
    Redraw,
    /// The refresh interval changed: reschedule the next read.
    Reschedule,
    Quit,
}

/// Everything the keys change.
#[derive(Clone, Debug)]
pub struct App {
    pub view: ViewOptions,
    pub interval_s: f64,
    /// The per-process or per-cgroup view the kernel counts, if any.
    pub counted: Option<GroupBy>,
    pub selected: usize,
    /// The selected row's key: a selection the user moved off the top row
    /// follows it when rows reorder between refreshes.
    pub selected_key: Option<String>,
    /// The user moved the selection off the top row. Until then the top
    /// row is selected, whichever it is, so that the table shows the
    /// heaviest rows as `top -b` does: following the first refresh's top
    /// row once scrolled a long table to wherever that row had sunk.
    pub pinned: bool,
    pub expanded: bool,
    /// The help overlay is shown (any key closes it).
    pub help: bool,
}

impl App {
    pub fn new(view: ViewOptions, interval_s: f64, counted: Option<GroupBy>) -> App {
        App {
            view,
            interval_s,
            counted,
            selected: 0,
            selected_key: None,
            pinned: false,
            expanded: false,
            help: false,
        }
    }

    /// Keeps the selection on the row the user chose after a refresh
    /// reordered them; without a choice, on the top row.
    pub fn follow(&mut self, rows: &[TopRow]) {
        if !self.pinned {
            self.selected = 0;
        } else if let Some(i) = self
            .selected_key
            .as_ref()
            .and_then(|k| rows.iter().position(|r| &r.key == k))
        {
            self.selected = i;
        }
        self.selected = self.selected.min(rows.len().saturating_sub(1));
        self.selected_key = rows.get(self.selected).map(|r| r.key.clone());
    }

    pub fn on_key(&mut self, key: KeyEvent, rows: usize) -> Action {
        if key.kind == KeyEventKind::Release {
            return Action::Nothing;
        }
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        // Raw mode turns Ctrl-C into a key rather than SIGINT: it quits
        // whatever is shown.
        if key.code == KeyCode::Char('c') && ctrl {
            return Action::Quit;
        }
        if self.help {
            self.help = false;
            return Action::Redraw;
        }
        match key.code {
            KeyCode::Char('q') => Action::Quit,
            KeyCode::Char('h') | KeyCode::Char('?') => {
                self.help = true;
                Action::Redraw
            }
            KeyCode::Esc if self.expanded => {
                self.expanded = false;
                Action::Redraw
            }
            KeyCode::Esc => Action::Quit,
            KeyCode::Char('s') | KeyCode::Char('>') => {
                self.view.sort = self.view.sort.next(self.view.by);
                // A new order starts at its top.
                self.pinned = false;
                Action::Redraw
            }
            KeyCode::Char('v') | KeyCode::Tab => {
                self.set_view(next_group(self.view.by, self.counted))
            }
            KeyCode::Char('1') => self.set_view(GroupBy::Site),
            KeyCode::Char('2') => self.set_view(GroupBy::Stack),
            KeyCode::Char('3') => self.set_view(GroupBy::Cache),
            KeyCode::Char('4') => match self.counted {
                Some(view) => self.set_view(view),
                None => Action::Nothing,
            },
            KeyCode::Char(' ') | KeyCode::Char('p') => {
                self.view.paused = !self.view.paused;
                Action::Reschedule
            }
            KeyCode::Char('+') | KeyCode::Char('=') => self.step_interval(1),
            KeyCode::Char('-') => self.step_interval(-1),
            KeyCode::Down | KeyCode::Char('j') => {
                self.select(self.selected.saturating_add(1), rows)
            }
            KeyCode::Up | KeyCode::Char('k') => self.select(self.selected.saturating_sub(1), rows),
            KeyCode::PageDown => self.select(self.selected.saturating_add(10), rows),
            KeyCode::PageUp => self.select(self.selected.saturating_sub(10), rows),
            KeyCode::Home => self.select(0, rows),
            KeyCode::Enter | KeyCode::Char('e') => {
                self.expanded = !self.expanded;
                Action::Redraw
            }
            _ => Action::Nothing,
        }
    }

    fn set_view(&mut self, by: GroupBy) -> Action {
        self.view.by = by;
        if !self.view.sort.offered_in(by) {
            self.view.sort = TopSort::Bytes;
        }
        self.selected = 0;
        self.selected_key = None;
        self.pinned = false;
        Action::Redraw
    }

    fn select(&mut self, i: usize, rows: usize) -> Action {
        self.selected = i.min(rows.saturating_sub(1));
        self.pinned = self.selected > 0;
        // Re-read from the rows by the caller (`follow`).
        self.selected_key = None;
        Action::Redraw
    }

    fn step_interval(&mut self, dir: i32) -> Action {
        let i = INTERVALS
            .iter()
            .position(|&v| v >= self.interval_s - 1e-9)
            .unwrap_or(INTERVALS.len() - 1);
        let i = if dir > 0 {
            // From a value between two steps, + goes to the next one up.
            if INTERVALS[i] > self.interval_s + 1e-9 {
                i
            } else {
                (i + 1).min(INTERVALS.len() - 1)
            }
        } else {
            i.saturating_sub(1)
        };
        self.interval_s = INTERVALS[i];
        Action::Reschedule
    }
}

/// The key line, most complete first: the first that fits is shown.
pub const KEYS_LINES: [&str; 3] = [
    "q quit  s sort  v/Tab view (1-4)  space pause  +/- interval  ↑/↓ select  Enter expand  h/? help",
    "q quit  s sort  v view  space pause  +/- interval  Enter expand  ? help",
    "q quit  ? help",
];

/// The help overlay: every key, one a line.
pub const HELP_LINES: [(&str, &str); 13] = [
    ("q, Esc, Ctrl-C", "quit (Esc first closes an expanded row)"),
    ("s, >", "sort by the next column"),
    (
        "v, Tab",
        "next view: site, stack, cache (and process or cgroup)",
    ),
    ("1 2 3 4", "site, stack, cache, process/cgroup view"),
    ("space, p", "pause / resume"),
    ("+, =", "longer refresh interval"),
    ("-", "shorter refresh interval"),
    ("↑ ↓, k j", "select a row"),
    ("PgUp PgDn, Home", "move by 10 rows, to the top"),
    ("Enter, e", "expand the row: size histogram and its stack"),
    ("h, ?", "this help"),
    ("", ""),
    ("", "any key closes this help"),
];

/// Draws one screen. `iv` is None until the first interval has been read;
/// `total` counts the rows before `--rows` cut them.
pub fn draw(f: &mut Frame, app: &App, iv: Option<&Interval>, rows: &[TopRow], total: usize) {
    let area = f.area();
    let detail_h = if app.expanded { area.height / 2 } else { 0 };
    let head_h = iv.map_or(1, |iv| 5 + u16::from(!iv.report.run.skipped.is_empty()));
    let [head, table, detail, keys] = Layout::vertical([
        Constraint::Length(head_h),
        Constraint::Min(3),
        Constraint::Length(detail_h),
        Constraint::Length(1),
    ])
    .areas(area);

    let visible = table.height.saturating_sub(1) as usize;
    let head_text: Vec<Line> = match iv {
        Some(iv) => header_lines(
            iv,
            &app.view,
            rows.len().min(visible),
            total,
            head.width as usize,
        )
        .into_iter()
        .map(|l| Line::from(terminal_safe(&l).into_owned()))
        .collect(),
        None => vec![Line::from(format!(
            "kheap top: collecting the first {:.2}s interval…",
            app.interval_s
        ))],
    };
    f.render_widget(Paragraph::new(head_text), head);

    let interval_s = iv.map_or(app.interval_s, |iv| iv.interval_s);
    draw_table(f, table, app, rows, interval_s);
    if app.expanded {
        draw_detail(f, detail, rows.get(app.selected), interval_s);
    }
    f.render_widget(
        Paragraph::new(fitting_line(&KEYS_LINES, keys.width as usize).into_owned())
            .style(Style::new().add_modifier(Modifier::REVERSED)),
        keys,
    );
    if app.help {
        draw_help(f, area);
    }
}

/// The help overlay, centred, over whatever is drawn.
fn draw_help(f: &mut Frame, area: Rect) {
    let keys_w = HELP_LINES
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let lines: Vec<Line> = HELP_LINES
        .iter()
        .map(|(k, what)| Line::from(format!(" {k:<keys_w$}  {what}")))
        .collect();
    let text_w = lines.iter().map(Line::width).max().unwrap_or(0) + 2;
    let width = (text_w as u16).min(area.width);
    let height = (lines.len() as u16 + 2).min(area.height);
    let x = area.x + (area.width - width) / 2;
    let y = area.y + (area.height - height) / 2;
    let rect = Rect::new(x, y, width, height);
    f.render_widget(Clear, rect);
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" kheap top: keys ")),
        rect,
    );
}

fn draw_table(f: &mut Frame, area: Rect, app: &App, rows: &[TopRow], interval_s: f64) {
    let by = app.view.by;
    let source = source_column(rows);
    let heads = headers(by, source);
    let body: Vec<Vec<String>> = rows.iter().map(|r| cells(r, by, interval_s)).collect();
    let cols = column_specs(&heads, &body, by, source, app.view.sort.column());
    let widths = fit(&cols, area.width as usize);
    let shown = |i: &usize| widths.get(*i).copied().flatten();
    // The naming columns are left-aligned and elided in the middle; the
    // numbers are right-aligned and never cut (their column hides instead).
    let cell = |i: usize, text: &str| {
        let width = shown(&i).unwrap_or(0);
        if cols[i].name {
            Line::from(elide_middle(&terminal_safe(text), width))
        } else {
            Line::from(text.to_string()).right_aligned()
        }
    };
    let sorted = app.view.sort.column();
    let header = Row::new(
        heads
            .iter()
            .enumerate()
            .filter(|c| shown(&c.0).is_some())
            .map(|(i, h)| {
                let style = if *h == sorted {
                    Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED)
                } else {
                    Style::new().add_modifier(Modifier::BOLD)
                };
                Cell::from(cell(i, h)).style(style)
            }),
    );
    let body = body.iter().map(|r| {
        Row::new(
            r.iter()
                .enumerate()
                .filter(|c| shown(&c.0).is_some())
                .map(|(i, c)| Cell::from(cell(i, c))),
        )
    });
    let constraints = widths
        .iter()
        .flatten()
        .map(|&w| Constraint::Length(w as u16));
    let table = Table::new(body, constraints)
        .column_spacing(SPACING as u16)
        .header(header)
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED));
    let mut state = TableState::default();
    if !rows.is_empty() {
        state.select(Some(app.selected.min(rows.len() - 1)));
    }
    f.render_stateful_widget(table, area, &mut state);
}

/// The columns of a view, for `fit`: the key column first (never hidden),
/// then the column the rows are sorted by, the second naming column, the
/// allocator, and the rates from most to least telling.
fn column_specs(
    heads: &[&str],
    body: &[Vec<String>],
    by: GroupBy,
    source: SourceColumn,
    sorted: &str,
) -> Vec<Column> {
    // The second column names (a cache, a comm) except in the cache and
    // cgroup views, where it is a rate.
    let second_names = matches!(by, GroupBy::Site | GroupBy::Stack | GroupBy::Process);
    let detail = 1 + usize::from(source.0);
    heads
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let natural = body
                .iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .chain([h.chars().count()])
                .max()
                .unwrap_or(0);
            let priority = match *h {
                _ if i == 0 => u8::MAX,
                _ if *h == sorted => 20,
                _ if i == detail => 10,
                "source" => 9,
                "alloc/s" => 8,
                "allocs/s" => 7,
                "waste%" => 6,
                "req/s" => 5,
                "waste/s" => 4,
                "avg" => 3,
                _ => 1,
            };
            Column {
                natural,
                name: i == 0 || (i == detail && second_names),
                priority,
            }
        })
        .collect()
}

fn draw_detail(f: &mut Frame, area: Rect, row: Option<&TopRow>, interval_s: f64) {
    let mut lines: Vec<Line> = Vec::new();
    let title = match row {
        None => " nothing selected ".to_string(),
        Some(r) => {
            let c = &r.counts;
            lines.push(Line::from(format!(
                "{} allocs/s, {}/s allocated, {} wasted/s; {} allocations this interval{}",
                per_sec(c.count, interval_s).round(),
                human_size(per_sec(c.bytes_alloc, interval_s).round() as u64),
                human_size(per_sec(c.waste_bytes, interval_s).round() as u64),
                c.count,
                if r.estimated {
                    " (estimated from sampled stacks)"
                } else {
                    ""
                }
            )));
            lines.push(Line::from("requested sizes this interval:"));
            lines.extend(
                hist::log2(&c.hist, "  ", Some(area.width))
                    .lines()
                    .map(|l| Line::from(l.to_string())),
            );
            match r.stacks.first() {
                Some(frames) => {
                    lines.push(Line::from(if r.stacks.len() > 1 {
                        format!("heaviest of {} sampled stacks:", r.stacks.len())
                    } else {
                        "stack:".to_string()
                    }));
                    lines.extend(frames.iter().map(|fr| Line::from(format!("  {fr}"))));
                }
                None => lines.push(Line::from("(no stack for this row in this interval)")),
            }
            format!(" {} {} ", r.name, r.detail)
        }
    };
    f.render_widget(
        Paragraph::new(lines).block(Block::new().borders(Borders::TOP).title(title)),
        area,
    );
}

/// Puts the terminal back: cooked mode, main screen, cursor shown. Safe to
/// call more than once.
pub fn restore_terminal() {
    let _ = terminal::disable_raw_mode();
    let _ = crossterm::execute!(io::stdout(), LeaveAlternateScreen, crossterm::cursor::Show);
}

/// Restores the terminal when dropped. Made before the terminal is
/// changed at all, so that a failure half-way through entering the
/// full-screen view (raw mode set, the alternate screen refused) still
/// leaves the terminal as it was.
struct RestoreGuard;

impl Drop for RestoreGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

/// The full-screen terminal, restored when dropped — on return, on error
/// and on unwinding — and by a panic hook before a panic message prints.
pub struct Screen {
    pub terminal: Terminal<CrosstermBackend<Stdout>>,
    // Dropped after the terminal: the last thing done is the restore.
    _restore: RestoreGuard,
}

impl Screen {
    pub fn enter() -> Result<Screen> {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_terminal();
            prev(info);
        }));
        let restore = RestoreGuard;
        terminal::enable_raw_mode().context("putting the terminal in raw mode")?;
        crossterm::execute!(io::stdout(), EnterAlternateScreen, crossterm::cursor::Hide)
            .context("switching to the alternate screen")?;
        let terminal =
            Terminal::new(CrosstermBackend::new(io::stdout())).context("opening the terminal")?;
        Ok(Screen {
            terminal,
            _restore: restore,
        })
    }
}

/// What the terminal reported.
#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    Key(KeyEvent),
    /// The window changed size: redraw now rather than at the next refresh.
    Resize,
    /// The terminal went away (hang-up, end of file, EIO): the run ends.
    Gone,
}

/// The terminal's keys, read straight from standard input (the terminal
/// the full-screen view needs). Not crossterm's reader: its read loop
/// retries forever on end of file and EIO, so a top whose terminal closed
/// (an ssh connection dropped, `tmux kill-session`) spun there, attached,
/// never seeing SIGHUP or SIGTERM.
pub struct Keys {
    fd: libc::c_int,
    size: Option<(u16, u16)>,
}

impl Keys {
    pub fn new() -> Keys {
        Keys::on(libc::STDIN_FILENO)
    }

    /// The keys of the terminal open as `fd` (kept open by the caller).
    pub fn on(fd: libc::c_int) -> Keys {
        Keys {
            fd,
            size: terminal::size().ok(),
        }
    }

    /// Waits up to `timeout` for keys, a resize or the terminal's end. A
    /// signal cuts the wait short (nothing is returned), so the caller
    /// sees a stop request at once.
    pub fn next(&mut self, timeout: Duration) -> Result<Vec<Input>> {
        let size = terminal::size().ok();
        if size != self.size {
            self.size = size;
            return Ok(vec![Input::Resize]);
        }
        let mut pfd = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(Vec::new());
            }
            return Err(e).context("waiting for a key");
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        if pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            return Ok(vec![Input::Gone]);
        }
        let mut buf = [0u8; 1024];
        // SAFETY: buf is valid for its length.
        let got = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
        match got {
            0 => Ok(vec![Input::Gone]),
            n if n > 0 => Ok(parse_keys(&buf[..n as usize])
                .into_iter()
                .map(Input::Key)
                .collect()),
            _ => {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock => Ok(Vec::new()),
                    // EIO: the terminal hung up.
                    _ => Ok(vec![Input::Gone]),
                }
            }
        }
    }
}

impl Default for Keys {
    fn default() -> Keys {
        Keys::new()
    }
}

/// Whether standard input's terminal has gone away (hung up), without
/// waiting: a failed draw is then the end of the run, not an error.
pub fn terminal_gone() -> bool {
    let mut pfd = libc::pollfd {
        fd: libc::STDIN_FILENO,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

/// The keys in what a raw-mode terminal sent: printable characters, Enter,
/// Tab, Ctrl-C, Esc (alone in a read), the cursor keys, Home, End, PgUp and
/// PgDn in their CSI and SS3 forms. Other escape sequences are skipped
/// whole, so they never turn into keys.
pub fn parse_keys(bytes: &[u8]) -> Vec<KeyEvent> {
    let text = String::from_utf8_lossy(bytes);
    let chars: Vec<char> = text.chars().collect();
    let mut keys = Vec::new();
    let plain = |code| KeyEvent::new(code, KeyModifiers::NONE);
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        let code = match c {
            '\x1b' => match chars.get(i) {
                None => KeyCode::Esc,
                Some('[') | Some('O') => {
                    let csi = chars[i] == '[';
                    i += 1;
                    // Parameters, then one final byte (@ to ~).
                    let start = i;
                    while i < chars.len() && !('@'..='~').contains(&chars[i]) {
                        i += 1;
                    }
                    let Some(&last) = chars.get(i) else {
                        break;
                    };
                    i += 1;
                    let params: String = chars[start..i - 1].iter().collect();
                    match (last, params.as_str()) {
                        ('A', _) => KeyCode::Up,
                        ('B', _) => KeyCode::Down,
                        ('C', _) => KeyCode::Right,
                        ('D', _) => KeyCode::Left,
                        ('H', _) => KeyCode::Home,
                        ('F', _) => KeyCode::End,
                        ('~', "1" | "7") if csi => KeyCode::Home,
                        ('~', "4" | "8") if csi => KeyCode::End,
                        ('~', "5") if csi => KeyCode::PageUp,
                        ('~', "6") if csi => KeyCode::PageDown,
                        _ => continue,
                    }
                }
                // Alt-<key> or an Esc typed just before a key.
                Some(_) => KeyCode::Esc,
            },
            '\r' | '\n' => KeyCode::Enter,
            '\t' => KeyCode::Tab,
            '\x03' => {
                keys.push(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL));
                continue;
            }
            '\x7f' | '\x08' => KeyCode::Backspace,
            c if c.is_control() => continue,
            c => KeyCode::Char(c),
        };
        keys.push(plain(code));
    }
    keys
}

#[cfg(test)]
mod tests;
