//! The layers of the crate and the one direction imports may take between
//! them, checked by reading the sources (test only).
//!
//! base (symbols, processes, /proc parsing) <- model (pure types and maths)
//! <- report (merging, retention, scaling) <- render (tables, histograms,
//! folded) <- cmd. The kernel layer (everything that touches libbpf) stands
//! apart: it fills model types and is used by cmd only. Every file of the
//! library is placed in one layer below; a new file must be placed too.
//!
//! Each subcommand has a room (its module in `cmd` and the folder of its
//! own logic, ROOMS below): no room imports from another, so what two
//! commands share lives outside every room (`session`, `output`, `report`,
//! `render` …), and nothing outside the rooms imports from one (a shared
//! module that needs a command's type takes it from a shared one, or the
//! code moves into the room). clap stays in the command layers: model,
//! report and kernel types do not parse command lines.
//!
//! What counts as an import: every `crate::…` path outside comments and
//! test modules (inline ones and `tests.rs` files; in `use` lines or
//! inline), `super::…` and `self::…`
//! paths, and a `mod.rs`'s `use child::…`. A path names the deepest module
//! file it reaches.

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
    enum Layer {
        Base,
        Model,
        Report,
        Render,
        Cmd,
        Kernel,
    }
    use Layer::*;

    /// Module paths (`a::b`; `a::*` for a module and everything under it)
    /// and their layer. The crate root (lib.rs) is "".
    const LAYERS: &[(&str, Layer)] = &[
        ("", Cmd),
        ("cli", Cmd),
        ("cmd::*", Cmd),
        // What every tracing command does around its tracer; the help text
        // of all of them.
        ("session::*", Cmd),
        ("help", Cmd),
        ("kernel::*", Kernel),
        // What differs by CPU architecture (unwinding, library paths).
        ("arch", Base),
        // The user-space allocators malloc probes: their functions (shared
        // with the BPF side), ELF symbols, which files to probe.
        ("allocators::*", Base),
        ("symbolize::*", Base),
        ("cgroup", Base),
        ("clock", Base),
        // Small reads of the system; /proc/slabinfo and SLUB's sysfs.
        ("sys::*", Base),
        ("target", Base),
        ("tree", Base),
        ("signals", Base),
        ("output", Base),
        ("safe_path", Base),
        ("input", Base),
        ("model::*", Model),
        ("contract", Model),
        // The kernel's latency readings and the rows made of them.
        ("latency", Model),
        ("report::*", Report),
        ("render::*", Render),
        ("diff", Render),
        ("layers", Base),
        ("testing", Model),
        ("leaks", Cmd),
        ("leaks::render", Render),
        ("leaks::chart::*", Render),
        ("malloc", Cmd),
        ("malloc::preload", Base),
        ("malloc::report", Report),
        // Unwinding sampled stack copies, and which stack a row is shown
        // along: processing between the model and the rows.
        ("malloc::unwind", Report),
        ("malloc::merge", Report),
        ("malloc::pprof", Render),
        ("malloc::render", Render),
        ("slab", Cmd),
        ("slab::snapshot", Model),
        ("slab::traced", Model),
        ("slab::hints", Report),
        ("slab::hints::evidence", Report),
        ("slab::watch", Report),
        ("slab::report", Report),
        ("slab::render", Render),
        ("serve", Cmd),
        ("serve::series", Report),
        ("serve::cgroups", Report),
        ("serve::processes", Report),
        ("serve::families", Render),
        ("serve::exposition", Render),
        ("serve::profile", Render),
        ("serve::triggers", Render),
        // The HTTP server: sockets, TLS, the web config.
        ("serve::http", Base),
        ("serve::listen", Base),
        ("serve::webconfig", Base),
        ("serve::server", Base),
        // What each path answers, from the published families.
        ("serve::routes", Render),
        ("record", Cmd),
        ("record::view", Render),
        ("top", Cmd),
        ("top::view", Render),
        ("top::columns", Render),
        ("top::batch", Render),
        ("top::tui", Render),
    ];

    /// Each subcommand's room: its module in `cmd` and the modules of its
    /// own logic (patterns as in LAYERS). A new subcommand gets a room.
    const ROOMS: &[(&str, &[&str])] = &[
        ("record", &["cmd::record", "record::*"]),
        ("leaks", &["cmd::leaks::*", "leaks::*"]),
        ("diff", &["cmd::diff", "diff"]),
        ("slab", &["cmd::slab::*", "slab::*"]),
        ("malloc", &["cmd::malloc::*", "malloc::*"]),
        ("top", &["cmd::top", "top::*"]),
        ("serve", &["cmd::serve::*", "serve::*"]),
        ("doctor", &["cmd::doctor"]),
        ("generate", &["cmd::generate"]),
    ];

    /// Imports from one room into another known and waiting for a fix, as
    /// (module, module it imports). Keep this empty; an entry here is a
    /// debt, not a permission.
    const KNOWN_CROSSINGS: &[(&str, &str)] = &[];

    /// Imports from a module outside every room into a room, known and
    /// waiting for a fix, as (module, module it imports). Keep this empty;
    /// an entry here is a debt, not a permission.
    const KNOWN_INTO_ROOMS: &[(&str, &str)] = &[];

    /// Modules of the model, report and kernel layers that still use clap,
    /// waiting for a fix. Keep this empty; an entry here is a debt.
    const KNOWN_CLAP: &[&str] = &[];

    /// Circles known and waiting for a fix, as (module, module it imports):
    /// the edge is left out of the circle check. Keep this empty; an entry
    /// here is a debt, not a permission.
    const KNOWN_CIRCLES: &[(&str, &str)] = &[];

    /// Whether `module` is `pattern` (`a::b`, or `a::*` for `a` and
    /// everything under it).
    fn matches(pattern: &str, module: &str) -> bool {
        match pattern.strip_suffix("::*") {
            Some(base) => module == base || module.starts_with(&format!("{base}::")),
            None => module == pattern,
        }
    }

    fn layer_of(module: &str) -> Option<Layer> {
        LAYERS
            .iter()
            .find_map(|&(m, l)| matches(m, module).then_some(l))
    }

    fn room_of(module: &str) -> Option<&'static str> {
        ROOMS
            .iter()
            .find_map(|&(room, ms)| ms.iter().any(|m| matches(m, module)).then_some(room))
    }

    /// Whether a file's code (comments and tests left out) uses clap.
    fn uses_clap(code: &str) -> bool {
        code.contains("clap::") || code.contains("use clap")
    }

    fn allowed(from: Layer, to: Layer) -> bool {
        match (from, to) {
            (Kernel, to) => matches!(to, Base | Model | Kernel),
            (from, Kernel) => from == Cmd,
            (from, to) => to <= from,
        }
    }

    fn src() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
    }

    /// Every library source file with its module path (`a::b`).
    fn modules() -> BTreeMap<String, PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        let root = src();
        let mut files = Vec::new();
        walk(&root, &mut files);
        let mut out = BTreeMap::new();
        for f in files {
            let rel = f.strip_prefix(&root).unwrap().with_extension("");
            let mut segs: Vec<String> = rel
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect();
            match segs.first().map(String::as_str) {
                // Binaries, not the library.
                Some("main") | Some("bin") => continue,
                _ => {}
            }
            if matches!(segs.last().map(String::as_str), Some("mod") | Some("lib")) {
                segs.pop();
            }
            // A module's unit tests in a file of their own (`x/tests.rs`,
            // declared `#[cfg(test)] mod tests;`): test code, left out as
            // the inline test modules are.
            if segs.len() > 1 && segs.last().is_some_and(|s| s == "tests") {
                continue;
            }
            out.insert(segs.join("::"), f);
        }
        out
    }

    /// The source without comments and without the trailing test module.
    fn code(text: &str) -> String {
        let lines: Vec<&str> = text.lines().collect();
        let end = (0..lines.len())
            .find(|&i| {
                lines[i].trim() == "#[cfg(test)]"
                    && lines.get(i + 1).is_some_and(|l| {
                        l.trim_start().starts_with("mod tests")
                            || l.trim_start().starts_with("pub mod tests")
                    })
            })
            .unwrap_or(lines.len());
        lines[..end]
            .iter()
            .map(|l| l.split_once("//").map_or(*l, |(code, _)| code))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn is_ident(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '_'
    }

    /// The paths a `use` tree or inline path names, starting at `at` (just
    /// after a `::`), each as the segments that follow `prefix`.
    fn paths_at(text: &str, at: usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut segs = prefix.to_vec();
        let mut rest = &text[at..];
        loop {
            rest = rest.trim_start();
            if let Some(group) = rest.strip_prefix('{') {
                // Split the group at its top-level commas.
                let mut depth = 0;
                let mut start = 0;
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            paths_at(&group[..i], start, &segs, out);
                            return;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            paths_at(&group[..i], start, &segs, out);
                            start = i + 1;
                        }
                        _ => {}
                    }
                }
                return;
            }
            let len = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
            if len == 0 {
                break;
            }
            segs.push(rest[..len].to_string());
            rest = &rest[len..];
            match rest.strip_prefix("::") {
                Some(r) => rest = r,
                None => break,
            }
        }
        out.push(segs);
    }

    /// Absolute module paths (segments) named in a file of module `module`.
    fn references(module: &str, text: &str, known: &BTreeMap<String, PathBuf>) -> Vec<Vec<String>> {
        let me: Vec<String> = if module.is_empty() {
            Vec::new()
        } else {
            module.split("::").map(String::from).collect()
        };
        let mut out = Vec::new();
        let bytes = text.as_bytes();
        let mut i = 0;
        while i < text.len() {
            let starts_word = i == 0 || !is_ident(bytes[i - 1] as char);
            let rest = &text[i..];
            let found = if !starts_word {
                None
            } else if rest.starts_with("crate::") {
                Some((7, Vec::new()))
            } else if rest.starts_with("self::") {
                Some((6, me.clone()))
            } else if rest.starts_with("super::") {
                let mut base = me.clone();
                let mut n = 0;
                while text[i + n..].starts_with("super::") {
                    base.pop();
                    n += 7;
                }
                Some((n, base))
            } else if let Some(used) = rest.strip_prefix("use ") {
                // `use child::…` in a module with that child.
                let after = used.trim_start();
                let len = after.find(|c: char| !is_ident(c)).unwrap_or(0);
                let child = format!(
                    "{}{}{}",
                    module,
                    if module.is_empty() { "" } else { "::" },
                    &after[..len]
                );
                (len > 0 && after[len..].starts_with("::") && known.contains_key(&child))
                    .then(|| (rest.len() - after.len(), me.clone()))
            } else {
                None
            };
            match found {
                Some((skip, prefix)) => {
                    paths_at(text, i + skip, &prefix, &mut out);
                    i += skip;
                }
                None => i += rest.chars().next().map_or(1, char::len_utf8),
            }
        }
        out
    }

    /// The deepest module file a path reaches.
    fn resolve(path: &[String], known: &BTreeMap<String, PathBuf>) -> String {
        let mut best = String::new();
        for n in 1..=path.len() {
            let m = path[..n].join("::");
            if known.contains_key(&m) {
                best = m;
            } else {
                break;
            }
        }
        best
    }

    fn graph() -> BTreeMap<String, BTreeSet<String>> {
        let known = modules();
        let mut g = BTreeMap::new();
        for (m, file) in &known {
            let text = code(&std::fs::read_to_string(file).unwrap());
            let deps: BTreeSet<String> = references(m, &text, &known)
                .iter()
                .map(|p| resolve(p, &known))
                .filter(|d| d != m && !d.is_empty())
                .collect();
            g.insert(m.clone(), deps);
        }
        g
    }

    #[test]
    fn every_module_has_a_layer() {
        let missing: Vec<String> = modules()
            .keys()
            .filter(|m| layer_of(m).is_none())
            .cloned()
            .collect();
        assert!(
            missing.is_empty(),
            "place these modules in LAYERS (src/layers.rs): {missing:?}"
        );
    }

    #[test]
    fn imports_go_one_way() {
        let mut wrong = Vec::new();
        for (m, deps) in graph() {
            let Some(from) = layer_of(&m) else { continue };
            for d in deps {
                let Some(to) = layer_of(&d) else { continue };
                if !allowed(from, to) {
                    wrong.push(format!("{m} ({from:?}) imports {d} ({to:?})"));
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "imports against the layers:\n{}",
            wrong.join("\n")
        );
    }

    #[test]
    fn every_command_has_a_room() {
        let missing: Vec<String> = modules()
            .keys()
            .filter(|m| m.starts_with("cmd::") && room_of(m).is_none())
            .cloned()
            .collect();
        assert!(
            missing.is_empty(),
            "give these commands a room in ROOMS (src/layers.rs): {missing:?}"
        );
    }

    /// One command's code is not another's library: what both need moves
    /// out of the rooms (to `session`, `output`, `report`, `render` …).
    #[test]
    fn no_command_imports_another() {
        let g = graph();
        for &(from, to) in KNOWN_CROSSINGS {
            assert!(
                g.get(from).is_some_and(|deps| deps.contains(to)),
                "{from} no longer imports {to}: drop it from KNOWN_CROSSINGS"
            );
        }
        let mut wrong = Vec::new();
        for (m, deps) in &g {
            let Some(from) = room_of(m) else { continue };
            for d in deps {
                let Some(to) = room_of(d) else { continue };
                if from != to && !KNOWN_CROSSINGS.contains(&(m.as_str(), d.as_str())) {
                    wrong.push(format!("{m} (room {from}) imports {d} (room {to})"));
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "imports from one command's room into another's (move what they share out of the rooms):\n{}",
            wrong.join("\n")
        );
    }

    /// The imports of `g` from a module outside every room into a room,
    /// but for the crate root and `cmd`, which declare the rooms' modules.
    fn imports_into_rooms(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
        let mut wrong = Vec::new();
        for (m, deps) in g {
            if room_of(m).is_some() || m.is_empty() || m == "cmd" {
                continue;
            }
            for d in deps {
                if let Some(to) = room_of(d) {
                    if !KNOWN_INTO_ROOMS.contains(&(m.as_str(), d.as_str())) {
                        wrong.push(format!("{m} (no room) imports {d} (room {to})"));
                    }
                }
            }
        }
        wrong
    }

    /// Shared code is below every command: a module outside the rooms
    /// (`report`, `render`, `cli`, `session`, the kernel layer …) imports
    /// nothing from one.
    #[test]
    fn shared_modules_import_no_room() {
        let g = graph();
        for &(from, to) in KNOWN_INTO_ROOMS {
            assert!(
                g.get(from).is_some_and(|deps| deps.contains(to)),
                "{from} no longer imports {to}: drop it from KNOWN_INTO_ROOMS"
            );
        }
        let wrong = imports_into_rooms(&g);
        assert!(
            wrong.is_empty(),
            "imports from a module outside every room into a command's room (move the shared part out of the room):\n{}",
            wrong.join("\n")
        );
    }

    /// The check above fails on a scratch upward import: a shared module
    /// of the report layer reaching into leaks' room, as
    /// `report::build` once did through `leaks::retention`.
    #[test]
    fn a_shared_module_importing_a_room_is_caught() {
        let mut g = graph();
        g.get_mut("report::build")
            .expect("report::build exists")
            .insert("leaks::render".to_string());
        g.entry("cli".to_string())
            .or_default()
            .insert("cmd::slab::args".to_string());
        let wrong = imports_into_rooms(&g);
        assert_eq!(
            wrong,
            [
                "cli (no room) imports cmd::slab::args (room slab)",
                "report::build (no room) imports leaks::render (room leaks)",
            ]
        );
    }

    #[test]
    fn clap_stays_in_the_command_layers() {
        let mut wrong = Vec::new();
        for (m, file) in modules() {
            if !matches!(layer_of(&m), Some(Model | Report | Kernel)) {
                continue;
            }
            let uses = uses_clap(&code(&std::fs::read_to_string(&file).unwrap()));
            let known = KNOWN_CLAP.contains(&m.as_str());
            assert!(
                uses || !known,
                "{m} no longer uses clap: drop it from KNOWN_CLAP"
            );
            if uses && !known {
                wrong.push(format!("{m} ({})", file.display()));
            }
        }
        assert!(
            wrong.is_empty(),
            "clap in the model, report or kernel layers (parse in cmd, convert there):\n{}",
            wrong.join("\n")
        );
    }

    #[test]
    fn no_import_circles() {
        fn visit(
            m: &str,
            g: &BTreeMap<String, BTreeSet<String>>,
            stack: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) -> Option<Vec<String>> {
            if let Some(i) = stack.iter().position(|s| s == m) {
                let mut circle = stack[i..].to_vec();
                circle.push(m.to_string());
                return Some(circle);
            }
            if done.contains(m) {
                return None;
            }
            stack.push(m.to_string());
            for d in g.get(m).into_iter().flatten() {
                if let Some(c) = visit(d, g, stack, done) {
                    return Some(c);
                }
            }
            stack.pop();
            done.insert(m.to_string());
            None
        }
        let mut g = graph();
        for (from, to) in KNOWN_CIRCLES {
            let gone = g.get_mut(*from).is_none_or(|deps| !deps.remove(*to));
            assert!(
                !gone,
                "{from} no longer imports {to}: drop it from KNOWN_CIRCLES"
            );
        }
        let mut done = BTreeSet::new();
        for m in g.keys() {
            if let Some(c) = visit(m, &g, &mut Vec::new(), &mut done) {
                panic!("import circle: {}", c.join(" -> "));
            }
        }
    }

    #[test]
    fn only_the_kernel_layer_uses_libbpf() {
        for (m, file) in modules() {
            if layer_of(&m) == Some(Kernel) {
                continue;
            }
            let text = code(&std::fs::read_to_string(&file).unwrap());
            assert!(
                !text.contains("libbpf_rs") && !text.contains("libbpf_sys"),
                "{} uses libbpf outside src/kernel",
                file.display()
            );
        }
    }

    /// The checker itself: it must see the kinds of paths the tree uses.
    #[test]
    fn the_checker_sees_grouped_relative_and_inline_paths() {
        let known: BTreeMap<String, PathBuf> = ["a", "a::b", "a::c", "d"]
            .iter()
            .map(|m| (m.to_string(), PathBuf::new()))
            .collect();
        let text = "use crate::a::{b::X, c::{self, Y}};\nuse super::d::Z;\nfn f() { crate::d::g(); }\nuse b::W;";
        let found: BTreeSet<String> = references("a", text, &known)
            .iter()
            .map(|p| resolve(p, &known))
            .collect();
        let want: BTreeSet<String> = ["a::b", "a::c", "d"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(found, want);
        assert!(!allowed(Model, Report) && allowed(Report, Model));
        assert!(!allowed(Kernel, Report) && !allowed(Render, Kernel) && allowed(Cmd, Kernel));
        assert_eq!(room_of("cmd::leaks"), room_of("leaks::render"));
        assert_ne!(room_of("cmd::leaks"), room_of("cmd::record"));
        assert_eq!(room_of("session"), None);
        assert!(uses_clap("#[derive(clap::ValueEnum)]") && !uses_clap("let clapper = 1;"));
        assert_eq!(
            code("use crate::a; // crate::d\n#[cfg(test)]\nmod tests {\n use crate::d;\n}"),
            "use crate::a; "
        );
    }
}
