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
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table, TableState};
use ratatui::{Frame, Terminal};

use crate::model::human_size;
use crate::render::{hist, GroupBy};
use crate::top::view::{
    cells, header_lines, headers, next_group, per_sec, source_column, Interval, TopRow, ViewOptions,
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
    /// The selected row's key: the selection follows it when rows reorder
    /// between refreshes.
    pub selected_key: Option<String>,
    pub expanded: bool,
}

impl App {
    pub fn new(view: ViewOptions, interval_s: f64, counted: Option<GroupBy>) -> App {
        App {
            view,
            interval_s,
            counted,
            selected: 0,
            selected_key: None,
            expanded: false,
        }
    }

    /// Keeps the selection on the same row after a refresh reordered them.
    pub fn follow(&mut self, rows: &[TopRow]) {
        if let Some(i) = self
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
        match key.code {
            KeyCode::Char('q') => Action::Quit,
            // Raw mode turns Ctrl-C into a key rather than SIGINT.
            KeyCode::Char('c') if ctrl => Action::Quit,
            KeyCode::Esc if self.expanded => {
                self.expanded = false;
                Action::Redraw
            }
            KeyCode::Esc => Action::Quit,
            KeyCode::Char('s') | KeyCode::Char('>') => {
                self.view.sort = self.view.sort.next();
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
        self.selected = 0;
        self.selected_key = None;
        Action::Redraw
    }

    fn select(&mut self, i: usize, rows: usize) -> Action {
        self.selected = i.min(rows.saturating_sub(1));
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

pub const KEYS_HELP: &str =
    "q quit  s sort  v/Tab view (1-4)  space pause  +/- interval  ↑/↓ select  Enter expand";

/// Draws one screen. `iv` is None until the first interval has been read;
/// `total` counts the rows before `--rows` cut them.
pub fn draw(f: &mut Frame, app: &App, iv: Option<&Interval>, rows: &[TopRow], total: usize) {
    let area = f.area();
    let detail_h = if app.expanded { area.height / 2 } else { 0 };
    let [head, table, detail, keys] = Layout::vertical([
        Constraint::Length(5),
        Constraint::Min(3),
        Constraint::Length(detail_h),
        Constraint::Length(1),
    ])
    .areas(area);

    let visible = table.height.saturating_sub(1) as usize;
    let head_text: Vec<Line> = match iv {
        Some(iv) => header_lines(iv, &app.view, rows.len().min(visible), total)
            .into_iter()
            .map(Line::from)
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
        Paragraph::new(KEYS_HELP).style(Style::new().add_modifier(Modifier::REVERSED)),
        keys,
    );
}

fn draw_table(f: &mut Frame, area: Rect, app: &App, rows: &[TopRow], interval_s: f64) {
    let by = app.view.by;
    let sorted = app.view.sort.column();
    // The naming columns are left-aligned, the numbers right-aligned (the
    // cache view's second column is frees/s).
    let source = source_column(rows);
    let names = if by == GroupBy::Cache { 1 } else { 2 } + usize::from(source.0);
    let align = |i: usize, line: Line<'static>| {
        if i < names {
            line
        } else {
            line.right_aligned()
        }
    };
    let header = Row::new(headers(by, source).into_iter().enumerate().map(|(i, h)| {
        let style = if h == sorted {
            Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED)
        } else {
            Style::new().add_modifier(Modifier::BOLD)
        };
        Cell::from(align(i, Line::from(h))).style(style)
    }));
    let body = rows.iter().map(|r| {
        Row::new(
            cells(r, by, interval_s)
                .into_iter()
                .enumerate()
                .map(|(i, c)| Cell::from(align(i, Line::from(c)))),
        )
    });
    let detail_w = rows
        .iter()
        .map(|r| r.detail.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(8, 40) as u16;
    let mut widths = vec![Constraint::Fill(1), Constraint::Length(detail_w)];
    if source.0 {
        widths.insert(1, Constraint::Length(7));
    }
    widths.extend([Constraint::Length(9); 7]);
    let table = Table::new(body, widths)
        .header(header)
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED));
    let mut state = TableState::default();
    if !rows.is_empty() {
        state.select(Some(app.selected.min(rows.len() - 1)));
    }
    f.render_stateful_widget(table, area, &mut state);
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

/// The full-screen terminal, restored when dropped — on return, on error
/// and on unwinding — and by a panic hook before a panic message prints.
pub struct Screen {
    pub terminal: Terminal<CrosstermBackend<Stdout>>,
}

impl Screen {
    pub fn enter() -> Result<Screen> {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_terminal();
            prev(info);
        }));
        terminal::enable_raw_mode().context("putting the terminal in raw mode")?;
        let screen = Screen {
            terminal: Terminal::new(CrosstermBackend::new(io::stdout()))
                .context("opening the terminal")?,
        };
        crossterm::execute!(io::stdout(), EnterAlternateScreen, crossterm::cursor::Hide)
            .context("switching to the alternate screen")?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        restore_terminal();
    }
}

/// What the terminal reported.
pub enum Input {
    Key(KeyEvent),
    /// The window changed size: redraw now rather than at the next refresh.
    Resize,
}

/// Waits up to `timeout` for a key press or a resize.
pub fn next_input(timeout: Duration) -> Result<Option<Input>> {
    use crossterm::event::{poll, read, Event};
    if poll(timeout)? {
        match read()? {
            Event::Key(k) => return Ok(Some(Input::Key(k))),
            Event::Resize(..) => return Ok(Some(Input::Resize)),
            _ => {}
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{report_of, sample_snapshot};
    use crate::testing::assert_contains;
    use crate::top::view::TopSort;
    use crate::top::view::{rows, sort_rows, ObjectSizes};
    use ratatui::backend::TestBackend;

    fn key(c: KeyCode) -> KeyEvent {
        KeyEvent::new(c, KeyModifiers::NONE)
    }

    fn app() -> App {
        App::new(
            ViewOptions {
                by: GroupBy::Site,
                sort: TopSort::Bytes,
                paused: false,
            },
            1.0,
            None,
        )
    }

    #[test]
    fn keys_change_sort_view_pause_and_interval() {
        let mut a = app();
        assert_eq!(a.on_key(key(KeyCode::Char('s')), 5), Action::Redraw);
        assert_eq!(a.view.sort, TopSort::Count);
        a.on_key(key(KeyCode::Tab), 5);
        assert_eq!(a.view.by, GroupBy::Stack);
        a.on_key(key(KeyCode::Char('3')), 5);
        assert_eq!(a.view.by, GroupBy::Cache);
        assert_eq!(
            a.on_key(key(KeyCode::Char('4')), 5),
            Action::Nothing,
            "no process data"
        );
        a.on_key(key(KeyCode::Char('v')), 5);
        assert_eq!(a.view.by, GroupBy::Site);
        assert_eq!(a.on_key(key(KeyCode::Char(' ')), 5), Action::Reschedule);
        assert!(a.view.paused);
        assert_eq!(a.on_key(key(KeyCode::Char('+')), 5), Action::Reschedule);
        assert_eq!(a.interval_s, 2.0);
        a.on_key(key(KeyCode::Char('-')), 5);
        a.on_key(key(KeyCode::Char('-')), 5);
        assert_eq!(a.interval_s, 0.5);
        a.interval_s = 1.5;
        a.on_key(key(KeyCode::Char('+')), 5);
        assert_eq!(a.interval_s, 2.0, "between steps, + goes up one");
        for _ in 0..10 {
            a.on_key(key(KeyCode::Char('+')), 5);
        }
        assert_eq!(a.interval_s, 10.0);
    }

    #[test]
    fn selection_follows_its_row_across_refreshes() {
        let row = |n: &str| TopRow {
            key: n.into(),
            ..Default::default()
        };
        let mut a = app();
        a.on_key(key(KeyCode::Down), 3);
        a.follow(&[row("a"), row("b"), row("c")]);
        assert_eq!(a.selected_key.as_deref(), Some("b"));
        a.follow(&[row("b"), row("c"), row("a")]);
        assert_eq!(a.selected, 0, "b moved to the top");
        a.follow(&[row("c")]);
        assert_eq!((a.selected, a.selected_key.as_deref()), (0, Some("c")));
        a.follow(&[]);
        assert_eq!(a.selected_key, None);
    }

    #[test]
    fn selection_stays_in_range_and_esc_collapses_first() {
        let mut a = app();
        for _ in 0..10 {
            a.on_key(key(KeyCode::Down), 3);
        }
        assert_eq!(a.selected, 2);
        a.on_key(key(KeyCode::Up), 3);
        assert_eq!(a.selected, 1);
        a.on_key(key(KeyCode::Enter), 3);
        assert!(a.expanded);
        assert_eq!(a.on_key(key(KeyCode::Esc), 3), Action::Redraw);
        assert!(!a.expanded);
        assert_eq!(a.on_key(key(KeyCode::Esc), 3), Action::Quit);
        assert_eq!(a.on_key(key(KeyCode::Char('q')), 3), Action::Quit);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(a.on_key(ctrl_c, 3), Action::Quit);
    }

    fn screen_text(a: &App) -> String {
        let report = report_of(&sample_snapshot(), 10, 1.0);
        let iv = Interval {
            time: "2026-11-29T17:30:01.000Z".into(),
            interval_s: 1.0,
            report,
            ..Default::default()
        };
        let mut r = rows(&iv.report, a.view.by, &ObjectSizes::default());
        sort_rows(&mut r, a.view.sort);
        let mut term = Terminal::new(TestBackend::new(140, 40)).unwrap();
        let total = r.len();
        term.draw(|f| draw(f, a, Some(&iv), &r, total)).unwrap();
        let buf = term.backend().buffer().clone();
        let mut s = String::new();
        for y in 0..buf.area.height {
            for x in 0..buf.area.width {
                s.push_str(buf[(x, y)].symbol());
            }
            s.push('\n');
        }
        s
    }

    #[test]
    fn draws_header_rows_and_expanded_stack() {
        let mut a = app();
        let s = screen_text(&a);
        assert_contains(&s, &["kheap top  2026-11-29T17:30:01.000Z", "alloc/s"]);
        let first = s.lines().position(|l| l.contains("load_msg+0x10")).unwrap();
        let second = s
            .lines()
            .position(|l| l.contains("simple_xattr_alloc"))
            .unwrap();
        assert!(first < second, "sorted by bytes: {s}");
        assert!(s.contains("q quit"), "{s}");
        a.expanded = true;
        let s = screen_text(&a);
        assert_contains(&s, &["stack:", "do_msgsnd+0x10"]);
        assert!(s.contains("[2K, 4K)"), "histogram: {s}");
    }
}
