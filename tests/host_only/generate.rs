//! `kheap completions` and `kheap man`: the generated files work in the
//! real consumers (bash's completion machinery, mandoc). No root needed.

use crate::common;

use std::process::Command;

use common::*;

/// Runs bash with the generated completion sourced, then SCRIPT.
fn bash_with_completion(script: &str) -> String {
    let out = kheap(&["completions", "bash"]);
    assert_ok(&out);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kheap.bash");
    std::fs::write(&file, &out.stdout).unwrap();
    let run = Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && {script}", file.display()))
        .output()
        .expect("bash");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8_lossy(&run.stdout).into_owned()
}

/// What bash offers for the words typed so far (the last one is being
/// completed), as the completion function registered for kheap answers.
fn complete(words: &[&str]) -> Vec<String> {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let cword = words.len() - 1;
    let prev = if cword > 0 { words[cword - 1] } else { "" };
    let script = format!(
        "COMP_WORDS=({}); COMP_CWORD={cword}; COMP_LINE='{}'; COMP_POINT=${{#COMP_LINE}}; \
         f=$(complete -p kheap | sed -n 's/.* -F \\([^ ]*\\) .*/\\1/p'); \
         \"$f\" kheap '{}' '{prev}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        quoted.join(" "),
        words.join(" "),
        words[cword],
    );
    bash_with_completion(&script)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completes_subcommands_flags_and_formats() {
    let registered = bash_with_completion("complete -p kheap");
    assert!(registered.contains("-F _kheap kheap"), "{registered}");
    assert_eq!(complete(&["kheap", "re"]), ["record"]);
    assert!(complete(&["kheap", "record", "--for"]).contains(&"--format".to_string()));
    assert_eq!(
        complete(&["kheap", "record", "--format", ""]),
        ["table", "json", "folded", "pprof", "svg"]
    );
}

#[test]
fn zsh_and_fish_completions_name_every_subcommand() {
    for shell in ["zsh", "fish"] {
        let out = kheap(&["completions", shell]);
        assert_ok(&out);
        let text = String::from_utf8_lossy(&out.stdout);
        for sub in [
            "record", "leaks", "diff", "slab", "malloc", "top", "doctor", "serve",
        ] {
            assert!(text.contains(sub), "{shell} lacks {sub}");
        }
    }
}

#[test]
fn man_pages_are_written_per_subcommand_and_lint_clean() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(KHEAP)
        .args(["man", "--dir", dir.path().to_str().unwrap()])
        .env("SOURCE_DATE_EPOCH", "1764547200")
        .output()
        .unwrap();
    assert_ok(&out);
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "kheap-completions.1",
            "kheap-diff.1",
            "kheap-doctor.1",
            "kheap-leaks.1",
            "kheap-malloc.1",
            "kheap-man.1",
            "kheap-record.1",
            "kheap-serve.1",
            "kheap-slab.1",
            "kheap-top.1",
            "kheap.1"
        ]
    );
    for name in &names {
        let path = dir.path().join(name);
        let lint = Command::new("mandoc")
            .args(["-T", "lint", "-W", "warning"])
            .arg(&path)
            .output()
            .expect("mandoc (scripts/setup installs it)");
        let said = String::from_utf8_lossy(&lint.stdout).into_owned()
            + &String::from_utf8_lossy(&lint.stderr);
        assert!(lint.status.success() && said.is_empty(), "{name}: {said}");
    }
    let record = std::fs::read_to_string(dir.path().join("kheap-record.1")).unwrap();
    assert!(record.contains(".TH kheap-record 1 2025-12-01"), "{record}");
    assert!(record.contains("svg"), "the formats are listed");
}

#[test]
fn man_creates_its_directory_but_never_through_a_link() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("share/man/man1");
    let out = kheap(&["man", "--dir", dir.to_str().unwrap()]);
    assert_ok(&out);
    assert!(dir.join("kheap-top.1").is_file());
    // A symbolic link (maybe another user's) is refused, not followed.
    let target = tmp.path().join("elsewhere");
    std::fs::create_dir(&target).unwrap();
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let out = kheap(&["man", "--dir", link.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("is a symbolic link"), "{err}");
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);
    // A file where the directory should be: one line, nothing written.
    let file = tmp.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let out = kheap(&["man", "--dir", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not a directory") && err.lines().count() == 1,
        "{err}"
    );
}

const SUBCOMMANDS: [&str; 10] = [
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
];

#[test]
fn help_and_man_pages_have_examples_and_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    assert_ok(&kheap(&["man", "--dir", dir.path().to_str().unwrap()]));
    for sub in SUBCOMMANDS {
        let page = std::fs::read_to_string(dir.path().join(format!("kheap-{sub}.1"))).unwrap();
        for section in [".SH EXAMPLES", ".SH \"EXIT STATUS\""] {
            assert!(page.contains(section), "kheap-{sub}.1 has no {section}");
        }
        let out = kheap(&[sub, "--help"]);
        assert_ok(&out);
        let help = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(help.contains("\nExamples:\n"), "kheap {sub} --help: {help}");
        assert!(
            help.contains("\nExit status:\n  0 "),
            "kheap {sub} --help: {help}"
        );
        // Every example is a real command line: its flags parse (--help
        // is put where the traced command, or a redirection, begins).
        let examples: Vec<&str> = help
            .split("\nExamples:\n")
            .nth(1)
            .unwrap()
            .split("\n\n")
            .next()
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("  ") && !l.starts_with("      "))
            .collect();
        assert!(!examples.is_empty(), "{help}");
        for example in examples {
            let words: Vec<&str> = example
                .split_whitespace()
                .skip_while(|w| *w == "sudo")
                .take_while(|w| *w != "--" && *w != ">")
                .collect();
            assert_eq!(words[..2], ["kheap", sub], "{example}");
            let mut args = words[1..].to_vec();
            args.push("--help");
            let out = kheap(&args);
            assert!(
                out.status.success(),
                "{example}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
