use super::*;
use crate::report::fixtures::{report_of, sample_snapshot};
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
fn a_long_table_shows_its_heaviest_rows_after_every_refresh() {
    // The user's run: about 76 sites sorted by waste/s. The first
    // refresh's top row stops wasting; the next refresh must still show
    // the heaviest rows first, not scroll to that row's new place among
    // the zero-waste rows (sorted by name).
    let row = |name: &str, waste: u64| TopRow {
        key: name.into(),
        name: name.into(),
        counts: crate::model::Counts {
            count: 1,
            waste_bytes: waste,
            ..Default::default()
        },
        ..Default::default()
    };
    let refresh = |wasters: &[(&str, u64)]| {
        let mut r: Vec<TopRow> = (0..74)
            .map(|i| row(&format!("idle_{i:02}+0x1"), 0))
            .collect();
        r.extend(wasters.iter().map(|&(n, w)| row(n, w)));
        sort_rows(&mut r, TopSort::Waste);
        r
    };
    let mut a = app();
    a.view.sort = TopSort::Waste;
    let iv = Interval::default();
    let draw_rows = |a: &App, r: &[TopRow]| {
        let mut term = Terminal::new(TestBackend::new(120, 24)).unwrap();
        term.draw(|f| draw(f, a, Some(&iv), r, r.len())).unwrap();
        let buf = term.backend().buffer().clone();
        (0..buf.area.height)
            .map(|y| {
                (0..buf.area.width)
                    .map(|x| buf[(x, y)].symbol())
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
    };
    let first = refresh(&[("zz_burst+0x1", 500_000), ("sock_alloc+0x2", 176_000)]);
    a.follow(&first);
    let second = refresh(&[("zz_burst+0x1", 0), ("sock_alloc+0x2", 176_000)]);
    assert_eq!(second[0].name, "sock_alloc+0x2");
    a.follow(&second);
    assert_eq!(a.selected, 0);
    let lines = draw_rows(&a, &second);
    let body: Vec<&String> = lines.iter().filter(|l| l.contains("+0x")).collect();
    assert!(body.len() > 10, "{lines:#?}");
    assert!(body[0].contains("sock_alloc+0x2"), "{lines:#?}");
    assert!(body[1].contains("idle_00+0x1"), "{lines:#?}");
    assert!(!lines.iter().any(|l| l.contains("zz_burst")), "{lines:#?}");

    // A row the user selected is still followed.
    a.on_key(key(KeyCode::Down), second.len());
    a.follow(&second);
    assert_eq!(a.selected_key.as_deref(), Some("idle_00+0x1"));
    let third = refresh(&[
        ("zz_burst+0x1", 0),
        ("idle_00+0x1", 9),
        ("sock_alloc+0x2", 1),
    ]);
    a.follow(&third);
    assert_eq!((a.selected, third[0].name.as_str()), (0, "idle_00+0x1"));
    // A new sort starts at the top again.
    a.on_key(key(KeyCode::Down), third.len());
    a.on_key(key(KeyCode::Char('s')), third.len());
    a.follow(&third);
    assert_eq!(a.selected, 0);
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
    screen_text_sized(a, 140, 40)
}

fn screen_text_sized(a: &App, width: u16, height: u16) -> String {
    let report = report_of(&sample_snapshot(), 10, 1.0);
    let iv = Interval {
        time: "2026-11-29T17:30:01.000Z".into(),
        interval_s: 1.0,
        report,
        ..Default::default()
    };
    let mut r = rows(&iv.report, a.view.by, &ObjectSizes::default());
    sort_rows(&mut r, a.view.sort);
    let mut term = Terminal::new(TestBackend::new(width, height)).unwrap();
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

#[test]
fn eighty_columns_keep_the_key_column_and_the_key_line() {
    let mut a = app();
    for (by, key, real) in [
        (GroupBy::Site, "site", "simple_xattr_alloc+0x10"),
        (GroupBy::Stack, "stack", "load_msg"),
        (GroupBy::Cache, "cache", "kmalloc-cg-4k"),
    ] {
        a.view.by = by;
        let s = screen_text_sized(&a, 80, 24);
        let header = s.lines().find(|l| l.starts_with(&format!("{key} ")));
        assert!(header.is_some_and(|h| h.contains("alloc/s")), "{by:?}: {s}");
        assert!(s.lines().any(|l| l.starts_with(real)), "{by:?}: {s}");
        let keys = s.lines().last().unwrap();
        assert!(keys.contains("q quit") && keys.contains("? help"), "{keys}");
        assert!(!keys.trim_end().ends_with("Enter e"), "{keys}");
    }
}

#[test]
fn h_and_question_mark_show_help_and_any_key_closes_it() {
    for open in ['h', '?'] {
        let mut a = app();
        assert_eq!(a.on_key(key(KeyCode::Char(open)), 3), Action::Redraw);
        assert!(a.help);
        let s = screen_text_sized(&a, 80, 24);
        assert_contains(&s, &["kheap top: keys", "any key closes this help"]);
        // 'q' closes the help, it does not quit.
        assert_eq!(a.on_key(key(KeyCode::Char('q')), 3), Action::Redraw);
        assert!(!a.help);
        assert!(!screen_text_sized(&a, 80, 24).contains("kheap top: keys"));
    }
    let mut a = app();
    a.on_key(key(KeyCode::Char('?')), 3);
    let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
    assert_eq!(a.on_key(ctrl_c, 3), Action::Quit, "Ctrl-C quits even then");
}

#[test]
fn raw_terminal_bytes_become_keys() {
    let codes = |b: &[u8]| -> Vec<KeyCode> { parse_keys(b).into_iter().map(|k| k.code).collect() };
    assert_eq!(
        codes(b"qs>\t\r"),
        [
            KeyCode::Char('q'),
            KeyCode::Char('s'),
            KeyCode::Char('>'),
            KeyCode::Tab,
            KeyCode::Enter
        ]
    );
    assert_eq!(codes(b"\x1b"), [KeyCode::Esc]);
    assert_eq!(
        codes(b"\x1b[A\x1b[B\x1bOH\x1b[5~\x1b[6~\x1b[1~"),
        [
            KeyCode::Up,
            KeyCode::Down,
            KeyCode::Home,
            KeyCode::PageUp,
            KeyCode::PageDown,
            KeyCode::Home
        ]
    );
    // Ctrl-C in raw mode is a byte, and quits.
    let ctrl_c = parse_keys(b"\x03");
    assert_eq!(app().on_key(ctrl_c[0], 1), Action::Quit);
    // Unknown sequences (a focus report, F5, a mouse report) are skipped
    // whole, not read as 'q' or '~'; a cut sequence is dropped.
    assert_eq!(codes(b"\x1b[I\x1b[15~\x1b[<0;1;1Mj"), [KeyCode::Char('j')]);
    assert_eq!(codes(b"k\x1b[1"), [KeyCode::Char('k')]);
    assert_eq!(codes(b"\x00\x01"), []);
}

/// A pseudo-terminal pair; the test closes the master to hang it up.
fn pty() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (0, 0);
    // SAFETY: out-pointers to two ints; the rest may be null.
    let r = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "openpty: {}", io::Error::last_os_error());
    // SAFETY: both were just opened and are owned here.
    unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(master),
            std::os::fd::OwnedFd::from_raw_fd(slave),
        )
    }
}

#[test]
fn keys_are_read_and_a_closed_terminal_is_said_at_once() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let (master, slave) = pty();
    // Raw, as the full-screen view sets it.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    unsafe {
        libc::tcgetattr(slave.as_raw_fd(), &mut t);
        libc::cfmakeraw(&mut t);
        libc::tcsetattr(slave.as_raw_fd(), libc::TCSANOW, &t);
    }
    let mut keys = Keys::on(slave.as_raw_fd());
    let mut master = std::fs::File::from(master);
    master.write_all(b"q").unwrap();
    let limit = std::time::Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    while got.is_empty() && std::time::Instant::now() < limit {
        got = keys.next(Duration::from_millis(100)).unwrap();
    }
    let q = KeyEvent::new(KeyCode::Char('q'), KeyModifiers::NONE);
    assert_eq!(got, [Input::Key(q)]);
    // Nothing typed: the wait ends empty.
    assert!(keys.next(Duration::from_millis(10)).unwrap().is_empty());
    // The terminal goes away: said on the next wait, however long that
    // wait was to be (crossterm's reader spun here forever).
    drop(master);
    assert_eq!(keys.next(Duration::from_secs(3600)).unwrap(), [Input::Gone]);
    assert_eq!(keys.next(Duration::from_secs(3600)).unwrap(), [Input::Gone]);
}
