//! User-space addresses to `function+0xoff (file:line)`, right even after
//! the process has exited: every frame's mapping was recorded by the BPF
//! side when its stack was first seen, so an address becomes a file offset
//! in a module, symbolized from the file itself (blazesym, ELF + DWARF).

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

use crate::sys::procmaps::{kernel_dev, Mapping};

/// One symbolized user frame.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserFrame {
    pub addr: u64,
    /// File name of the mapping the address is in.
    pub module: Option<String>,
    /// That file as (kernel device, inode).
    pub file: Option<(u32, u64)>,
    pub file_offset: u64,
    pub function: Option<String>,
    /// Offset of the address into the function.
    pub offset: u64,
    /// `file:line` where debug information has it.
    pub source: Option<String>,
}

impl UserFrame {
    /// What a row is called after: the function, or `module+0xoffset`.
    /// Address 0 is a direct caller whose return address could not be read
    /// (`lost.caller_unreadable`), never code.
    pub fn name(&self) -> String {
        match (&self.function, &self.module) {
            (Some(f), _) => f.clone(),
            (None, Some(m)) => format!("{m}+{:#x}", self.file_offset),
            (None, None) if self.addr == 0 => "[caller unreadable]".to_string(),
            (None, None) => format!("[anon]+{:#x}", self.addr),
        }
    }

    /// `function+0xoff (file:line)`; never a bare address.
    pub fn display(&self) -> String {
        match (&self.function, &self.source) {
            (Some(f), Some(s)) => format!("{f}+{:#x} ({s})", self.offset),
            (Some(f), None) => format!("{f}+{:#x}", self.offset),
            _ => self.name(),
        }
    }
}

/// A file-backed mapping of a process, as the BPF side recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    pub pgoff: u64,
    pub dev: u32,
    pub ino: u64,
    pub name: String,
}

impl Vma {
    /// The offset in its file where the mapping starts (`pgoff` counts
    /// the kernel's pages, as `vm_pgoff` does).
    pub fn file_offset(&self) -> u64 {
        self.pgoff * crate::sys::page_size()
    }

    /// `pgoff` for a mapping that starts `offset` bytes into its file.
    pub fn pgoff_of(offset: u64) -> u64 {
        offset / crate::sys::page_size()
    }
}

/// The mapping an address falls in and the address's offset in its file.
pub fn locate(vmas: &[Vma], addr: u64) -> Option<(&Vma, u64)> {
    vmas.iter()
        .find(|v| v.start <= addr && addr < v.end && v.ino != 0)
        .map(|v| (v, addr - v.start + v.file_offset()))
}

/// Where the files behind (device, inode) pairs are: learnt from the maps of
/// live processes and from files kheap knows about, else searched for by
/// name in the library directories.
#[derive(Default)]
pub struct Modules {
    paths: HashMap<(u32, u64), PathBuf>,
    dirs: Vec<PathBuf>,
}

const LIB_DIRS: &[&str] = &[
    crate::arch::MULTIARCH_LIB_DIRS[0],
    crate::arch::MULTIARCH_LIB_DIRS[1],
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
    "/usr/local/lib",
];

impl Modules {
    /// The files a process maps (paths as `host_path` gives them).
    pub fn add_maps(&mut self, pid: u32, maps: &[Mapping]) {
        for m in maps {
            if let Some(p) = host_path(pid, m) {
                if let Some(dir) = p.parent() {
                    self.add_dir(dir);
                }
                self.paths.entry((m.dev, m.inode)).or_insert(p);
            }
        }
    }

    /// A file that may be mapped by a traced process (the program, a
    /// library); its directory is searched too.
    pub fn add_file(&mut self, path: &Path) {
        if let Some(key) = file_key(path) {
            self.paths.entry(key).or_insert_with(|| path.to_path_buf());
        }
        if let Some(dir) = path.parent() {
            self.add_dir(dir);
        }
    }

    /// A path some process used for the file (device, inode), e.g. to
    /// exec it; kept if it is that file here.
    pub fn add_named(&mut self, key: (u32, u64), path: &Path) {
        let Ok(path) = std::fs::canonicalize(path) else {
            return;
        };
        if file_key(&path) == Some(key) {
            self.paths.entry(key).or_insert(path);
        }
    }

    fn add_dir(&mut self, dir: &Path) {
        if !self.dirs.iter().any(|d| d == dir) {
            self.dirs.push(dir.to_path_buf());
        }
    }

    pub fn resolve(&self, vma: &Vma) -> Option<PathBuf> {
        if let Some(p) = self.paths.get(&(vma.dev, vma.ino)) {
            return Some(p.clone());
        }
        self.dirs
            .iter()
            .map(PathBuf::as_path)
            .chain(LIB_DIRS.iter().map(Path::new))
            .map(|d| d.join(&vma.name))
            .find(|p| file_key(p) == Some((vma.dev, vma.ino)))
    }
}

/// A path to a mapped file that is valid here: the path in the maps file is
/// the process's own, which in another mount namespace (a container) is
/// reached through `/proc/PID/root`. `None` if neither is that file.
pub fn host_path(pid: u32, m: &Mapping) -> Option<PathBuf> {
    let p = m.path.as_ref().filter(|_| m.inode != 0)?;
    let want = Some((m.dev, m.inode));
    if file_key(p) == want {
        return Some(p.clone());
    }
    let rel = p.strip_prefix("/").ok()?;
    let inside = PathBuf::from(format!("/proc/{pid}/root")).join(rel);
    (file_key(&inside) == want).then_some(inside)
}

fn file_key(path: &Path) -> Option<(u32, u64)> {
    std::fs::metadata(path).ok().as_ref().map(kernel_file)
}

/// A file as the kernel's mappings name it: (kernel device, inode).
pub fn kernel_file(m: &std::fs::Metadata) -> (u32, u64) {
    (
        kernel_dev(libc::major(m.dev()), libc::minor(m.dev())),
        m.ino(),
    )
}

/// A symbol found for a file offset: name, offset into it, `file:line`.
pub type FileSymbol = (String, u64, Option<String>);

/// Symbolizes file offsets within one ELF file; a trait so that reports can
/// be tested without real binaries.
pub trait ElfSymbols {
    fn symbolize(&self, path: &Path, file_offsets: &[u64]) -> Vec<Option<FileSymbol>>;
}

/// blazesym over ELF symbols and DWARF.
pub struct Blaze(Symbolizer);

impl Default for Blaze {
    fn default() -> Self {
        // Names are demangled by `demangle`, which leaves C names alone.
        Blaze(Symbolizer::builder().enable_demangling(false).build())
    }
}

/// A symbol's name as its source wrote it. Only a mangled name is
/// demangled: Rust's (v0 `_R…`, and legacy `_ZN…17h<hash>E`, shown without
/// the hash) and C++'s (Itanium `_Z…`). Anything else is a C name and is
/// kept: a C++ demangler would read a function called `d`, `i`, `h` or `Ss`
/// as the type `double`, `int`, `unsigned char` or `std::string`.
pub fn demangle(name: &str) -> String {
    if name.starts_with("_R") || name.starts_with("_ZN") {
        if let Ok(d) = rustc_demangle::try_demangle(name) {
            return format!("{d:#}");
        }
    }
    if name.starts_with("_Z") {
        if let Some(d) = cpp_demangle::Symbol::new(name)
            .ok()
            .and_then(|s| s.demangle().ok())
        {
            return d;
        }
    }
    name.to_string()
}

impl ElfSymbols for Blaze {
    fn symbolize(&self, path: &Path, file_offsets: &[u64]) -> Vec<Option<FileSymbol>> {
        let src = Source::Elf(Elf::new(path));
        let Ok(syms) = self.0.symbolize(&src, Input::FileOffset(file_offsets)) else {
            return vec![None; file_offsets.len()];
        };
        syms.into_iter()
            .map(|s| match s {
                // A mapping symbol (arm64) names no function: the frame
                // stays a module offset.
                Symbolized::Sym(sym) if crate::arch::is_mapping_symbol(&sym.name) => None,
                Symbolized::Sym(sym) => {
                    let source = sym.code_info.as_ref().and_then(|c| {
                        let file = Path::new(&c.file)
                            .file_name()?
                            .to_string_lossy()
                            .into_owned();
                        Some(match c.line {
                            Some(l) => format!("{file}:{l}"),
                            None => file,
                        })
                    });
                    Some((demangle(&sym.name), sym.offset as u64, source))
                }
                Symbolized::Unknown(_) => None,
            })
            .collect()
    }
}

/// Symbolizes return addresses, each given with its address space (see
/// `Key::mm`). Each is looked up one byte
/// back, inside the call instruction, so that the line is the call's and a
/// call at a function's very end still names that function.
pub fn symbolize_return_addresses(
    requests: &[(u64, u64)],
    vmas: &HashMap<u64, Vec<Vma>>,
    modules: &Modules,
    elf: &dyn ElfSymbols,
) -> HashMap<(u64, u64), UserFrame> {
    let mut out = HashMap::new();
    // Per file: the frames whose symbols it holds.
    let mut by_file: HashMap<PathBuf, Vec<(u64, u64, u64)>> = HashMap::new();
    for &(space, addr) in requests {
        let mut frame = UserFrame {
            addr,
            ..Default::default()
        };
        let empty = Vec::new();
        if let Some((vma, off)) = locate(vmas.get(&space).unwrap_or(&empty), addr) {
            frame.module = Some(vma.name.clone());
            frame.file = Some((vma.dev, vma.ino));
            frame.file_offset = off;
            if let Some(path) = modules.resolve(vma) {
                by_file.entry(path).or_default().push((space, addr, off));
            }
        }
        out.insert((space, addr), frame);
    }
    for (path, frames) in by_file {
        let offsets: Vec<u64> = frames.iter().map(|f| f.2.saturating_sub(1)).collect();
        for (&(space, addr, _), sym) in frames.iter().zip(elf.symbolize(&path, &offsets)) {
            if let (Some((name, off, source)), Some(f)) = (sym, out.get_mut(&(space, addr))) {
                f.function = Some(name);
                f.offset = off + 1;
                f.source = source;
            }
        }
    }
    out
}

#[cfg(test)]
pub mod tests {
    use super::*;

    #[test]
    fn only_mangled_names_are_demangled() {
        for c_name in ["d", "i", "h", "Ss", "main", "_Rfoo", "_Zfoo", "_ZNx"] {
            assert_eq!(demangle(c_name), c_name);
        }
        assert_eq!(demangle("_Z3fooid"), "foo(int, double)");
        assert_eq!(
            demangle("_ZNSs6appendEPKc"),
            "std::string::append(char const*)"
        );
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        assert_eq!(
            demangle("_RNvCs15kBYyAo9fc_7mycrate7example"),
            "mycrate::example"
        );
    }

    /// Symbols at fixed file offsets of any file: (start, name).
    pub struct FixtureElf(pub Vec<(u64, &'static str)>);

    impl ElfSymbols for FixtureElf {
        fn symbolize(&self, _: &Path, offs: &[u64]) -> Vec<Option<FileSymbol>> {
            offs.iter()
                .map(|&o| {
                    self.0
                        .iter()
                        .rev()
                        .find(|(s, _)| *s <= o)
                        .map(|(s, n)| (n.to_string(), o - s, Some("w.c:7".to_string())))
                })
                .collect()
        }
    }

    #[test]
    fn frames_become_file_offsets_and_symbols() {
        let exe = std::env::current_exe().unwrap();
        let meta = std::fs::metadata(&exe).unwrap();
        let vma = Vma {
            start: 0x5000_0000,
            end: 0x5001_0000,
            pgoff: 1,
            dev: kernel_dev(libc::major(meta.dev()), libc::minor(meta.dev())),
            ino: meta.ino(),
            name: exe.file_name().unwrap().to_string_lossy().into_owned(),
        };
        let anon = Vma {
            start: 0x6000_0000,
            end: 0x6000_1000,
            pgoff: 0,
            dev: 1,
            ino: 99,
            name: "gone.so".into(),
        };
        let vmas = HashMap::from([(7, vec![vma, anon])]);
        // Found by name in a directory kheap was told about.
        let mut modules = Modules::default();
        modules.add_file(&exe.parent().unwrap().join("no-such-file"));
        let elf = FixtureElf(vec![(0x1000, "main"), (0x1100, "do_malloc")]);
        let reqs = [
            (7, 0x5000_0110),
            (7, 0x6000_0010),
            (7, 0x7000_0000),
            (8, 0x5000_0110),
            (7, 0),
        ];
        let f = symbolize_return_addresses(&reqs, &vmas, &modules, &elf);
        let hit = &f[&(7, 0x5000_0110)];
        assert_eq!(hit.file_offset, 0x1110);
        assert_eq!(hit.display(), "do_malloc+0x10 (w.c:7)");
        assert_eq!(
            f[&(7, 0x6000_0010)].display(),
            "gone.so+0x10",
            "module+offset"
        );
        assert_eq!(f[&(7, 0x7000_0000)].display(), "[anon]+0x70000000");
        // The BPF side's caller 0: its return address could not be read.
        let unreadable = f.get(&(7, 0)).cloned().unwrap_or_default();
        assert_eq!(unreadable.display(), "[caller unreadable]");
        assert_eq!(
            f[&(8, 0x5000_0110)].display(),
            "[anon]+0x50000110",
            "other process"
        );
    }

    #[test]
    fn mapped_files_are_found_here_or_through_the_process_root() {
        let pid = std::process::id();
        let maps = crate::sys::procmaps::read(pid).unwrap();
        let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
        let m = maps
            .iter()
            .find(|m| m.path.as_deref() == Some(exe.as_path()))
            .unwrap();
        assert_eq!(host_path(pid, m), Some(exe.clone()));
        let moved = Mapping {
            path: Some(PathBuf::from("/no/such/dir").join(exe.file_name().unwrap())),
            ..m.clone()
        };
        assert_eq!(host_path(pid, &moved), None, "a path that is not that file");
        let mut modules = Modules::default();
        modules.add_maps(pid, &maps);
        let vma = Vma {
            start: 0,
            end: 1,
            pgoff: 0,
            dev: m.dev,
            ino: m.inode,
            name: String::new(),
        };
        assert_eq!(modules.resolve(&vma), Some(exe));
    }

    #[test]
    fn return_address_at_a_function_end_names_that_function() {
        let vmas = HashMap::from([(
            1,
            vec![Vma {
                start: 0x1000,
                end: 0x9000,
                pgoff: 0,
                dev: 5,
                ino: 6,
                name: "w".into(),
            }],
        )]);
        let mut modules = Modules::default();
        modules.paths.insert((5, 6), PathBuf::from("/w"));
        let elf = FixtureElf(vec![(0x2000, "f"), (0x2020, "g")]);
        // The call to malloc is f's last instruction: its return address
        // is g's first byte.
        let f = symbolize_return_addresses(&[(1, 0x3020)], &vmas, &modules, &elf);
        assert_eq!(f[&(1, 0x3020)].display(), "f+0x20 (w.c:7)");
    }
}
