//! Where each probe sits: the instruction past a stepped, harmless
//! prologue, and the plan of probes for the symbols a library exports.

use anyhow::{bail, Result};

use super::functions::{malloc_slots, slot, Layout, FIRST_CXX, FUNCTIONS};

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
/// library (`crate::malloc::preload`): its malloc family stands in front of every
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
