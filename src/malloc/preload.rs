//! The preload library of `kheap malloc -- CMD` (preload/kheap_preload.c):
//! embedded in kheap at build time, written to a private directory for one
//! run, and removed after it.
//!
//! Its malloc family calls the allocator the program would have used, then
//! passes through probe sites that the BPF side reads everything from. On
//! Linux 6.18 and later a uprobe on those sites enters the kernel without a
//! trap, and a malloc+free pair costs two kernel entries instead of the
//! three that uprobes on the C library's functions need (docs/benchmarks.md).

use std::ffi::{CString, OsStr};
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::allocators::PreloadSites;

const LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libkheap-preload.so"));

/// The file name processes map it under.
pub const FILE_NAME: &str = "libkheap-preload.so";

/// A run's directory is this, kheap's PID, a dash and a random part
/// (mkdtemp-style: another user cannot pre-create it, and one who does
/// makes kheap try another name, not fail).
const DIR_PREFIX: &str = "kheap-preload-";

/// How many random names are tried before giving up.
const NAME_TRIES: usize = 64;

/// The PID in a run directory's name: `kheap-preload-PID-RANDOM` (and the
/// older `kheap-preload-PID`).
fn pid_of(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(DIR_PREFIX)?;
    let pid = match rest.split_once('-') {
        Some((pid, random))
            if !random.is_empty() && random.bytes().all(|b| b.is_ascii_hexdigit()) =>
        {
            pid
        }
        Some(_) => return None,
        None => rest,
    };
    pid.parse().ok()
}

/// A new run directory's name, with 64 random bits from the kernel.
fn random_name() -> std::io::Result<String> {
    Ok(format!(
        "{DIR_PREFIX}{}-{:016x}",
        std::process::id(),
        crate::sys::random_u64()?
    ))
}

/// Makes a new directory in `parent_fd`, mode 0700, under the first name of
/// `names` that nothing holds (mkdirat fails on anything there, a link
/// included, so nothing another user planted is used or followed).
fn make_private_dir(
    parent_fd: &OwnedFd,
    mut names: impl FnMut() -> std::io::Result<String>,
) -> std::io::Result<String> {
    for _ in 0..NAME_TRIES {
        let name = names()?;
        let c_name = CString::new(name.as_str())
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: c_name is a valid C string.
        if unsafe { libc::mkdirat(parent_fd.as_raw_fd(), c_name.as_ptr(), 0o700) } == 0 {
            return Ok(name);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!("{NAME_TRIES} random names were all taken"),
    ))
}

/// Removes the directories of runs whose kheap is gone (killed before it
/// could remove its own).
fn remove_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(pid_of) else {
            continue;
        };
        // Only kheap's own (its user's): another user's is none of its
        // business.
        if !Path::new(&format!("/proc/{pid}")).exists() && owned_by_us(&e.path()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Where the library can be written for a run: the first of the temporary
/// directory ($TMPDIR or /tmp), /dev/shm, /run and /var/tmp that is a
/// directory kheap can write and not on a `noexec` mount (the loader could
/// not map the library from there: hardened machines mount /tmp so).
pub fn choose_directory() -> Option<PathBuf> {
    let candidates = [
        std::env::temp_dir(),
        "/dev/shm".into(),
        "/run".into(),
        "/var/tmp".into(),
    ];
    candidates.into_iter().find(|d| executable_mount(d))
}

/// Whether a directory exists, is writable, and allows mapping code.
fn executable_mount(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid C string and st a writable statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return false;
    }
    // SAFETY: c is a valid C string.
    let writable = unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0;
    usable(st.f_flag, writable)
}

/// The decision, from the mount flags (statvfs) and write access.
fn usable(mount_flags: u64, writable: bool) -> bool {
    writable && mount_flags & (libc::ST_NOEXEC | libc::ST_RDONLY) == 0
}

/// The library written out for one run; removed on drop, or by a guard
/// process if kheap is killed before (SIGKILL gives no chance to drop).
pub struct PreloadLibrary {
    dir: PathBuf,
    pub path: PathBuf,
    pub sites: PreloadSites,
    guard: Option<(OwnedFd, libc::pid_t)>,
}

impl PreloadLibrary {
    /// Writes the library into a new directory under `parent` (readable by
    /// everyone: the command may switch users). The directory is made by
    /// kheap itself, so no other user's file or link is written through
    /// (`parent` is reached under crate::safe_path's rule).
    pub fn install(parent: &Path) -> Result<PreloadLibrary> {
        let shown = format!("the preload library's directory {}", parent.display());
        let place = crate::safe_path::resolve(parent, &shown)?;
        if !place.is_dir() {
            bail!("{shown} is not a directory");
        }
        let parent_fd = place
            .open_dir()
            .with_context(|| format!("{shown}: cannot open it"))?;
        let parent = place.path();
        remove_stale(&parent);
        let name = make_private_dir(&parent_fd, random_name)
            .with_context(|| format!("creating a directory in {}", parent.display()))?;
        let dir = parent.join(&name);
        let guard = {
            let c_dir = CString::new(dir.as_os_str().as_bytes())?;
            let c_lib = CString::new(dir.join(FILE_NAME).as_os_str().as_bytes())?;
            crate::tree::fork_guard(move || unsafe {
                libc::unlink(c_lib.as_ptr());
                libc::rmdir(c_dir.as_ptr());
            })
        };
        let mut lib = PreloadLibrary {
            path: dir.join(FILE_NAME),
            dir,
            sites: PreloadSites::default(),
            guard,
        };
        let dir_fd = crate::safe_path::openat(
            &parent_fd,
            OsStr::new(&name),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )
        .and_then(|d| {
            std::fs::File::from(d.try_clone()?)
                .set_permissions(std::fs::Permissions::from_mode(0o755))?;
            Ok(d)
        })
        .with_context(|| format!("creating {}", lib.dir.display()))?;
        crate::safe_path::openat(
            &dir_fd,
            OsStr::new(FILE_NAME),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            0o600,
        )
        .map(std::fs::File::from)
        .and_then(|mut f| {
            f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
            f.write_all(LIBRARY)
        })
        .with_context(|| format!("writing {}", lib.path.display()))?;
        lib.sites = site_offsets(&lib.path)?;
        Ok(lib)
    }

    /// LD_PRELOAD for the command: the library first, then whatever the
    /// environment preloads already.
    pub fn ld_preload(&self, current: Option<&str>) -> String {
        match current.filter(|c| !c.trim().is_empty()) {
            Some(c) => format!("{}:{c}", self.path.display()),
            None => self.path.display().to_string(),
        }
    }
}

/// Whether `path` is a directory (not a link) of kheap's user.
fn owned_by_us(path: &Path) -> bool {
    std::fs::symlink_metadata(path)
        .is_ok_and(|m| m.is_dir() && m.uid() == unsafe { libc::geteuid() })
}

impl Drop for PreloadLibrary {
    fn drop(&mut self) {
        // Processes that still map it keep their copy (the inode lives on).
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(guard) = self.guard.take() {
            crate::tree::dismiss_guard(guard);
        }
    }
}

fn site_offsets(lib: &Path) -> Result<PreloadSites> {
    let names = [
        "kheap_alloc_site",
        "kheap_free_site",
        "kheap_alloc_site_forked",
        "kheap_free_site_forked",
    ];
    let found = crate::allocators::symbol_offsets(lib, &names)?;
    let offset = |i: usize| {
        found[i]
            .map(|(offset, _)| offset)
            .with_context(|| format!("{} has no {} (a broken build?)", lib.display(), names[i]))
    };
    Ok(PreloadSites {
        alloc: offset(0)?,
        free: offset(1)?,
        alloc_forked: offset(2)?,
        free_forked: offset(3)?,
    })
}

/// Whether a process has the library mapped (by its file name).
pub fn maps_it(maps: &[crate::sys::procmaps::Mapping]) -> bool {
    maps.iter().any(|m| {
        m.path
            .as_deref()
            .and_then(Path::file_name)
            .is_some_and(|n| n == FILE_NAME)
    })
}

/// Why a program would not run its allocations through the library, if it
/// would not (a phrase that follows the program's name): the dynamic loader preloads nothing into a static program,
/// nor into a set-user-ID or set-group-ID one run by another user; and a
/// program that defines malloc itself calls its own.
pub fn unusable_reason(program: &Path) -> Option<String> {
    let exe = crate::allocators::executable_of(program).ok()?;
    match crate::allocators::interpreter(&exe) {
        Ok(Some(_)) => {}
        Ok(None) => return Some("is statically linked".into()),
        Err(_) => return None, // not ELF: the caller's checks say so
    }
    let meta = std::fs::metadata(&exe).ok()?;
    let setuid = meta.mode() & 0o4000 != 0 && meta.uid() != 0;
    let setgid = meta.mode() & 0o2000 != 0 && meta.gid() != 0;
    if setuid || setgid {
        return Some("is set-user-ID or set-group-ID".into());
    }
    let symbols = crate::allocators::lookup_symbols(&exe).ok()?;
    if symbols[..crate::allocators::FIRST_CXX]
        .iter()
        .any(Option::is_some)
    {
        return Some("defines the malloc family itself".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocators::{FIRST_CXX, FUNCTIONS};

    /// The library's function numbers are the attach cookies of the C
    /// family: what the BPF side puts in the rows' `func`.
    #[test]
    fn function_numbers_are_the_c_family_cookies() {
        let source = include_str!("../../preload/kheap_preload.c");
        let body = source
            .split("enum kheap_func {")
            .nth(1)
            .and_then(|b| b.split('}').next())
            .expect("the enum");
        let mut seen = 0;
        for line in body.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let (name, num) = line
                .trim_end_matches(',')
                .split_once(" = ")
                .expect("NAME = N");
            let num: usize = num.parse().expect("a number");
            let expected = FUNCTIONS[num].name.to_uppercase();
            assert_eq!(name, format!("KHEAP_{expected}"), "{line}");
            seen += 1;
        }
        // every allocating C function (free has its own site)
        assert_eq!(seen, FIRST_CXX - 1);
        assert_eq!(FUNCTIONS[FIRST_CXX - 1].name, "free");
    }

    #[test]
    fn installs_with_its_sites_and_removes_itself() {
        let parent = std::env::temp_dir().join(format!("kheap-unit-{}", std::process::id()));
        std::fs::create_dir_all(&parent).unwrap();
        // a killed run's (no such PID) and something else's
        let stale = parent.join(format!("{DIR_PREFIX}4000000000"));
        let stale_random = parent.join(format!("{DIR_PREFIX}4000000000-0123456789abcdef"));
        std::fs::create_dir_all(&stale_random).unwrap();
        let other = parent.join("kheap-preload-notes");
        std::fs::create_dir_all(&stale).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let lib = PreloadLibrary::install(&parent).expect("installed");
        assert!(!stale.exists());
        assert!(!stale_random.exists());
        assert!(other.exists());
        assert!(lib.path.is_file());
        let (allocs, frees) = lib.sites.all();
        let mut all: Vec<u64> = allocs.into_iter().chain(frees).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 4, "{:?}", lib.sites);
        // The sites start with the 5-byte NOP the kernel optimizes; the
        // forked children's with a short jump, which it does not.
        let data = std::fs::read(&lib.path).unwrap();
        let code = |off: u64| &data[off as usize..off as usize + 5];
        for off in [lib.sites.alloc, lib.sites.free] {
            assert_eq!(code(off), &[0x0f, 0x1f, 0x44, 0x00, 0x00]);
        }
        for off in [lib.sites.alloc_forked, lib.sites.free_forked] {
            assert_eq!(&code(off)[..2], &[0xeb, 0x00]);
        }
        let dir = lib.path.parent().unwrap().to_path_buf();
        drop(lib);
        assert!(!dir.exists());
        std::fs::remove_dir_all(&parent).unwrap();
    }

    /// What another user can plant at a name kheap might use: a file, a
    /// link to somewhere of root's, a directory. kheap takes another name
    /// and touches none of them.
    #[test]
    fn a_planted_name_is_skipped_not_used_or_followed() {
        let parent = tempfile::tempdir().unwrap();
        let target = parent.path().join("root-only");
        std::fs::create_dir(&target).unwrap();
        let planted = [
            "kheap-preload-1-00",
            "kheap-preload-1-01",
            "kheap-preload-1-02",
        ];
        std::fs::write(parent.path().join(planted[0]), b"x").unwrap();
        std::os::unix::fs::symlink(&target, parent.path().join(planted[1])).unwrap();
        std::fs::create_dir(parent.path().join(planted[2])).unwrap();
        let fd: OwnedFd = std::fs::File::open(parent.path()).unwrap().into();
        let mut offered = planted
            .iter()
            .map(|n| n.to_string())
            .chain(["kheap-preload-1-03".to_string()]);
        let name = make_private_dir(&fd, || Ok(offered.next().unwrap())).unwrap();
        assert_eq!(name, "kheap-preload-1-03");
        let made = std::fs::symlink_metadata(parent.path().join(&name)).unwrap();
        assert!(made.is_dir());
        assert_eq!(made.mode() & 0o7777, 0o700);
        assert_eq!(std::fs::read(parent.path().join(planted[0])).unwrap(), b"x");
        assert!(std::fs::symlink_metadata(parent.path().join(planted[1]))
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);

        // Every name taken: one line, no directory made.
        let err = make_private_dir(&fd, || Ok(planted[0].to_string())).unwrap_err();
        assert_eq!(err.to_string(), "64 random names were all taken");
    }

    /// The old predictable name (kheap-preload-PID) planted as a link and
    /// as a file: install neither fails nor writes through it.
    #[test]
    fn install_is_not_stopped_by_the_predictable_name() {
        let parent = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        let old = parent
            .path()
            .join(format!("{DIR_PREFIX}{}", std::process::id()));
        std::os::unix::fs::symlink(target.path(), &old).unwrap();
        let lib = PreloadLibrary::install(parent.path()).expect("installed");
        let dir = lib.path.parent().unwrap().to_path_buf();
        assert_ne!(dir, old);
        assert_eq!(
            pid_of(dir.file_name().unwrap().to_str().unwrap()),
            Some(std::process::id())
        );
        assert_eq!(std::fs::read_dir(target.path()).unwrap().count(), 0);
        drop(lib);
        assert!(!dir.exists());
        // Ours or not, a link is not a run's directory: left alone.
        assert!(std::fs::symlink_metadata(&old).is_ok());
        std::fs::remove_file(&old).unwrap();
        std::fs::write(&old, b"").unwrap();
        let lib = PreloadLibrary::install(parent.path()).expect("installed past a file");
        drop(lib);
        assert!(old.is_file());
    }

    #[test]
    fn run_directory_names() {
        assert_eq!(pid_of("kheap-preload-42"), Some(42));
        assert_eq!(pid_of("kheap-preload-42-00ff00ff00ff00ff"), Some(42));
        assert_eq!(pid_of("kheap-preload-notes"), None);
        assert_eq!(pid_of("kheap-preload-42-notes"), None);
        assert_eq!(pid_of("kheap-preload-42-"), None);
        let (a, b) = (random_name().unwrap(), random_name().unwrap());
        assert_ne!(a, b);
        assert_eq!(pid_of(&a), Some(std::process::id()));
    }

    #[test]
    fn a_noexec_or_read_only_mount_is_not_used() {
        assert!(usable(0, true));
        assert!(usable(libc::ST_NOSUID | libc::ST_NODEV, true));
        assert!(!usable(libc::ST_NOEXEC, true));
        assert!(!usable(libc::ST_RDONLY, true));
        assert!(!usable(0, false));
        assert!(!executable_mount(Path::new("/no/such/directory")));
    }

    #[test]
    fn ld_preload_goes_first() {
        let lib = PreloadLibrary {
            dir: "/x".into(),
            path: "/x/libkheap-preload.so".into(),
            sites: PreloadSites::default(),
            guard: None,
        };
        assert_eq!(lib.ld_preload(None), "/x/libkheap-preload.so");
        assert_eq!(lib.ld_preload(Some(" ")), "/x/libkheap-preload.so");
        assert_eq!(
            lib.ld_preload(Some("libjemalloc.so.2")),
            "/x/libkheap-preload.so:libjemalloc.so.2"
        );
        std::mem::forget(lib); // nothing was written
    }
}
