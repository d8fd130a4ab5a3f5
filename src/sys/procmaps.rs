//! `/proc/PID/maps`: which files a process maps, and which of them is its
//! C library. Pure parsing, tested with fixtures.

use std::path::{Path, PathBuf};

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    /// Device in the kernel's internal encoding (major << 20 | minor), as
    /// the BPF side reads it from the superblock.
    pub dev: u32,
    pub inode: u64,
    pub path: Option<PathBuf>,
}

/// The kernel's internal device encoding (`MKDEV`).
pub fn kernel_dev(major: u32, minor: u32) -> u32 {
    (major << 20) | minor
}

/// Parses the text of a maps file; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut f = line.split_whitespace();
    let (start, end) = f.next()?.split_once('-')?;
    let _perms = f.next()?;
    let offset = f.next()?;
    let (major, minor) = f.next()?.split_once(':')?;
    let inode = f.next()?;
    // The path may contain spaces: it is the rest of the line.
    let path = f.collect::<Vec<_>>().join(" ");
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    Some(Mapping {
        start: hex(start)?,
        end: hex(end)?,
        offset: hex(offset)?,
        dev: kernel_dev(hex(major)? as u32, hex(minor)? as u32),
        inode: inode.parse().ok()?,
        path: path.starts_with('/').then(|| PathBuf::from(path)),
    })
}

/// Whether a file name is a C library: glibc's `libc.so.6` (or an old
/// `libc-2.x.so`), or musl, whose loader is its libc.
pub fn is_libc_name(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    name == "libc.so.6"
        || name == "libc.so"
        || (name.starts_with("libc-") && name.ends_with(".so"))
        || (name.starts_with("ld-musl-") && name.contains(".so"))
}

/// Whether a file name is a C++ runtime that implements operator new:
/// GCC's `libstdc++.so.6` or LLVM's `libc++.so.1`.
pub fn is_cxx_runtime_name(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    name.starts_with("libstdc++.so") || name.starts_with("libc++.so")
}

/// Whether a file name is an allocator library that replaces the C
/// library's malloc family: jemalloc, tcmalloc (gperftools), mimalloc.
pub fn is_allocator_lib_name(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    ["libjemalloc.so", "libtcmalloc", "libmimalloc.so"]
        .iter()
        .any(|p| name.starts_with(p))
        && name.contains(".so")
}

/// Libraries probed besides the C library: the C++ runtime (operator new)
/// and allocator libraries.
pub fn is_extra_allocator_name(path: &Path) -> bool {
    is_cxx_runtime_name(path) || is_allocator_lib_name(path)
}

/// The C++ runtimes and allocator libraries a process maps, one mapping
/// each.
pub fn find_extra_allocators(maps: &[Mapping]) -> Vec<&Mapping> {
    mapped_files(maps)
        .into_iter()
        .filter(|m| m.path.as_deref().is_some_and(is_extra_allocator_name))
        .collect()
}

/// Every file a process maps, one mapping each.
pub fn mapped_files(maps: &[Mapping]) -> Vec<&Mapping> {
    let mut out: Vec<&Mapping> = Vec::new();
    for m in maps {
        if m.inode != 0
            && m.path.is_some()
            && !out.iter().any(|o| (o.dev, o.inode) == (m.dev, m.inode))
        {
            out.push(m);
        }
    }
    out
}

/// The C library a process maps, if any.
pub fn find_libc(maps: &[Mapping]) -> Option<&Mapping> {
    maps.iter()
        .find(|m| m.inode != 0 && m.path.as_deref().is_some_and(is_libc_name))
}

/// Reads and parses `/proc/PID/maps`; `None` once the process is gone.
pub fn read(pid: u32) -> Option<Vec<Mapping>> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .ok()
        .map(|t| parse(&t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_library_names() {
        for n in [
            "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
            "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
            "/usr/lib/libmimalloc.so.2.0",
            "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
            "/usr/lib/libc++.so.1",
        ] {
            assert!(is_extra_allocator_name(Path::new(n)), "{n}");
        }
        for n in [
            "/lib/libc.so.6",
            "/usr/lib/libjemalloc_pic.a",
            "/lib/libm.so.6",
        ] {
            assert!(!is_extra_allocator_name(Path::new(n)), "{n}");
        }
    }

    const MAPS: &str = "\
55d0c8e4b000-55d0c8e4c000 r--p 00000000 fe:01 1835290                    /tmp/w/work load
55d0c8e4c000-55d0c8e4d000 r-xp 00001000 fe:01 1835290                    /tmp/w/work load
55d0ca1e5000-55d0ca206000 rw-p 00000000 00:00 0                          [heap]
7f2a1c826000-7f2a1c84c000 r--p 00000000 fe:01 262571                     /usr/lib/x86_64-linux-gnu/libc.so.6
7f2a1c84c000-7f2a1c9a1000 r-xp 00026000 fe:01 262571                     /usr/lib/x86_64-linux-gnu/libc.so.6
7ffd5d3e0000-7ffd5d401000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn parses_file_mappings_with_spaces_and_devices() {
        let maps = parse(MAPS);
        assert_eq!(maps.len(), 6);
        assert_eq!(maps[1].start, 0x55d0c8e4c000);
        assert_eq!(maps[1].offset, 0x1000);
        assert_eq!(maps[1].dev, (0xfe << 20) | 1);
        assert_eq!(maps[1].inode, 1835290);
        assert_eq!(maps[1].path.as_deref(), Some(Path::new("/tmp/w/work load")));
        assert_eq!(maps[2].path, None, "[heap] is not a file");
    }

    #[test]
    fn finds_the_c_library() {
        let maps = parse(MAPS);
        let libc = find_libc(&maps).unwrap();
        assert_eq!(
            libc.path.as_deref(),
            Some(Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6"))
        );
        assert!(find_libc(&maps[..3]).is_none());
        assert!(is_libc_name(Path::new("/lib/ld-musl-x86_64.so.1")));
        assert!(is_libc_name(Path::new("/lib/libc-2.31.so")));
        assert!(!is_libc_name(Path::new("/lib/libcap.so.2")));
        assert!(!is_libc_name(Path::new("/usr/lib/libc++.so.1")));
    }
}
