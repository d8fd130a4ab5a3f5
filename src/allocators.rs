//! The user-space allocators kheap probes, and where the probes go: the
//! allocator functions (`functions`, the table the BPF side shares), the
//! library that holds them, the one the target really maps (`loader`,
//! `elf`), the instruction each probe sits on (`placement`), which files
//! of a process to probe (`libraries`) and the preload library's sites.
//! Read by `kheap malloc` and the kernel layer alike.

pub mod elf;
pub mod functions;
pub mod libraries;
pub mod loader;
pub mod placement;

pub use elf::{check_elf, interpreter, lookup_symbols, parse_interpreter, symbol_offsets};
pub use functions::{
    is_rust_symbol, slot, slot_count, AllocFn, Layout, Slot, FIRST_CXX, FIRST_RUST, FUNCTIONS,
    PREFIXES,
};
pub use loader::{
    defines_allocator, executable_of, extra_allocators_of_program, libc_of_program, parse_ld_list,
};
pub use placement::{plan, probe_skip, without_interposed, Probe, Symbol};

/// The file offsets of the preload library's probe sites: allocation and
/// free, and the same for forked children (which must not use the sites
/// the kernel optimized in their parent: preload/kheap_preload.c says why).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PreloadSites {
    pub alloc: u64,
    pub free: u64,
    pub alloc_forked: u64,
    pub free_forked: u64,
}

impl PreloadSites {
    /// (allocation sites, free sites)
    pub fn all(&self) -> ([u64; 2], [u64; 2]) {
        (
            [self.alloc, self.alloc_forked],
            [self.free, self.free_forked],
        )
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::PathBuf;

    use super::functions::CXX_NEW;
    use super::loader::parse_ld_list_all;
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
                crate::sys::procmaps::is_extra_allocator_name
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
