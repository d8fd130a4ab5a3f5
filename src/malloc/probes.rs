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
    /// `operator delete(ptr…)`, `__rust_dealloc(ptr, size, align)`: frees
    /// that may end in another probed free of the same block
    OuterFree,
    /// `__rust_realloc(ptr, old_size, align, new_size)`
    RustRealloc,
}

impl Layout {
    /// Whether the function frees (no size, no return probe).
    pub fn is_free(self) -> bool {
        matches!(self, Layout::Free | Layout::OuterFree)
    }
}

#[derive(Clone, Copy, Debug)]
pub struct AllocFn {
    /// The row label (`allocator` column).
    pub name: &'static str,
    /// The symbol probed: C names as they are, C++ operators mangled.
    pub symbol: &'static str,
    pub layout: Layout,
}

/// The C library's allocation family (and free).
const C_FUNCTIONS: [AllocFn; 10] = [
    c_fn("malloc", Layout::Size),
    c_fn("calloc", Layout::Calloc),
    c_fn("realloc", Layout::Realloc),
    c_fn("reallocarray", Layout::Reallocarray),
    c_fn("posix_memalign", Layout::PosixMemalign),
    c_fn("aligned_alloc", Layout::AlignSize),
    c_fn("memalign", Layout::AlignSize),
    c_fn("valloc", Layout::Size),
    c_fn("pvalloc", Layout::Size),
    c_fn("free", Layout::Free),
];

const fn c_fn(name: &'static str, layout: Layout) -> AllocFn {
    AllocFn {
        name,
        symbol: name,
        layout,
    }
}

/// A C++ operator (`new` and `new[]`, or `delete` and `delete[]`) in each of
/// its variants: `(label suffix, mangled parameters after the first)`. The
/// single-object and array forms alternate.
macro_rules! cxx_operators {
    ($layout:expr, ($one:literal, $one_mangled:literal), ($array:literal, $array_mangled:literal):
     $(($label:literal, $params:literal)),* $(,)?) => {
        [$(
            AllocFn {
                name: concat!($one, $label),
                symbol: concat!($one_mangled, $params),
                layout: $layout,
            },
            AllocFn {
                name: concat!($array, $label),
                symbol: concat!($array_mangled, $params),
                layout: $layout,
            },
        )*]
    };
}

/// C++ `operator new` and `new[]` (plain, nothrow, aligned): allocation
/// functions of their own, whose row label is the program's code that calls
/// them. libstdc++ and libc++ implement them with malloc (or aligned_alloc),
/// and new[] by calling new: those inner calls are the allocator's own and
/// counted once, as the outer call (see `crate::kernel::malloc`). All take
/// the size first.
const CXX_NEW: [AllocFn; 8] = cxx_operators!(Layout::Size, ("new", "_Znwm"), ("new[]", "_Znam"):
    ("", ""),
    ("(nothrow)", "RKSt9nothrow_t"),
    ("(align)", "St11align_val_t"),
    ("(align,nothrow)", "St11align_val_tRKSt9nothrow_t"),
);

/// C++ `operator delete` and `delete[]` (plain, sized, nothrow, aligned):
/// frees, probed with the other frees when outstanding memory is tracked.
/// libstdc++'s (and jemalloc's unsized) end in free(), whose call of the
/// same block is the allocator's own and not counted again; jemalloc's and
/// tcmalloc's sized ones free without free(), and are only seen here. All
/// take the pointer first.
const CXX_DELETE: [AllocFn; 12] = cxx_operators!(Layout::OuterFree, ("delete", "_ZdlPv"), ("delete[]", "_ZdaPv"):
    ("", ""),
    ("(sized)", "m"),
    ("(nothrow)", "RKSt9nothrow_t"),
    ("(align)", "St11align_val_t"),
    ("(sized,align)", "mSt11align_val_t"),
    ("(align,nothrow)", "St11align_val_tRKSt9nothrow_t"),
);

/// Index of the first C++ entry point in FUNCTIONS.
pub const FIRST_CXX: usize = C_FUNCTIONS.len();
/// Index of the first Rust entry point in FUNCTIONS: the global allocator's
/// entry points, in the program itself.
pub const FIRST_RUST: usize = FIRST_CXX + CXX_NEW.len() + CXX_DELETE.len();

/// Rust's global allocator entry points, `__rust_alloc(size, align)`…,
/// found by demangled name. `__rust_dealloc(ptr, size, align)` is a free:
/// the default allocator's ends in free() (not counted again), others
/// (jemallocator: sdallocx) are only seen here.
const RUST: [AllocFn; 4] = [
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
    AllocFn {
        name: "rust_dealloc",
        symbol: "__rust_dealloc",
        layout: Layout::OuterFree,
    },
];

/// The allocation family. A probe's attach cookie is its index here, which
/// is how rows know their function.
pub const FUNCTIONS: &[AllocFn] =
    &concat_tables::<{ FIRST_RUST + RUST.len() }>(&[&C_FUNCTIONS, &CXX_NEW, &CXX_DELETE, &RUST]);

/// The tables one after another (N: their total length).
const fn concat_tables<const N: usize>(tables: &[&[AllocFn]]) -> [AllocFn; N] {
    let mut out = [C_FUNCTIONS[0]; N];
    let (mut t, mut n) = (0, 0);
    while t < tables.len() {
        let mut i = 0;
        while i < tables[t].len() {
            out[n] = tables[t][i];
            n += 1;
            i += 1;
        }
        t += 1;
    }
    assert!(n == N, "N is the tables' total length");
    out
}

/// Prefixes under which an allocator exports the C family instead of (or
/// besides) the plain names: jemalloc configured with
/// `--with-jemalloc-prefix=je_`, its documented convention, as programs
/// that link it statically or beside the C library's malloc build it.
pub const PREFIXES: &[&str] = &["je_"];

/// How many functions can be probed: FUNCTIONS, then the C family under
/// each of PREFIXES. A probe's attach cookie is its index in this order.
pub const fn slot_count() -> usize {
    FUNCTIONS.len() + PREFIXES.len() * FIRST_CXX
}

/// One probe-able function: its row label, the symbol probed, its layout.
pub struct Slot {
    pub label: String,
    pub symbol: String,
    pub layout: Layout,
}

/// The function at a cookie (`i < slot_count()`).
pub fn slot(i: usize) -> Slot {
    if let Some(f) = FUNCTIONS.get(i) {
        return Slot {
            label: f.name.into(),
            symbol: f.symbol.into(),
            layout: f.layout,
        };
    }
    let (prefix, f) = (
        (i - FUNCTIONS.len()) / FIRST_CXX,
        (i - FUNCTIONS.len()) % FIRST_CXX,
    );
    let name = format!("{}{}", PREFIXES[prefix], FUNCTIONS[f].name);
    // A prefixed allocator may sit on another one (a wrapper): its free
    // of a block may end in that one's free of the same block.
    let layout = match FUNCTIONS[f].layout {
        Layout::Free => Layout::OuterFree,
        other => other,
    };
    Slot {
        label: name.clone(),
        symbol: name,
        layout,
    }
}

/// The cookies of malloc itself: plain, then under each prefix.
fn malloc_slots() -> impl Iterator<Item = usize> {
    std::iter::once(0).chain((0..PREFIXES.len()).map(|p| FUNCTIONS.len() + p * FIRST_CXX))
}

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
/// one it has to single-step out of line ~9-15 us (measured on the reference
/// VM). Many allocator functions start with instructions that are stepped
/// but change no register the probes read (the argument registers, the
/// stack pointer) and cannot jump, followed by one that is emulated (a push
/// or a branch). The probe, entry and return alike, goes on that emulated
/// instruction: the arguments and the return address at the stack pointer
/// are still as on entry. glibc 2.36: free starts `test %rdi,%rdi; je`;
/// memalign, posix_memalign, valloc and pvalloc start `cmpb $0,x(%rip)`
/// followed by `je` or `push`. libstdc++ (built for CET) starts every
/// operator with `endbr64`: `operator new` goes on to `test %rdi,%rdi;
/// mov $1,%eax; push %rbx`, `new[]` and `delete` to a `jmp`. Any other
/// prologue keeps the first instruction.
pub fn probe_skip(code: &[u8]) -> u64 {
    let mut skip = 0;
    let mut rest = code;
    // A few harmless instructions at most: the code read is 16 bytes.
    for _ in 0..4 {
        if emulated(rest) {
            return skip as u64;
        }
        let len = match rest {
            // endbr64
            [0xf3, 0x0f, 0x1e, 0xfa, ..] => 4,
            // test %rdi,%rdi
            [0x48, 0x85, 0xff, ..] => 3,
            // cmpb $imm8, disp32(%rip)
            [0x80, 0x3d, _, _, _, _, _, ..] => 7,
            // mov $imm32,%eax: the return register, no argument
            [0xb8, _, _, _, _, ..] => 5,
            _ => return 0,
        };
        skip += len;
        rest = &rest[len..];
    }
    0
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
    let has_plain_malloc = symbols.first().is_some_and(Option::is_some);
    let has_malloc = malloc_slots().any(|i| symbols.get(i).is_some_and(Option::is_some));
    // C++ operators or Rust entry points
    let has_new = symbols[FIRST_CXX..FUNCTIONS.len().min(symbols.len())]
        .iter()
        .any(Option::is_some);
    if !has_malloc && !has_new {
        bail!("it does not export malloc (nor C++ operator new)");
    }
    let mut probes: Vec<Probe> = Vec::new();
    let mut missing = Vec::new();
    for (i, sym) in symbols.iter().enumerate() {
        let Some(sym) = sym else {
            if i < FIRST_CXX && has_plain_malloc {
                missing.push(FUNCTIONS[i].name);
            }
            continue;
        };
        let f = slot(i);
        // Aliases: one probe, whose label names them all (a free that is
        // also operator delete, as in tcmalloc, is a plain free).
        if let Some(p) = probes.iter_mut().find(|p| {
            p.file_offset == sym.file_offset
                && (p.layout == f.layout || p.layout.is_free() && f.layout.is_free())
        }) {
            p.label = format!("{}|{}", p.label, f.label);
            continue;
        }
        let skip = probe_skip(&sym.code);
        probes.push(Probe {
            cookie: i as u32,
            label: f.label,
            layout: f.layout,
            file_offset: sym.file_offset,
            size: sym.size,
            skip,
        });
    }
    Ok((probes, missing))
}

/// The symbols left to probe in a process that runs with the preload
/// library (`super::preload`): its malloc family stands in front of every
/// library's, so the unprefixed C family is seen there and is dropped here,
/// with prefixed names that are the same code (tcmalloc's `tc_malloc`).
/// C++ operators and Rust entry points stay: programs call them directly.
/// One of them that is also a C function (tcmalloc's operator delete is
/// its free) is still probed, and the BPF side counts the free the preload
/// library reported once.
pub fn without_interposed(mut symbols: Vec<Option<Symbol>>) -> Vec<Option<Symbol>> {
    let interposed: Vec<u64> = symbols[..FIRST_CXX]
        .iter()
        .flatten()
        .map(|s| s.file_offset)
        .collect();
    for (i, sym) in symbols.iter_mut().enumerate() {
        let c_family = i < FIRST_CXX;
        let prefixed_alias = i >= FUNCTIONS.len()
            && sym
                .as_ref()
                .is_some_and(|s| interposed.contains(&s.file_offset));
        if c_family || prefixed_alias {
            *sym = None;
        }
    }
    symbols
}

/// The (file offset, size) of each named symbol of an ELF file (dynamic or
/// not; None: absent).
pub fn symbol_offsets(file: &Path, names: &[&str]) -> Result<Vec<Option<(u64, u64)>>> {
    use blazesym::inspect::{source::Elf, source::Source, Inspector};
    let mut elf = Elf::new(file);
    elf.debug_syms = false;
    let inspector = Inspector::new();
    let found = inspector
        .lookup(&Source::Elf(elf), names)
        .with_context(|| format!("reading the symbols of {}", file.display()))?;
    Ok(found
        .iter()
        .map(|infos| {
            infos
                .iter()
                .find_map(|s| Some((s.file_offset?, s.size.unwrap_or(0) as u64)))
        })
        .collect())
}

/// Looks the family up in a library's dynamic symbols.
pub fn lookup_symbols(lib: &Path) -> Result<Vec<Option<Symbol>>> {
    use blazesym::inspect::{source::Elf, source::Source, Inspector};
    check_elf(lib)?;
    let names: Vec<String> = (0..slot_count()).map(|i| slot(i).symbol).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let found = symbol_offsets(lib, &names)?;
    // Rust entry points carry a crate hash in their mangled names: the
    // symbol table is searched for them (programs only: libraries never
    // hold a Rust program's global allocator).
    let mut rust: Vec<Option<(u64, u64)>> = vec![None; FUNCTIONS.len() - FIRST_RUST];
    if !lib.to_string_lossy().contains(".so") {
        let mut elf = Elf::new(lib);
        elf.debug_syms = false;
        Inspector::new()
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
    for (i, found) in found.into_iter().enumerate() {
        let in_program = i
            .checked_sub(FIRST_RUST)
            .and_then(|r| rust.get(r).copied().flatten());
        let Some((off, size)) = found.or(in_program) else {
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
fn parse_ld_list_all(text: &str, matches: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
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
    if super::procmaps::is_libc_name(&interp) {
        return Ok(Vec::new());
    }
    let out = Command::new(&interp)
        .arg("--list")
        .arg(&exe)
        .output()
        .with_context(|| format!("running {} --list", interp.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(parse_ld_list_all(&text, |_| true)
        .into_iter()
        .filter(|lib| {
            super::procmaps::is_extra_allocator_name(lib)
                || !super::procmaps::is_libc_name(lib) && defines_allocator(lib)
        })
        .collect())
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
        assert_eq!(probe_skip(&[0x48, 0x85, 0xff]), 0);
        // libstdc++ operator new: endbr64; test %rdi,%rdi; mov $1,%eax;
        // push %rbx
        let endbr = [0xf3, 0x0f, 0x1e, 0xfa];
        let new = [&endbr[..], &[0x48, 0x85, 0xff, 0xb8, 1, 0, 0, 0, 0x53]].concat();
        assert_eq!(probe_skip(&new), 12);
        // operator delete: endbr64; jmp free@plt
        assert_eq!(
            probe_skip(&[&endbr[..], &[0xe9, 0x87, 0x2f, 0xff, 0xff]].concat()),
            4
        );
        // nothrow new: endbr64; sub $8,%rsp (moves the stack pointer): stays
        assert_eq!(
            probe_skip(&[&endbr[..], &[0x48, 0x83, 0xec, 0x08]].concat()),
            0
        );
        // an emulated first instruction stays
        assert_eq!(probe_skip(&[0xe9, 0x87, 0x2f, 0xff, 0xff]), 0);
    }

    #[test]
    fn aliases_share_one_probe_and_missing_names_are_listed() {
        let mut syms: Vec<Option<Symbol>> = (0..slot_count() as u64)
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
    fn prefixed_families_get_cookies_and_labels_of_their_own() {
        let mut syms = vec![None; slot_count()];
        let je = FUNCTIONS.len();
        assert_eq!(slot(je).label, "je_malloc");
        assert_eq!(slot(je + FIRST_CXX - 1).symbol, "je_free");
        assert_eq!(slot(je + FIRST_CXX - 1).layout, Layout::OuterFree);
        syms[je] = sym(0x1000, &[0x55]);
        syms[je + FIRST_CXX - 1] = sym(0x2000, &[0x55]);
        let (probes, missing) = plan(&syms).unwrap();
        assert!(missing.is_empty(), "only plain names are listed missing");
        let got: Vec<(u32, &str)> = probes
            .iter()
            .map(|p| (p.cookie, p.label.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (je as u32, "je_malloc"),
                ((je + FIRST_CXX - 1) as u32, "je_free")
            ]
        );
    }

    #[test]
    fn a_free_that_is_also_operator_delete_is_one_plain_free() {
        // tcmalloc: free, operator delete and delete[] at one address
        let mut syms = vec![None; slot_count()];
        syms[0] = sym(0x1000, &[0x55]);
        syms[FIRST_CXX - 1] = sym(0x2000, &[0x55]);
        let delete = FUNCTIONS.iter().position(|f| f.symbol == "_ZdlPv").unwrap();
        let sized = FUNCTIONS
            .iter()
            .position(|f| f.symbol == "_ZdlPvm")
            .unwrap();
        syms[delete] = sym(0x2000, &[0x55]);
        syms[sized] = sym(0x3000, &[0x55]);
        let (probes, _) = plan(&syms).unwrap();
        let frees: Vec<(&str, Layout)> = probes
            .iter()
            .filter(|p| p.layout.is_free())
            .map(|p| (p.label.as_str(), p.layout))
            .collect();
        assert_eq!(
            frees,
            [
                ("free|delete", Layout::Free),
                ("delete(sized)", Layout::OuterFree)
            ]
        );
    }

    #[test]
    fn a_library_without_malloc_is_refused() {
        let e = plan(&vec![None; slot_count()]).unwrap_err().to_string();
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
        let mut syms = vec![None; slot_count()];
        syms[FIRST_CXX] = sym(0xa9570, &[0xf3, 0x0f, 0x1e, 0xfa]);
        syms[FIRST_CXX + 1] = sym(0xa95d0, &[0xf3, 0x0f, 0x1e, 0xfa]);
        let (probes, missing) = plan(&syms).unwrap();
        assert!(missing.is_empty(), "{missing:?}");
        let labels: Vec<&str> = probes.iter().map(|p| p.label.as_str()).collect();
        assert_eq!(labels, ["new", "new[]"]);
        assert_eq!(FUNCTIONS[FIRST_CXX].symbol, "_Znwm");
        let deletes = &FUNCTIONS[FIRST_CXX + CXX_NEW.len()..FIRST_RUST];
        assert_eq!(deletes[3].symbol, "_ZdaPvm");
        assert_eq!(deletes[11].symbol, "_ZdaPvSt11align_val_tRKSt9nothrow_t");
        assert!(deletes.iter().all(|f| f.layout == Layout::OuterFree));
        let cxx: Vec<(&str, &str)> = FUNCTIONS[FIRST_CXX..FIRST_CXX + CXX_NEW.len()]
            .iter()
            .map(|f| (f.name, f.symbol))
            .collect();
        assert_eq!(
            cxx,
            [
                ("new", "_Znwm"),
                ("new[]", "_Znam"),
                ("new(nothrow)", "_ZnwmRKSt9nothrow_t"),
                ("new[](nothrow)", "_ZnamRKSt9nothrow_t"),
                ("new(align)", "_ZnwmSt11align_val_t"),
                ("new[](align)", "_ZnamSt11align_val_t"),
                ("new(align,nothrow)", "_ZnwmSt11align_val_tRKSt9nothrow_t"),
                ("new[](align,nothrow)", "_ZnamSt11align_val_tRKSt9nothrow_t"),
            ]
        );
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
