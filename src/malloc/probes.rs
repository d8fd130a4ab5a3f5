//! Where the probes go: the allocator functions, the library that holds
//! them (the one the target really maps), and the instruction each probe
//! sits on.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// How a function's arguments are read: one BPF program per layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `f(size)`: malloc, valloc, pvalloc
    Size,
    /// `calloc(n, size)`: counts n * size bytes
    Calloc,
    /// `f(align, size)`: memalign, aligned_alloc
    AlignSize,
    /// `posix_memalign(&ptr, align, size)`: the block comes back through ptr
    PosixMemalign,
    /// `realloc(ptr, size)`: a resize, counted at the new size
    Realloc,
    /// `reallocarray(ptr, n, size)`
    Reallocarray,
    /// `free(ptr)`
    Free,
    /// `__rust_realloc(ptr, old_size, align, new_size)`
    RustRealloc,
}

pub struct AllocFn {
    /// The row label (`allocator` column).
    pub name: &'static str,
    /// The symbol probed: C names as they are, C++ operators mangled.
    pub symbol: &'static str,
    pub layout: Layout,
}

/// C++ `operator new` and `new[]` (plain, nothrow, aligned): allocation
/// functions of their own, whose row label is the program's code that calls
/// them. libstdc++ and libc++ implement them with malloc (or aligned_alloc),
/// and new[] by calling new: those inner calls are the allocator's own and
/// counted once, as the outer call (see `crate::kernel::malloc`).
/// `operator delete` is not probed: it frees through free(), which is.
const CXX_NEW: &[(&str, &str)] = &[
    ("new", "_Znwm"),
    ("new[]", "_Znam"),
    ("new(nothrow)", "_ZnwmRKSt9nothrow_t"),
    ("new[](nothrow)", "_ZnamRKSt9nothrow_t"),
    ("new(align)", "_ZnwmSt11align_val_t"),
    ("new[](align)", "_ZnamSt11align_val_t"),
    ("new(align,nothrow)", "_ZnwmSt11align_val_tRKSt9nothrow_t"),
    ("new[](align,nothrow)", "_ZnamSt11align_val_tRKSt9nothrow_t"),
];

/// Index of the first C++ entry point in FUNCTIONS.
pub const FIRST_CXX: usize = 10;
/// Index of the first Rust entry point in FUNCTIONS: the global allocator's
/// entry points, in the program itself. `__rust_dealloc` is not probed: the
/// default allocator frees through free(), which is.
pub const FIRST_RUST: usize = FIRST_CXX + CXX_NEW.len();

/// The allocation family. A probe's attach cookie is its index here, which
/// is how rows know their function.
pub const FUNCTIONS: &[AllocFn] = &[
    AllocFn {
        name: "malloc",
        symbol: "malloc",
        layout: Layout::Size,
    },
    AllocFn {
        name: "calloc",
        symbol: "calloc",
        layout: Layout::Calloc,
    },
    AllocFn {
        name: "realloc",
        symbol: "realloc",
        layout: Layout::Realloc,
    },
    AllocFn {
        name: "reallocarray",
        symbol: "reallocarray",
        layout: Layout::Reallocarray,
    },
    AllocFn {
        name: "posix_memalign",
        symbol: "posix_memalign",
        layout: Layout::PosixMemalign,
    },
    AllocFn {
        name: "aligned_alloc",
        symbol: "aligned_alloc",
        layout: Layout::AlignSize,
    },
    AllocFn {
        name: "memalign",
        symbol: "memalign",
        layout: Layout::AlignSize,
    },
    AllocFn {
        name: "valloc",
        symbol: "valloc",
        layout: Layout::Size,
    },
    AllocFn {
        name: "pvalloc",
        symbol: "pvalloc",
        layout: Layout::Size,
    },
    AllocFn {
        name: "free",
        symbol: "free",
        layout: Layout::Free,
    },
    // FIRST_CXX: CXX_NEW in order (all take the size first).
    AllocFn {
        name: CXX_NEW[0].0,
        symbol: CXX_NEW[0].1,
        layout: Layout::Size,
    },
    AllocFn {
        name: CXX_NEW[1].0,
        symbol: CXX_NEW[1].1,
        layout: Layout::Size,
    },
    AllocFn {
        name: CXX_NEW[2].0,
        symbol: CXX_NEW[2].1,
        layout: Layout::Size,
    },
    AllocFn {
        name: CXX_NEW[3].0,
        symbol: CXX_NEW[3].1,
        layout: Layout::Size,
    },
    AllocFn {
        name: CXX_NEW[4].0,
        symbol: CXX_NEW[4].1,
        layout: Layout::Size,
    },
    AllocFn {
        name: CXX_NEW[5].0,
        symbol: CXX_NEW[5].1,
        layout: Layout::Size,
    },
    AllocFn {
        name: CXX_NEW[6].0,
        symbol: CXX_NEW[6].1,
        layout: Layout::Size,
    },
    AllocFn {
        name: CXX_NEW[7].0,
        symbol: CXX_NEW[7].1,
        layout: Layout::Size,
    },
    // FIRST_RUST: `__rust_alloc(size, align)`…, found by demangled name.
    AllocFn {
        name: "rust",
        symbol: "__rust_alloc",
        layout: Layout::Size,
    },
    AllocFn {
        name: "rust_zeroed",
        symbol: "__rust_alloc_zeroed",
        layout: Layout::Size,
    },
    AllocFn {
        name: "rust_realloc",
        symbol: "__rust_realloc",
        layout: Layout::RustRealloc,
    },
];

/// Whether an ELF symbol is the Rust runtime function `name`: unmangled
/// (older toolchains), or v0-mangled with a crate hash
/// (`_RNvCs…_7___rustc12___rust_alloc`: the identifier's length, a `_`
/// separator since it starts with `_`, then the identifier).
pub fn is_rust_symbol(symbol: &str, name: &str) -> bool {
    if symbol == name {
        return true;
    }
    let tail = format!("{}_{name}", name.len());
    symbol.starts_with("_R")
        && symbol.ends_with(&tail)
        && !symbol[..symbol.len() - tail.len()].ends_with(|c: char| c.is_ascii_digit())
}

/// A function's symbol in the library: where it starts in the file, and
/// its first bytes (to choose the probed instruction).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    pub file_offset: u64,
    pub size: u64,
    pub code: Vec<u8>,
}

/// One uprobe to attach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Index into FUNCTIONS, passed as the attach cookie.
    pub cookie: u32,
    /// The name rows show: aliases at one address are joined (glibc 2.36's
    /// aligned_alloc is memalign), as a probe cannot tell them apart.
    pub label: String,
    pub layout: Layout,
    pub file_offset: u64,
    /// The function's size in bytes (0 if the symbol table does not say).
    pub size: u64,
    /// Bytes past the symbol's start the probe sits on.
    pub skip: u64,
}

/// Where a function's probe goes, in bytes past its first instruction.
///
/// A uprobe whose instruction the kernel can emulate costs ~0.5 us a hit;
/// one it has to single-step out of line ~9 us (measured on the reference
/// VM). Several glibc allocator functions start with an instruction that is
/// stepped but changes no register the probes read (the argument registers,
/// the stack pointer) and cannot jump, followed by one that is emulated (a
/// push or a branch). The probe, entry and return alike, goes on that second
/// instruction: the arguments and the return address at the stack pointer
/// are still as on entry. glibc 2.36: free starts `test %rdi,%rdi; je`;
/// memalign, posix_memalign, valloc and pvalloc start `cmpb $0,x(%rip)`
/// followed by `je` or `push`. Any other prologue keeps the first
/// instruction.
pub fn probe_skip(code: &[u8]) -> u64 {
    let (skip, next) = match code {
        // test %rdi,%rdi
        [0x48, 0x85, 0xff, next @ ..] => (3, next),
        // cmpb $imm8, disp32(%rip)
        [0x80, 0x3d, _, _, _, _, _, next @ ..] => (7, next),
        _ => return 0,
    };
    if emulated(next) {
        skip
    } else {
        0
    }
}

/// Instructions x86 uprobes emulate instead of single-stepping: push of a
/// register, jumps, calls and conditional branches.
fn emulated(code: &[u8]) -> bool {
    matches!(
        code,
        [0x50..=0x57, ..]
            | [0x41, 0x50..=0x57, ..]
            | [0x70..=0x7f, ..]
            | [0x0f, 0x80..=0x8f, ..]
            | [0xe8 | 0xe9 | 0xeb, ..]
    )
}

/// Plans the probes for the symbols found in a library (`None`: the library
/// does not export that function). Returns the probes and the names that
/// are missing.
/// A library that exports operator new but not malloc (libstdc++, libc++)
/// gets probes on its operators only.
pub fn plan(symbols: &[Option<Symbol>]) -> Result<(Vec<Probe>, Vec<&'static str>)> {
    let has_malloc = symbols.first().is_some_and(Option::is_some);
    // C++ operators or Rust entry points
    let has_new = symbols.iter().skip(FIRST_CXX).any(Option::is_some);
    if !has_malloc && !has_new {
        bail!("it does not export malloc (nor C++ operator new)");
    }
    let mut probes: Vec<Probe> = Vec::new();
    let mut missing = Vec::new();
    for (i, (f, sym)) in FUNCTIONS.iter().zip(symbols).enumerate() {
        let Some(sym) = sym else {
            if i < FIRST_CXX && has_malloc {
                missing.push(f.name);
            }
            continue;
        };
        if let Some(p) = probes
            .iter_mut()
            .find(|p| p.file_offset == sym.file_offset && p.layout == f.layout)
        {
            p.label = format!("{}|{}", p.label, f.name);
            continue;
        }
        let skip = probe_skip(&sym.code);
        probes.push(Probe {
            cookie: i as u32,
            label: f.name.to_string(),
            layout: f.layout,
            file_offset: sym.file_offset,
            size: sym.size,
            skip,
        });
    }
    Ok((probes, missing))
}

/// Looks the family up in a library's dynamic symbols.
pub fn lookup_symbols(lib: &Path) -> Result<Vec<Option<Symbol>>> {
    use blazesym::inspect::{source::Elf, source::Source, Inspector};
    check_elf(lib)?;
    let names: Vec<&str> = FUNCTIONS.iter().map(|f| f.symbol).collect();
    let mut elf = Elf::new(lib);
    elf.debug_syms = false;
    let inspector = Inspector::new();
    let found = inspector
        .lookup(&Source::Elf(elf), &names)
        .with_context(|| format!("reading the symbols of {}", lib.display()))?;
    // Rust entry points carry a crate hash in their mangled names: the
    // symbol table is searched for them (programs only: libraries never
    // hold a Rust program's global allocator).
    let mut rust: Vec<Option<(u64, u64)>> = vec![None; FUNCTIONS.len() - FIRST_RUST];
    if !lib.to_string_lossy().contains(".so") {
        let mut elf = Elf::new(lib);
        elf.debug_syms = false;
        inspector
            .for_each(&Source::Elf(elf), |s| {
                for (slot, f) in rust.iter_mut().zip(&FUNCTIONS[FIRST_RUST..]) {
                    if slot.is_none() && is_rust_symbol(&s.name, f.symbol) {
                        if let Some(off) = s.file_offset {
                            *slot = Some((off, s.size.unwrap_or(0) as u64));
                        }
                    }
                }
                std::ops::ControlFlow::Continue(())
            })
            .with_context(|| format!("reading the symbols of {}", lib.display()))?;
    }
    let mut file = fs::File::open(lib).with_context(|| format!("opening {}", lib.display()))?;
    let mut out = Vec::new();
    for (i, infos) in found.iter().enumerate() {
        let found = infos
            .iter()
            .find_map(|s| Some((s.file_offset?, s.size.unwrap_or(0) as u64)));
        let Some((off, size)) = found.or_else(|| i.checked_sub(FIRST_RUST).and_then(|r| rust[r]))
        else {
            out.push(None);
            continue;
        };
        let mut code = vec![0u8; 16];
        use std::io::{Seek, SeekFrom};
        file.seek(SeekFrom::Start(off))?;
        let n = file.read(&mut code)?;
        code.truncate(n);
        out.push(Some(Symbol {
            file_offset: off,
            size,
            code,
        }));
    }
    Ok(out)
}

const ELF_MAGIC: &[u8; 4] = b"\x7fELF";

/// A clear error for anything that is not an ELF file.
pub fn check_elf(path: &Path) -> Result<()> {
    let head = read_head(path, 4)?;
    if head != ELF_MAGIC {
        bail!("{} is not an ELF file", path.display());
    }
    Ok(())
}

fn read_head(path: &Path, n: usize) -> Result<Vec<u8>> {
    let mut f = fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut buf = vec![0u8; n];
    let got = f.read(&mut buf)?;
    buf.truncate(got);
    Ok(buf)
}

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

/// The ELF program interpreter (dynamic loader) of an executable, or `None`
/// for a static executable.
pub fn interpreter(exe: &Path) -> Result<Option<PathBuf>> {
    let data = fs::read(exe).with_context(|| format!("reading {}", exe.display()))?;
    parse_interpreter(&data).with_context(|| format!("{} is not an ELF executable", exe.display()))
}

/// PT_INTERP of a 64-bit little-endian ELF image.
pub fn parse_interpreter(data: &[u8]) -> Result<Option<PathBuf>> {
    if data.get(..4) != Some(ELF_MAGIC) {
        bail!("no ELF header");
    }
    if data.get(4) != Some(&2) || data.get(5) != Some(&1) {
        bail!("not a 64-bit little-endian ELF file");
    }
    let u16_at = |o: usize| {
        data.get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
    };
    let u64_at = |o: usize| {
        data.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()) as usize)
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        bail!("truncated ELF header");
    };
    const PT_INTERP: u32 = 3;
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        let Some(kind) = data.get(ph..ph + 4) else {
            bail!("truncated program headers");
        };
        if u32::from_le_bytes(kind.try_into().unwrap()) != PT_INTERP {
            continue;
        }
        let (Some(off), Some(size)) = (u64_at(ph + 8), u64_at(ph + 32)) else {
            bail!("truncated program headers");
        };
        let Some(raw) = data.get(off..off + size) else {
            bail!("PT_INTERP outside the file");
        };
        let s = String::from_utf8_lossy(raw);
        return Ok(Some(PathBuf::from(s.trim_end_matches('\0'))));
    }
    Ok(None)
}

/// The C library in the output of `ld.so --list` (the format ldd prints).
pub fn parse_ld_list(text: &str) -> Option<PathBuf> {
    parse_ld_list_for(text, super::procmaps::is_libc_name)
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
fn parse_ld_list_all(text: &str, matches: fn(&Path) -> bool) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once(" => ")?;
            let path = rest.split_whitespace().next()?;
            (matches(Path::new(name)) && path.starts_with('/')).then(|| PathBuf::from(path))
        })
        .collect()
}

/// The C++ runtime (libstdc++ or libc++, for operator new) and allocator
/// libraries (jemalloc, tcmalloc, mimalloc, linked or in LD_PRELOAD) a
/// program will load, as its dynamic loader lists them.
pub fn extra_allocators_of_program(program: &Path) -> Result<Vec<PathBuf>> {
    let exe = executable_of(program)?;
    let Some(interp) = interpreter(&exe)? else {
        return Ok(Vec::new());
    };
    if super::procmaps::is_libc_name(&interp) {
        return Ok(Vec::new());
    }
    let out = Command::new(&interp)
        .arg("--list")
        .arg(&exe)
        .output()
        .with_context(|| format!("running {} --list", interp.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(parse_ld_list_all(
        &text,
        super::procmaps::is_extra_allocator_name,
    ))
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
    if super::procmaps::is_libc_name(&interp) {
        // musl: the loader is the C library.
        return Ok(interp);
    }
    let out = Command::new(&interp)
        .arg("--list")
        .arg(&exe)
        .output()
        .with_context(|| format!("running {} --list", interp.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_ld_list(&text).ok_or_else(|| {
        anyhow::anyhow!(
            "{} does not load a C library (libc.so.6): use --lib PATH to name its allocator",
            exe.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(off: u64, code: &[u8]) -> Option<Symbol> {
        Some(Symbol {
            file_offset: off,
            size: 0x100,
            code: code.to_vec(),
        })
    }

    #[test]
    fn probes_move_past_a_stepped_harmless_first_instruction() {
        // glibc 2.36 free: test %rdi,%rdi; je rel32
        assert_eq!(probe_skip(&[0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0, 0]), 3);
        assert_eq!(probe_skip(&[0x48, 0x85, 0xff, 0x74, 0x10]), 3);
        // posix_memalign: cmpb $0x0,0x140201(%rip); push %r12
        let cmpb = [0x80, 0x3d, 0x01, 0x02, 0x14, 0x00, 0x00];
        assert_eq!(probe_skip(&[&cmpb[..], &[0x41, 0x54]].concat()), 7);
        // memalign: cmpb …; je rel8
        assert_eq!(probe_skip(&[&cmpb[..], &[0x74, 0x07]].concat()), 7);
        // cmpb followed by mov: stays
        assert_eq!(probe_skip(&[&cmpb[..], &[0x48, 0x89, 0xde]].concat()), 0);
        // malloc: push %r12, emulated already
        assert_eq!(probe_skip(&[0x41, 0x54, 0x55, 0x53]), 0);
        // test followed by something that is not emulated
        assert_eq!(probe_skip(&[0x48, 0x85, 0xff, 0x48, 0x89]), 0);
        // truncated code
        assert_eq!(probe_skip(&[0x80, 0x3d, 0x01]), 0);
    }

    #[test]
    fn aliases_share_one_probe_and_missing_names_are_listed() {
        let mut syms: Vec<Option<Symbol>> = (0..FUNCTIONS.len() as u64)
            .map(|i| sym(0x1000 * (i + 1), &[0x55]))
            .collect();
        // a C library: no C++ operators
        syms[FIRST_CXX..].fill(None);
        let memalign = FUNCTIONS.iter().position(|f| f.name == "memalign").unwrap();
        let aligned = FUNCTIONS
            .iter()
            .position(|f| f.name == "aligned_alloc")
            .unwrap();
        let pvalloc = FUNCTIONS.iter().position(|f| f.name == "pvalloc").unwrap();
        syms[memalign] = syms[aligned].clone();
        syms[pvalloc] = None;
        let free = FIRST_CXX - 1;
        syms[free] = sym(0x9000, &[0x48, 0x85, 0xff, 0x0f, 0x84]);
        let (probes, missing) = plan(&syms).unwrap();
        assert_eq!(missing, vec!["pvalloc"]);
        assert_eq!(probes.len(), FIRST_CXX - 2);
        let a = probes.iter().find(|p| p.cookie == aligned as u32).unwrap();
        assert_eq!(a.label, "aligned_alloc|memalign");
        let f = probes.iter().find(|p| p.layout == Layout::Free).unwrap();
        assert_eq!((f.file_offset, f.skip), (0x9000, 3));
    }

    #[test]
    fn a_library_without_malloc_is_refused() {
        let e = plan(&vec![None; FUNCTIONS.len()]).unwrap_err().to_string();
        assert!(e.contains("does not export malloc"), "{e}");
    }

    #[test]
    fn rust_entry_points_by_mangled_name() {
        let m = "_RNvCsfLfy6EI15iL_7___rustc12___rust_alloc";
        assert!(is_rust_symbol(m, "__rust_alloc"));
        assert!(is_rust_symbol("__rust_alloc", "__rust_alloc"));
        assert!(!is_rust_symbol(m, "__rust_alloc_zeroed"));
        assert!(is_rust_symbol(
            "_RNvCsfLfy6EI15iL_7___rustc19___rust_alloc_zeroed",
            "__rust_alloc_zeroed"
        ));
        assert!(!is_rust_symbol(
            "_RNvCs1_7___rustc112___rust_alloc",
            "__rust_alloc"
        ));
        assert!(!is_rust_symbol(
            "_RNvCs1_7___rustc11___rdl_alloc",
            "__rust_alloc"
        ));
        assert!(!is_rust_symbol("my__rust_alloc", "__rust_alloc"));
    }

    #[test]
    fn a_cxx_runtime_gets_its_operators_only() {
        let mut syms = vec![None; FUNCTIONS.len()];
        syms[FIRST_CXX] = sym(0xa9570, &[0xf3, 0x0f, 0x1e, 0xfa]);
        syms[FIRST_CXX + 1] = sym(0xa95d0, &[0xf3, 0x0f, 0x1e, 0xfa]);
        let (probes, missing) = plan(&syms).unwrap();
        assert!(missing.is_empty(), "{missing:?}");
        let labels: Vec<&str> = probes.iter().map(|p| p.label.as_str()).collect();
        assert_eq!(labels, ["new", "new[]"]);
        assert_eq!(FUNCTIONS[FIRST_CXX].symbol, "_Znwm");
        assert_eq!(FIRST_RUST, FIRST_CXX + CXX_NEW.len());
        for (f, (name, symbol)) in FUNCTIONS[FIRST_CXX..].iter().zip(CXX_NEW) {
            assert_eq!((f.name, f.symbol), (*name, *symbol));
        }
    }

    #[test]
    fn ld_list_output_names_the_c_library() {
        let text = "\tlinux-vdso.so.1 (0x00007ffc)\n\
                    \tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x00007f)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ld_list(text),
            Some(PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"))
        );
        assert_eq!(parse_ld_list("\tlibm.so.6 => /lib/libm.so.6 (0x1)\n"), None);
        let cxx = "\tlibstdc++.so.6 => /lib/x86_64-linux-gnu/libstdc++.so.6 (0x7f)\n";
        let je = "\tlibjemalloc.so.2 => /lib/x86_64-linux-gnu/libjemalloc.so.2 (0x7f)\n";
        assert_eq!(
            parse_ld_list_all(
                &format!("{cxx}{text}{je}"),
                crate::malloc::procmaps::is_extra_allocator_name
            ),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libstdc++.so.6"),
                PathBuf::from("/lib/x86_64-linux-gnu/libjemalloc.so.2")
            ]
        );
    }

    #[test]
    fn elf_interpreter_and_bad_files() {
        let sh = crate::target::find_program("sh").unwrap();
        let sh = fs::canonicalize(sh).unwrap();
        let interp = interpreter(&sh).unwrap().expect("sh is dynamically linked");
        assert!(interp.to_string_lossy().contains("ld-linux"), "{interp:?}");
        assert!(libc_of_program(&sh).unwrap().ends_with("libc.so.6"));

        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("notes.txt");
        fs::write(&text, "hello").unwrap();
        let e = check_elf(&text).unwrap_err().to_string();
        assert!(e.contains("is not an ELF file"), "{e}");
        let e = format!("{:#}", libc_of_program(&text).unwrap_err());
        assert!(e.contains("not an ELF executable"), "{e}");

        let script = dir.path().join("s.sh");
        fs::write(&script, "#!/usr/bin/env sh\necho hi\n").unwrap();
        assert!(libc_of_program(&script).unwrap().ends_with("libc.so.6"));
    }
}
