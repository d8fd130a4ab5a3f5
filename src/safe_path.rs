//! Finding where a file kheap writes really goes, without trusting another
//! user's symbolic links: kheap runs as root on machines other people log
//! into, and `-o /tmp/r.json` must not replace `/root/victim` because a user
//! planted `ln -s /root/victim /tmp/r.json`.
//!
//! The path is walked one component at a time from a directory descriptor
//! (never re-resolved by name, so a directory swapped for a link meanwhile
//! changes nothing), and a symbolic link is followed only if its owner is
//! kheap's user or root: another user's link is refused wherever it is, in
//! a sticky, world-writable directory (/tmp, /var/tmp, /dev/shm) as under
//! `fs.protected_symlinks`, and in a directory that user owns (which the
//! sysctl does not cover). The kernel's own
//! links in /proc (`/dev/stdout` ends at `/proc/self/fd/1`) are followed by
//! the kernel: they name open files, not paths.
//!
//! Where the kernel has `openat2` (5.6), the usual path, one with no link
//! on the way to its last component, is resolved by the kernel in one call
//! that crosses no link at all (`RESOLVE_NO_SYMLINKS`, which refuses /proc's
//! magic links too): nothing can be swapped between steps. When that call
//! fails (a link on the way, a kernel before 5.6, anything else), or the
//! last component is a link, the walk above runs and decides link by link.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Result};

/// As many links as the kernel follows in one lookup (MAXSYMLINKS).
const MAX_LINKS: u32 = 40;

const PROC_SUPER_MAGIC: i64 = 0x9fa0;
const SYSFS_MAGIC: i64 = 0x6265_6572;

/// Where a path ends: a name in a directory held open.
pub struct Place {
    /// The directory the name is in (an O_PATH descriptor).
    pub dir: OwnedFd,
    /// That directory's path, links resolved (for messages and for paths
    /// handed on, such as LD_PRELOAD).
    pub dir_path: PathBuf,
    /// The last component ("." when the path is a directory itself, such
    /// as "/" or ".").
    pub name: OsString,
    /// What is there now (None: nothing, the file is new).
    pub existing: Option<libc::stat>,
    /// The path ends in one of the kernel's /proc links (`/dev/stdout`):
    /// an open file to write in place, opened through the link.
    pub kernel_link: bool,
}

impl Place {
    /// A name where nothing is yet, or (`kernel_link`) a /proc link the
    /// kernel follows when it is opened.
    fn nothing_yet(dir: OwnedFd, dir_path: PathBuf, name: OsString, kernel_link: bool) -> Place {
        Place {
            dir,
            dir_path,
            name,
            existing: None,
            kernel_link,
        }
    }

    pub fn is_dir(&self) -> bool {
        self.existing
            .is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
    }

    pub fn is_regular(&self) -> bool {
        self.existing
            .is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
    }

    /// Whether the directory is a kernel file system (/proc, /sys): no
    /// place for a report.
    pub fn in_kernel_fs(&self) -> bool {
        matches!(fs_type(&self.dir), Some(PROC_SUPER_MAGIC | SYSFS_MAGIC))
    }

    /// The whole path, links resolved.
    pub fn path(&self) -> PathBuf {
        if self.name == "." {
            self.dir_path.clone()
        } else {
            self.dir_path.join(&self.name)
        }
    }

    /// Opens the entry itself (`flags` with O_CLOEXEC; O_NOFOLLOW unless it
    /// is a kernel link, which the kernel follows).
    pub fn open(&self, flags: libc::c_int) -> io::Result<File> {
        let nofollow = if self.kernel_link {
            0
        } else {
            libc::O_NOFOLLOW
        };
        openat(&self.dir, &self.name, flags | nofollow, 0).map(File::from)
    }

    /// Opens the directory the path names (for a path that is one).
    pub fn open_dir(&self) -> io::Result<OwnedFd> {
        openat(
            &self.dir,
            &self.name,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )
    }
}

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// openat(2) with O_CLOEXEC.
pub fn openat(
    dir: &OwnedFd,
    name: &OsStr,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: c is a valid C string; the descriptor returned is ours.
    let fd = check(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    })?;
    // SAFETY: fd was just opened and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// fstatat(2) without following a final link (None: no such entry).
pub fn lstatat(dir: &OwnedFd, name: &OsStr) -> io::Result<Option<libc::stat>> {
    let c = cstr(name)?;
    // SAFETY: zeroed is a valid stat; c is a valid C string.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let ret = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    match check(ret) {
        Ok(_) => Ok(Some(st)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

pub fn fstat(fd: &impl AsRawFd) -> io::Result<libc::stat> {
    // SAFETY: zeroed is a valid stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

fn fs_type(fd: &OwnedFd) -> Option<i64> {
    // SAFETY: zeroed is a valid statfs.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } == 0).then_some(st.f_type as i64)
}

fn readlinkat(dir: &OwnedFd, name: &OsStr) -> io::Result<OsString> {
    let c = cstr(name)?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: buf is writable for its length.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            c.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(OsString::from_vec(buf))
}

fn open_start(absolute: bool) -> io::Result<(OwnedFd, PathBuf)> {
    let (dir, path) = if absolute {
        (OsStr::new("/"), PathBuf::from("/"))
    } else {
        (OsStr::new("."), std::env::current_dir()?)
    };
    let c = cstr(dir)?;
    // SAFETY: c is a valid C string; the descriptor returned is ours.
    let fd = check(unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    })?;
    Ok((unsafe { OwnedFd::from_raw_fd(fd) }, path))
}

/// Why a link may not be followed, if it may not: kheap follows only its
/// own user's links and root's. Another user's link is refused wherever it
/// is: in a sticky, world-writable directory (/tmp) as `fs.protected_symlinks`
/// would, and in a directory that user owns (`/tmp/s/report.json` planted
/// in the user's own `/tmp/s`), which the sysctl does not cover.
fn refusal(link: &libc::stat, dir: &libc::stat, follower: libc::uid_t) -> Option<String> {
    if link.st_uid == follower || link.st_uid == 0 {
        return None;
    }
    let sticky_world_writable = dir.st_mode & libc::S_ISVTX != 0 && dir.st_mode & 0o002 != 0;
    let place = if sticky_world_writable {
        " in a sticky, world-writable directory"
    } else {
        ""
    };
    Some(format!(
        "it is a symbolic link owned by user {}{place}, and kheap (user {follower}) \
         follows only its own links and root's",
        user_name(link.st_uid)
    ))
}

fn user_name(uid: libc::uid_t) -> String {
    // SAFETY: getpwuid's result is read at once, before any other call.
    unsafe {
        let pw = libc::getpwuid(uid);
        if pw.is_null() || (*pw).pw_name.is_null() {
            return uid.to_string();
        }
        let name = std::ffi::CStr::from_ptr((*pw).pw_name).to_string_lossy();
        format!("{name} ({uid})")
    }
}

/// The directory `path` names, opened (O_PATH) by one openat2(2) that
/// crosses no symbolic link, /proc's magic links included. None on any
/// failure: a link on the way (ELOOP), no openat2 (before 5.6, or a
/// seccomp filter), or anything else; the walk then decides, and says what
/// is wrong.
fn open_dir_without_links(path: &Path) -> Option<OwnedFd> {
    let c = cstr(path.as_os_str()).ok()?;
    // SAFETY: zeroed is a valid open_how (its fields are integers).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: c and how live across the call; the descriptor is ours.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    // SAFETY: fd was just opened and is owned by nothing else.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// The kernel's resolution of a path with no link before its last
/// component (see the module comment): its directory, opened by one
/// `openat2` that crosses no link, and the entry there. None whenever the
/// walk is to decide: no openat2, a link on the way or at the end, a path
/// that ends in "..", "." or "/", or any error (the walk says what it is).
fn resolve_without_links(path: &Path) -> Option<Place> {
    let Some(Component::Normal(name)) = path.components().next_back() else {
        return None;
    };
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    let dir = open_dir_without_links(parent.unwrap_or(Path::new(".")))?;
    let existing = lstatat(&dir, name).ok()?;
    if existing.is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK) {
        return None;
    }
    // No link on the way: ".." steps back lexically, as the kernel did.
    let mut dir_path = if path.is_absolute() {
        PathBuf::from("/")
    } else {
        std::env::current_dir().ok()?
    };
    for c in parent.into_iter().flat_map(components) {
        if c == ".." {
            dir_path.pop();
        } else {
            dir_path.push(c);
        }
    }
    Some(Place {
        dir,
        dir_path,
        name: name.to_os_string(),
        existing,
        kernel_link: false,
    })
}

/// Resolves `path` (see the module comment). `shown` names it in messages
/// (e.g. "-o /tmp/r.json").
pub fn resolve(path: &Path, shown: &str) -> Result<Place> {
    match resolve_without_links(path) {
        Some(place) => Ok(place),
        None => walk(path, shown),
    }
}

/// Walks `path` one component at a time (see the module comment).
fn walk(path: &Path, shown: &str) -> Result<Place> {
    let follower = unsafe { libc::geteuid() };
    let (mut dir, mut dir_path) = open_start(path.is_absolute())
        .map_err(|e| anyhow::anyhow!("{shown}: cannot open the starting directory: {e}"))?;
    let mut pending: std::collections::VecDeque<OsString> = components(path).collect();
    let mut links = 0u32;
    let io_err = |e: io::Error, at: &Path| anyhow::anyhow!("{shown}: {}: {e}", at.display());
    while let Some(name) = pending.pop_front() {
        let last = pending.is_empty();
        if name == ".." {
            dir = openat(&dir, &name, libc::O_PATH | libc::O_DIRECTORY, 0)
                .map_err(|e| io_err(e, &dir_path))?;
            dir_path.pop();
            if last {
                pending.push_back(".".into());
            }
            continue;
        }
        let here = dir_path.join(&name);
        let Some(st) = lstatat(&dir, &name).map_err(|e| io_err(e, &here))? else {
            if last {
                return Ok(Place::nothing_yet(dir, dir_path, name, false));
            }
            bail!("{shown}: directory {} does not exist", here.display());
        };
        match st.st_mode & libc::S_IFMT {
            libc::S_IFLNK => {
                let dir_st = fstat(&dir).map_err(|e| io_err(e, &dir_path))?;
                if let Some(why) = refusal(&st, &dir_st, follower) {
                    bail!(
                        "{shown}: refusing to follow {}: {why}; remove it or write elsewhere",
                        here.display()
                    );
                }
                links += 1;
                if links > MAX_LINKS {
                    bail!(
                        "{shown}: {} is a loop of symbolic links: remove it or give another path",
                        here.display()
                    );
                }
                if fs_type(&dir) == Some(PROC_SUPER_MAGIC) {
                    // A /proc link names an open file, a process or its
                    // directories: the kernel follows it (readlink's text,
                    // such as "pipe:[123]", is no path).
                    if last {
                        return Ok(Place::nothing_yet(dir, dir_path, name, true));
                    }
                    dir = openat(&dir, &name, libc::O_PATH | libc::O_DIRECTORY, 0)
                        .map_err(|e| io_err(e, &here))?;
                    dir_path = here;
                    continue;
                }
                let target = readlinkat(&dir, &name).map_err(|e| io_err(e, &here))?;
                let target = PathBuf::from(target);
                if target.is_absolute() {
                    (dir, dir_path) = open_start(true).map_err(|e| io_err(e, &target))?;
                }
                let mut inner: Vec<OsString> = components(&target).collect();
                if inner.is_empty() {
                    inner.push(".".into());
                }
                for c in inner.into_iter().rev() {
                    pending.push_front(c);
                }
            }
            libc::S_IFDIR if !last => {
                dir = openat(
                    &dir,
                    &name,
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                    0,
                )
                .map_err(|e| io_err(e, &here))?;
                dir_path = here;
            }
            _ if last => {
                return Ok(Place {
                    dir,
                    dir_path,
                    name,
                    existing: Some(st),
                    kernel_link: false,
                })
            }
            _ => bail!("{shown}: {} is not a directory", here.display()),
        }
    }
    // No components ("/", "."): the starting directory itself.
    let existing = Some(fstat(&dir).map_err(|e| io_err(e, &dir_path))?);
    Ok(Place {
        dir,
        dir_path,
        name: ".".into(),
        existing,
        kernel_link: false,
    })
}

/// The names of a path's components ("." left out, ".." kept).
fn components(path: &Path) -> impl Iterator<Item = OsString> + '_ {
    path.components().filter_map(|c| match c {
        Component::Normal(n) => Some(n.to_os_string()),
        Component::ParentDir => Some("..".into()),
        Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(uid: u32, mode: u32) -> libc::stat {
        let mut s: libc::stat = unsafe { std::mem::zeroed() };
        s.st_uid = uid;
        s.st_mode = mode;
        s
    }

    #[test]
    fn only_ones_own_links_and_roots_are_followed() {
        let tmp = st(0, libc::S_IFDIR | 0o1777);
        // Another user's link in /tmp: refused, for root and for others.
        assert!(refusal(&st(1000, libc::S_IFLNK), &tmp, 0).is_some());
        assert!(refusal(&st(1000, libc::S_IFLNK), &tmp, 1001).is_some());
        // One's own link, or root's: followed.
        assert!(refusal(&st(1000, libc::S_IFLNK), &tmp, 1000).is_none());
        assert!(refusal(&st(0, libc::S_IFLNK), &tmp, 1000).is_none());
        // Another user's link in that user's own directory (not sticky,
        // not world-writable): refused too.
        let theirs = st(1000, libc::S_IFDIR | 0o755);
        assert!(refusal(&st(1000, libc::S_IFLNK), &theirs, 0).is_some());
        let shared = st(0, libc::S_IFDIR | 0o777);
        assert!(refusal(&st(1000, libc::S_IFLNK), &shared, 0).is_some());
        let root_dir = st(0, libc::S_IFDIR | 0o755);
        assert!(refusal(&st(0, libc::S_IFLNK), &root_dir, 0).is_none());
    }

    #[test]
    fn the_kernel_resolves_paths_without_links_and_the_walk_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::write(real.join("r.json"), "x").unwrap();
        std::os::unix::fs::symlink("real", dir.path().join("via")).unwrap();
        std::os::unix::fs::symlink("r.json", real.join("link.json")).unwrap();
        // No link: one openat2 (this test runs on kernels that have it),
        // and the same place the walk finds.
        let plain = real.join("../real/r.json");
        let fast = resolve_without_links(&plain).expect("openat2 resolves a path without links");
        let walked = walk(&plain, "-o").unwrap();
        assert_eq!(fast.dir_path, walked.dir_path);
        assert_eq!(fast.name, walked.name);
        assert!(fast.is_regular() && walked.is_regular());
        assert_eq!(
            fstat(&fast.dir).unwrap().st_ino,
            fstat(&walked.dir).unwrap().st_ino
        );
        assert!(resolve_without_links(&real.join("new.json")).is_some_and(|p| p.existing.is_none()));
        // A link on the way or at the end: the walk decides.
        assert!(resolve_without_links(&dir.path().join("via/r.json")).is_none());
        assert!(resolve_without_links(&real.join("link.json")).is_none());
        assert!(resolve_without_links(Path::new("/proc/self/fd/1")).is_none());
        assert!(resolve_without_links(&real.join("..")).is_none());
        assert!(resolve_without_links(&real.join("r.json/x")).is_none());
    }

    #[test]
    fn paths_resolve_through_allowed_links() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink("real", dir.path().join("via")).unwrap();
        let p = resolve(&dir.path().join("via/../via/r.json"), "-o").unwrap();
        assert_eq!(p.name, "r.json");
        assert!(p.existing.is_none());
        assert_eq!(
            p.dir_path.canonicalize().unwrap(),
            real.canonicalize().unwrap()
        );
        std::os::unix::fs::symlink("loop", dir.path().join("loop")).unwrap();
        let e = resolve(&dir.path().join("loop"), "-o").err().unwrap();
        assert!(format!("{e}").contains("loop of symbolic links"), "{e}");
        let e = resolve(&dir.path().join("nowhere/r.json"), "-o")
            .err()
            .unwrap();
        assert!(format!("{e}").contains("does not exist"), "{e}");
        assert!(resolve(Path::new("/"), "-o").unwrap().is_dir());
        // A /proc magic link (what /dev/stdout points to where udev made
        // it; devtmpfs alone, as in the test guests, has no /dev/stdout)
        // is the kernel's to follow.
        let out = resolve(Path::new("/proc/self/fd/1"), "-o").unwrap();
        assert!(out.kernel_link);
    }
}
