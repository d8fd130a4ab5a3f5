//! Which files a program really loads: the program behind a `#!` script,
//! and the C library, C++ runtime and allocator libraries its dynamic
//! loader lists.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::elf::{interpreter, lookup_symbols, read_head};
use super::placement::plan;
use crate::sys::procmaps;

/// The program that really runs for `path`: scripts run their `#!`
/// interpreter (through `env` too).
pub fn executable_of(path: &Path) -> Result<PathBuf> {
    let head = read_head(path, 256)?;
    if !head.starts_with(b"#!") {
        return Ok(path.to_path_buf());
    }
    let line = String::from_utf8_lossy(&head[2..]);
    let line = line.lines().next().unwrap_or("");
    let mut words = line.split_whitespace();
    let Some(interp) = words.next() else {
        bail!("{}: empty #! line", path.display());
    };
    let interp = if Path::new(interp).file_name().is_some_and(|n| n == "env") {
        match words.find(|w| !w.starts_with('-')) {
            Some(prog) => crate::target::find_program(prog)?,
            None => bail!("{}: '#!{line}' names no program", path.display()),
        }
    } else {
        PathBuf::from(interp)
    };
    Ok(interp)
}

/// The C library in the output of `ld.so --list` (the format ldd prints).
pub fn parse_ld_list(text: &str) -> Option<PathBuf> {
    parse_ld_list_for(text, procmaps::is_libc_name)
}

/// The first library in the output of `ld.so --list` whose name matches.
fn parse_ld_list_for(text: &str, matches: fn(&Path) -> bool) -> Option<PathBuf> {
    text.lines().find_map(|l| {
        let (name, rest) = l.trim().split_once(" => ")?;
        let path = rest.split_whitespace().next()?;
        (matches(Path::new(name)) && path.starts_with('/')).then(|| PathBuf::from(path))
    })
}

/// Every library in the output of `ld.so --list` whose name matches.
pub(super) fn parse_ld_list_all(text: &str, matches: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once(" => ")?;
            let path = rest.split_whitespace().next()?;
            (matches(Path::new(name)) && path.starts_with('/')).then(|| PathBuf::from(path))
        })
        .collect()
}

/// Whether a file defines allocator functions kheap probes: the malloc
/// family (plain or prefixed, e.g. `je_malloc`), C++ operator new, or a
/// Rust global allocator. Finds allocators linked into a program, and
/// libraries not known by name.
pub fn defines_allocator(path: &Path) -> bool {
    lookup_symbols(path).is_ok_and(|s| plan(&s).is_ok())
}

/// The C++ runtime (libstdc++ or libc++, for operator new) and allocator
/// libraries (jemalloc, tcmalloc, mimalloc by name, or any other library
/// that defines the family, plain or prefixed; linked or in LD_PRELOAD) a
/// program will load, as its dynamic loader lists them.
pub fn extra_allocators_of_program(program: &Path) -> Result<Vec<PathBuf>> {
    let exe = executable_of(program)?;
    let Some(interp) = interpreter(&exe)? else {
        return Ok(Vec::new());
    };
    if procmaps::is_libc_name(&interp) {
        return Ok(Vec::new());
    }
    let text = loader_list(&interp, &exe)?;
    Ok(parse_ld_list_all(&text, |_| true)
        .into_iter()
        .filter(|lib| {
            procmaps::is_extra_allocator_name(lib)
                || !procmaps::is_libc_name(lib) && defines_allocator(lib)
        })
        .collect())
}

/// What a program's dynamic loader says it would load (`ld.so --list`,
/// what ldd does): it runs none of the program's code.
fn loader_list(interp: &Path, exe: &Path) -> Result<String> {
    let out = Command::new(interp)
        .arg("--list")
        .arg(exe)
        .output()
        .with_context(|| format!("running {} --list", interp.display()))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The C library a program will load when run: asks its own dynamic loader
/// (`ld.so --list`, what ldd does), which runs none of the program's code.
pub fn libc_of_program(program: &Path) -> Result<PathBuf> {
    let exe = executable_of(program)?;
    let Some(interp) = interpreter(&exe)? else {
        bail!(
            "{} is statically linked: it loads no C library to probe (use --lib {} if it has its own malloc)",
            exe.display(),
            exe.display()
        );
    };
    if procmaps::is_libc_name(&interp) {
        // musl: the loader is the C library.
        return Ok(interp);
    }
    let text = loader_list(&interp, &exe)?;
    parse_ld_list(&text).ok_or_else(|| {
        anyhow::anyhow!(
            "{} does not load a C library (libc.so.6): use --lib PATH to name its allocator",
            exe.display()
        )
    })
}
