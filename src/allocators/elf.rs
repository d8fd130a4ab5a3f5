//! What an ELF file says: its symbols (the family's offsets and first
//! bytes), whether it is one, and its program interpreter.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::functions::{is_rust_symbol, slot, slot_count, FIRST_RUST, FUNCTIONS};
use super::placement::Symbol;

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
    let mut file = crate::input::open_regular(lib, &lib.display().to_string())?;
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

pub(super) fn read_head(path: &Path, n: usize) -> Result<Vec<u8>> {
    // Never blocks on a FIFO (`--lib FIFO`); only a regular file is read.
    let mut f = crate::input::open_regular(path, &path.display().to_string())?;
    let mut buf = vec![0u8; n];
    let got = f.read(&mut buf)?;
    buf.truncate(got);
    Ok(buf)
}

/// The ELF program interpreter (dynamic loader) of an executable, or `None`
/// for a static executable.
pub fn interpreter(exe: &Path) -> Result<Option<PathBuf>> {
    let data = fs::read(exe).with_context(|| format!("reading {}", exe.display()))?;
    parse_interpreter(&data).with_context(|| format!("{} is not an ELF executable", exe.display()))
}

/// PT_INTERP of a 64-bit little-endian ELF image (the only kind the
/// probes are placed in), read with `object`.
pub fn parse_interpreter(data: &[u8]) -> Result<Option<PathBuf>> {
    use object::elf::FileHeader64;
    use object::read::elf::{FileHeader, ProgramHeader};
    use object::LittleEndian;
    if data.get(..4) != Some(ELF_MAGIC) {
        bail!("no ELF header");
    }
    if data.get(4) != Some(&2) || data.get(5) != Some(&1) {
        bail!("not a 64-bit little-endian ELF file");
    }
    let header = FileHeader64::<LittleEndian>::parse(data).context("truncated ELF header")?;
    let headers = header
        .program_headers(LittleEndian, data)
        .context("truncated program headers")?;
    for ph in headers {
        if let Some(raw) = ph
            .interpreter(LittleEndian, data)
            .context("PT_INTERP outside the file")?
        {
            return Ok(Some(PathBuf::from(String::from_utf8_lossy(raw).as_ref())));
        }
    }
    Ok(None)
}
