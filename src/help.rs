//! EXAMPLES and EXIT STATUS of each subcommand: written once here, shown
//! after `--help` (clap's `after_long_help`) and as sections of the man
//! pages (`kheap man`).

use std::fmt::Write as _;

/// One example: a real command line and what it shows.
pub type Example = (&'static str, &'static str);

/// An exit status and when it is returned.
pub type Status = (&'static str, &'static str);

const USAGE: Status = (
    "2",
    "the command line is wrong (one line on stderr says what)",
);
const ERROR: Status = (
    "1",
    "kheap could not do what was asked (one line on stderr says what and what to do)",
);
const OK: Status = ("0", "the report was written");

/// What a tracing subcommand returns: its report, the command's status,
/// an error, a usage error.
const TRACING: &[Status] = &[
    (
        "0",
        "the report was written: -d passed, Ctrl-C or SIGTERM came, every -p process exited, or the command exited with 0",
    ),
    (
        "N",
        "with -- CMD, the command's exit status when not 0 (128+S when signal S ended it); the report is written too",
    ),
    ERROR,
    USAGE,
];

const PLAIN: &[Status] = &[OK, ERROR, USAGE];

/// The examples and exit statuses of `kheap` (`""`) or a subcommand.
pub fn page(sub: &str) -> Option<(&'static [Example], &'static [Status])> {
    Some(match sub {
        "" => (
            &[
                ("sudo kheap doctor", "what this kernel offers and how kheap will attach"),
                (
                    "sudo kheap record -r 5 -- kheap-load msg 1000 2100",
                    "who allocated while a command ran, the five heaviest sites",
                ),
                ("sudo kheap top", "who allocates right now, refreshed every second"),
            ],
            PLAIN,
        ),
        "record" => (
            &[
                (
                    "sudo kheap record -d 10",
                    "ten seconds of the whole system, by call site",
                ),
                (
                    "sudo kheap record -r 5 -- kheap-load msg 1000 2100",
                    "a command and its children, the five heaviest sites",
                ),
                (
                    "sudo kheap record -d 10 --format pprof -o heap.pb.gz",
                    "a profile for go tool pprof (allocator frames left out)",
                ),
                (
                    "sudo kheap record -d 10 --format svg -o heap.svg",
                    "an interactive flame graph",
                ),
                (
                    "sudo kheap record -p 1234 --by stack -d 5",
                    "one process, by kernel stack",
                ),
            ],
            TRACING,
        ),
        "leaks" => (
            &[
                (
                    "sudo kheap leaks -d 30",
                    "what was allocated in 30 seconds and is still held",
                ),
                (
                    "sudo kheap leaks -d 60 --snapshot-every 10 --snapshot-dir /tmp/s",
                    "a report, and a JSON snapshot every 10 seconds to compare with kheap diff",
                ),
                (
                    "sudo kheap leaks -r 3 -- kheap-load fds 4000 500 20",
                    "what a command left allocated when it ended",
                ),
            ],
            TRACING,
        ),
        "diff" => (
            &[
                (
                    "kheap diff before.json after.json",
                    "which sites grew or shrank between two JSON reports",
                ),
                (
                    "kheap diff before.json after.json --by stack --format svg -o diff.svg",
                    "a flame graph of the change: red grew, blue shrank",
                ),
            ],
            PLAIN,
        ),
        "slab" => (
            &[
                ("sudo kheap slab", "slab caches by memory, from /proc/slabinfo"),
                (
                    "sudo kheap slab -r 3 --sort waste -- kheap-load msg 2000 2100",
                    "caches and the traced allocations of a command",
                ),
                (
                    "sudo kheap slab -d 30 --sort growth",
                    "caches by what 30 seconds allocated and still hold, and the site holding most",
                ),
                ("sudo kheap slab --watch 2", "cache growth every two seconds"),
            ],
            TRACING,
        ),
        "malloc" => (
            &[
                (
                    "sudo kheap malloc -p 1234 -d 10",
                    "who calls malloc in a running process",
                ),
                (
                    "sudo kheap malloc -r 4 --outstanding -- python3 -c 'print(1)'",
                    "what a command allocated and never freed",
                ),
            ],
            TRACING,
        ),
        "top" => (
            &[
                (
                    "sudo kheap top",
                    "full screen, refreshed every second (h or ? lists the keys)",
                ),
                (
                    "sudo kheap top -b -n 3 -r 10",
                    "three intervals of plain text, ten rows each, then exit",
                ),
                (
                    "sudo kheap top -b --format json -i 5",
                    "one JSON object per line every five seconds",
                ),
            ],
            &[
                (
                    "0",
                    "q, Ctrl-C or SIGTERM, -n intervals shown, -d passed, every -p process exited, or the command exited with 0",
                ),
                (
                    "N",
                    "with -- CMD, the command's exit status when not 0 (128+S when signal S ended it)",
                ),
                ERROR,
                USAGE,
            ],
        ),
        "serve" => (
            &[
                (
                    "sudo kheap serve",
                    "metrics on http://127.0.0.1:9464/metrics for Prometheus",
                ),
                (
                    "sudo kheap serve --track-outstanding --listen 127.0.0.1:9464",
                    "with outstanding bytes and /pprof/inuse",
                ),
            ],
            &[
                ("0", "stopped by SIGTERM or Ctrl-C"),
                ERROR,
                USAGE,
            ],
        ),
        "doctor" => (
            &[(
                "sudo kheap doctor",
                "tracepoints, BTF, fentry and kprobes on this kernel",
            )],
            &[("0", "the checks were printed"), USAGE],
        ),
        "completions" => (
            &[(
                "kheap completions bash > /etc/bash_completion.d/kheap",
                "bash completion for every user",
            )],
            &[("0", "the script was printed"), USAGE],
        ),
        "man" => (
            &[(
                "kheap man --dir /usr/local/share/man/man1",
                "the man pages, the directory created if missing",
            )],
            &[("0", "the pages were written (their paths printed)"), ERROR, USAGE],
        ),
        _ => return None,
    })
}

/// The text after `--help`.
pub fn help_text(sub: &str) -> Option<String> {
    let (examples, statuses) = page(sub)?;
    let mut out = String::from("Examples:\n");
    for e in examples {
        let _ = writeln!(out, "  {}\n      {}", e.0, e.1);
    }
    out.push_str("\nExit status:\n");
    for (code, when) in statuses {
        let _ = writeln!(out, "  {code:<3} {when}");
    }
    Some(out.trim_end().to_string())
}

/// `after_long_help` on `kheap` and on each of its subcommands.
pub fn with_help(cmd: clap::Command) -> clap::Command {
    let mut cmd = match help_text("") {
        Some(text) => cmd.after_long_help(text),
        None => cmd,
    };
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    for name in names {
        if let Some(text) = help_text(&name) {
            cmd = cmd.mut_subcommand(&name, |s| s.after_long_help(text));
        }
    }
    cmd
}

/// The EXAMPLES and EXIT STATUS sections of a man page, in roff.
pub fn roff_sections(sub: &str) -> String {
    let Some((examples, statuses)) = page(sub) else {
        return String::new();
    };
    let mut out = String::from(".SH EXAMPLES\n");
    for e in examples {
        let _ = write!(out, ".TP\n.B {}\n{}\n", roff(e.0), roff(e.1));
    }
    out.push_str(".SH \"EXIT STATUS\"\n");
    for (code, when) in statuses {
        let _ = write!(out, ".TP\n.B {}\n{}\n", roff(code), roff(when));
    }
    out
}

/// Text as roff shows it: backslashes and minus signs escaped, and a
/// line never starting with a control character.
fn roff(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    if escaped.starts_with('.') || escaped.starts_with('\'') {
        format!("\\&{escaped}")
    } else {
        escaped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_has_examples_and_exit_statuses() {
        for sub in [
            "",
            "record",
            "leaks",
            "diff",
            "slab",
            "malloc",
            "top",
            "serve",
            "doctor",
            "completions",
            "man",
        ] {
            let (examples, statuses) = page(sub).unwrap_or_else(|| panic!("{sub}"));
            assert!(!examples.is_empty() && !statuses.is_empty(), "{sub}");
            assert!(examples.iter().all(|e| e.0.contains("kheap")));
            let text = help_text(sub).unwrap();
            assert!(text.starts_with("Examples:") && text.contains("\nExit status:\n"));
            let roff = roff_sections(sub);
            assert!(roff.contains(".SH EXAMPLES\n") && roff.contains(".SH \"EXIT STATUS\"\n"));
        }
        assert!(page("nothing").is_none());
    }

    #[test]
    fn roff_escapes_minus_and_backslash() {
        assert_eq!(roff("kheap top -b -n 3"), "kheap top \\-b \\-n 3");
        assert_eq!(roff("a\\b"), "a\\eb");
        assert_eq!(roff(".hidden"), "\\&.hidden");
    }
}
