//! Where reports and snapshots go: checked before tracing starts (so a bad
//! `-o` costs nothing), and written atomically (a temporary file in the same
//! directory, then a rename), so a full disk or a signal never leaves a
//! half-written report behind. Every subcommand writes through here.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::safe_path::{self, Place};

/// How many random temporary names to try before giving up.
const TEMP_TRIES: usize = 64;

/// A temporary name for `name`: this process's, and 64 random bits, so
/// that another user cannot take it beforehand in a directory they may
/// write to (a taken name would stop the write; O_EXCL keeps it from being
/// used).
fn temp_name(name: &OsStr) -> std::io::Result<OsString> {
    let mut n = OsString::from(".");
    n.push(if name == "." {
        OsStr::new("report")
    } else {
        name
    });
    n.push(format!(
        ".kheap-{}-{:016x}.tmp",
        std::process::id(),
        crate::sys::random_u64()?
    ));
    Ok(n)
}

/// A new file in `dir` under a temporary name, never through a link and
/// never an existing file (O_NOFOLLOW | O_EXCL): a name already there is
/// skipped for another.
fn create_temp(dir: &OwnedFd, name: &OsStr) -> std::io::Result<(OsString, File)> {
    for _ in 0..TEMP_TRIES {
        let tmp = temp_name(name)?;
        match safe_path::openat(
            dir,
            &tmp,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            0o600,
        ) {
            Ok(fd) => return Ok((tmp, File::from(fd))),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!("{TEMP_TRIES} random temporary names were all taken"),
    ))
}

fn unlink(dir: &OwnedFd, name: &OsStr) {
    if let Ok(c) = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(name)) {
        // SAFETY: c is a valid C string.
        unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) };
    }
}

fn rename_within(dir: &OwnedFd, from: &OsStr, to: &OsStr) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let bad = |_| std::io::Error::from_raw_os_error(libc::EINVAL);
    let (from, to) = (
        std::ffi::CString::new(from.as_bytes()).map_err(bad)?,
        std::ffi::CString::new(to.as_bytes()).map_err(bad)?,
    );
    // SAFETY: both are valid C strings.
    let ret =
        unsafe { libc::renameat(dir.as_raw_fd(), from.as_ptr(), dir.as_raw_fd(), to.as_ptr()) };
    if ret == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The umask, read without changing it (umask(2) can only set it, and
/// another thread may be creating a file meanwhile); 022 if unknown.
fn umask() -> libc::mode_t {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| libc::mode_t::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

/// Who may read a new file, before the umask takes its share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readers {
    /// Reports, snapshots, profiles: slab, process and cgroup data that
    /// root may read and others not (0600).
    Owner,
    /// Man pages and completion scripts (0644).
    Everyone,
}

/// The mode a file gets: that of the file it replaces when kheap's user
/// owns it (a mode that user chose); otherwise, for a new file or another
/// user's (a 0666 file a user left to be replaced), the default for its
/// readers less the umask.
fn mode_for(place: &Place, readers: Readers) -> libc::mode_t {
    let euid = unsafe { libc::geteuid() };
    match place.existing {
        Some(st) if st.st_uid == euid => st.st_mode & 0o777,
        _ => {
            let default = match readers {
                Readers::Owner => 0o600,
                Readers::Everyone => 0o644,
            };
            default & !umask()
        }
    }
}

/// Whether the path names something to write in place: a device, or an
/// open file through the kernel's /proc links (`-o /dev/null`,
/// `-o /dev/stdout`), not a file to replace.
fn written_in_place(place: &Place) -> bool {
    place.kernel_link || (place.existing.is_some() && !place.is_regular() && !place.is_dir())
}

fn is_fifo_or_socket(mode: libc::mode_t) -> bool {
    matches!(mode & libc::S_IFMT, libc::S_IFIFO | libc::S_IFSOCK)
}

fn fifo_refused(shown: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{shown} is a named pipe or socket, not a file: kheap writes reports to regular \
         files and devices; remove it or give another path"
    )
}

/// Opens a device (or a kernel link's open file) to write in place,
/// without blocking: a FIFO put there meanwhile, or one with no reader
/// behind /dev/stdout, is an error, never a wait. The descriptor blocks
/// again once open, so a slow reader is waited for, not cut short.
fn open_in_place(place: &Place, shown: &str) -> Result<File> {
    let f = place
        .open(libc::O_WRONLY | libc::O_NONBLOCK)
        .with_context(|| format!("{shown}: cannot write there"))?;
    let st = safe_path::fstat(&f).with_context(|| format!("{shown}: cannot write there"))?;
    if !place.kernel_link && is_fifo_or_socket(st.st_mode) {
        return Err(fifo_refused(shown));
    }
    // SAFETY: plain fcntl calls on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
    }
    Ok(f)
}

/// Where a report goes, checked: not a directory, not in /proc or /sys.
fn file_place(path: &Path, shown: &str) -> Result<Place> {
    let place = safe_path::resolve(path, shown)?;
    if place.is_dir() {
        bail!("{shown} is a directory: give a file name");
    }
    // Another user's FIFO would receive root's report (or block it
    // forever with no reader).
    if !place.kernel_link
        && place
            .existing
            .is_some_and(|st| is_fifo_or_socket(st.st_mode))
    {
        return Err(fifo_refused(shown));
    }
    if !written_in_place(&place) && place.in_kernel_fs() {
        bail!(
            "{shown}: {} is in a kernel file system (proc or sysfs), not a place for reports: \
             give a file in a directory you can write",
            place.dir_path.display()
        );
    }
    Ok(place)
}

/// Checks, before anything is attached, that a file can be written at
/// `path`: its directory exists and takes a new file (a byte is written and
/// removed, so a read-only or full file system is caught now), and no link
/// of another user's leads there (see crate::safe_path).
pub fn check_writable(path: &Path, flag: &str) -> Result<()> {
    let shown = format!("{flag} {}", path.display());
    let place = file_place(path, &shown)?;
    if written_in_place(&place) {
        return open_in_place(&place, &shown).map(drop);
    }
    probe_dir(&place.dir).with_context(|| format!("{shown}: cannot write there"))
}

/// Checks that files can be created in `dir` (for --snapshot-dir).
pub fn check_dir_writable(dir: &Path, flag: &str) -> Result<()> {
    let shown = format!("{flag} {}", dir.display());
    let place = safe_path::resolve(dir, &shown)?;
    if !place.is_dir() {
        bail!("{shown} is not a directory");
    }
    let fd = place
        .open_dir()
        .with_context(|| format!("{shown}: cannot open it"))?;
    probe_dir(&fd).with_context(|| format!("{shown}: cannot write there"))
}

fn probe_dir(dir: &OwnedFd) -> Result<()> {
    let (name, mut f) = create_temp(dir, OsStr::new("probe"))?;
    let written = f.write_all(b"k").and_then(|()| f.sync_all());
    unlink(dir, &name);
    Ok(written?)
}

/// Writes `text` to `path` atomically: readers see the old file or the
/// whole new one, never a part. Only a regular file (or a new one) is
/// replaced (its mode: see `mode_for`, 0600 less the umask for a new one);
/// a device (`-o /dev/null`) or a kernel link's open file (`-o /dev/stdout`)
/// is written in place; a named pipe is refused. A symbolic link's target
/// is replaced, not the link, but only a link that may be followed
/// (crate::safe_path).
pub fn write_atomic(path: &Path, text: &str) -> Result<()> {
    write_file(path, text.as_bytes(), Readers::Owner)
}

/// [`write_atomic`] for binary reports (pprof).
pub fn write_bytes_atomic(path: &Path, text: &[u8]) -> Result<()> {
    write_file(path, text, Readers::Owner)
}

/// The one way kheap writes a file: [`write_atomic`], with the mode a new
/// file gets said by `readers`.
pub fn write_file(path: &Path, text: &[u8], readers: Readers) -> Result<()> {
    let shown = format!("writing {}", path.display());
    let place = file_place(path, &shown)?;
    if written_in_place(&place) {
        return open_in_place(&place, &shown)?
            .write_all(text)
            .with_context(|| shown.clone());
    }
    let (tmp, mut f) = create_temp(&place.dir, &place.name).with_context(|| shown.clone())?;
    let written = f
        .write_all(text)
        .and_then(|()| {
            f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode_for(
                &place, readers,
            )))
        })
        .and_then(|()| f.sync_all())
        .and_then(|()| rename_within(&place.dir, &tmp, &place.name));
    if let Err(e) = written {
        unlink(&place.dir, &tmp);
        return Err(e).with_context(|| shown);
    }
    Ok(())
}

/// Opens a file for a stream of reports (`top -b -o`, `slab --watch -o`):
/// a new file put in place at once (the old one is replaced, not truncated
/// through whatever it is), under the same rules as [`write_atomic`].
pub fn create_stream(path: &Path, flag: &str) -> Result<File> {
    let shown = format!("{flag} {}", path.display());
    let place = file_place(path, &shown)?;
    if written_in_place(&place) {
        return open_in_place(&place, &shown);
    }
    let (tmp, f) = create_temp(&place.dir, &place.name)
        .with_context(|| format!("{shown}: cannot write there"))?;
    let placed = f
        .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode_for(
            &place,
            Readers::Owner,
        )))
        .and_then(|()| rename_within(&place.dir, &tmp, &place.name));
    if let Err(e) = placed {
        unlink(&place.dir, &tmp);
        return Err(e).with_context(|| format!("{shown}: cannot write there"));
    }
    Ok(f)
}

/// `text` made safe to print on a terminal: every control character but
/// newline and tab (ESC, BEL, CR, backspace, DEL and the C1 range, which
/// terminals also obey) becomes a visible `\xNN` escape, so a process
/// name, cgroup, symbol or diff input that carries an escape sequence
/// (`$'\e]0;PWN\a'`) is shown, not obeyed. The one function every text
/// report goes through (`emit`, `Sink`); JSON needs nothing more (its
/// strings escape control characters) and SVG escapes on its own.
pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\x{:02x}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Writes `bytes` to `out` and flushes it, checked: Ok(false) when the
/// reader closed the pipe (`| head`, the reader's choice, not an error);
/// any other failure (a full disk, /dev/full, EIO) is an error, so a cut
/// report never ends with exit status 0.
pub fn write_checked(out: &mut impl Write, bytes: &[u8]) -> Result<bool> {
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e).context("writing to standard output"),
    }
}

/// Prints `bytes` on standard output, checked ([`write_checked`]).
pub fn print_bytes(bytes: &[u8]) -> Result<bool> {
    write_checked(&mut std::io::stdout().lock(), bytes)
}

/// Prints `text` on standard output, checked ([`write_checked`]), made
/// [`terminal_safe`].
pub fn print(text: &str) -> Result<bool> {
    print_bytes(terminal_safe(text).as_bytes())
}

/// Prints a report, or writes it to `output` atomically; either way made
/// [`terminal_safe`] (a file is read on a terminal too).
pub fn emit(text: &str, output: Option<&Path>) -> Result<()> {
    match output {
        Some(path) => write_atomic(path, &terminal_safe(text)),
        None => print(text).map(drop),
    }
}

/// Refuses, before anything is traced, to write a binary format to a
/// terminal: it would only garble the screen.
pub fn check_binary_destination(output: Option<&Path>, format: &str) -> Result<()> {
    use std::io::IsTerminal;
    if output.is_none() && std::io::stdout().is_terminal() {
        bail!("--format {format} is binary: write it to a file with -o FILE (or pipe it)");
    }
    Ok(())
}

/// Writes a binary report to `output`, or to stdout (never a terminal:
/// see [`check_binary_destination`]).
pub fn emit_bytes(bytes: &[u8], output: Option<&Path>) -> Result<()> {
    match output {
        Some(path) => write_bytes_atomic(path, bytes),
        None => print_bytes(bytes).map(drop),
    }
}

/// Where a stream of reports goes (top -b, slab --watch): stdout, or a file
/// created before anything is attached, so a path that cannot be written is
/// said at once.
pub enum Sink {
    Stdout,
    File(std::fs::File),
}

impl Sink {
    pub fn create(path: Option<&Path>) -> Result<Sink> {
        Ok(match path {
            Some(p) => Sink::File(create_stream(p, "-o")?),
            None => Sink::Stdout,
        })
    }

    /// Writes one report. A closed stdout pipe (`| head`) ends the run
    /// quietly (false); any other failed write (a full disk) is an error.
    pub fn write(&mut self, text: &str) -> Result<bool> {
        match self {
            Sink::Stdout => print(text),
            Sink::File(f) => {
                f.write_all(terminal_safe(text).as_bytes())
                    .and_then(|()| f.flush())
                    .context("writing the output file")?;
                Ok(true)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn control_characters_are_shown_not_sent_to_the_terminal() {
        assert!(matches!(
            terminal_safe("kmalloc-64 │ bash\n\tx é"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(
            terminal_safe("\x1b]0;PWN\x07name\r\x08\x7f\u{9b}31m"),
            "\\x1b]0;PWN\\x07name\\x0d\\x08\\x7f\\x9b31m"
        );
        // What emit writes to a file is escaped the same way.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.txt");
        emit("comm \x1b[2J\n", Some(&path)).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "comm \\x1b[2J\n");
    }

    #[test]
    fn failed_writes_are_errors_and_a_closed_pipe_is_not() {
        let mut full = fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let e = write_checked(&mut full, b"report\n").unwrap_err();
        assert!(format!("{e:#}").contains("No space left"), "{e:#}");
        struct Closed;
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        assert!(!write_checked(&mut Closed, b"x").unwrap());
        assert!(write_checked(&mut Vec::new(), b"x").unwrap());
    }

    #[test]
    fn writes_whole_files_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        write_atomic(&path, "old\n").unwrap();
        write_atomic(&path, "new\n").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new\n");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn temporary_names_cannot_be_guessed_or_taken_beforehand() {
        // The old names were .NAME.kheap-PID-SEQ.tmp: another user could
        // create the next one first and stop root's write.
        let dir = tempfile::tempdir().unwrap();
        let pid = std::process::id();
        for seq in 0..64 {
            let planted = dir.path().join(format!(".r.json.kheap-{pid}-{seq}.tmp"));
            fs::write(planted, "theirs").unwrap();
        }
        let (a, b) = (temp_name("r.json".as_ref()), temp_name("r.json".as_ref()));
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_ne!(a, b);
        let random = a.to_str().unwrap().rsplit('-').next().unwrap();
        assert_eq!(random.len(), "0123456789abcdef.tmp".len(), "{a:?}");
        write_atomic(&dir.path().join("r.json"), "mine\n").unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join("r.json")).unwrap(),
            "mine\n"
        );
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 65);
    }

    #[test]
    fn bad_destinations_are_refused_before_tracing() {
        let dir = tempfile::tempdir().unwrap();
        let e = check_writable(Path::new("/nonexistent/x"), "-o").unwrap_err();
        assert!(format!("{e:#}").contains("does not exist"), "{e:#}");
        let e = check_writable(dir.path(), "-o").unwrap_err();
        assert!(format!("{e:#}").contains("is a directory"), "{e:#}");
        assert!(check_writable(&dir.path().join("r.json"), "-o").is_ok());
        // /proc is no place for a report, and says so.
        let e = check_writable(Path::new("/proc/version"), "-o").unwrap_err();
        assert!(format!("{e:#}").contains("kernel file system"), "{e:#}");
        assert!(check_dir_writable(dir.path(), "--snapshot-dir").is_ok());
        // Nothing is left by the checks.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn devices_and_links_are_written_not_replaced() {
        use std::os::unix::fs::FileTypeExt;
        check_writable(Path::new("/dev/null"), "-o").unwrap();
        write_atomic(Path::new("/dev/null"), "report\n").unwrap();
        let m = fs::metadata("/dev/null").unwrap();
        assert!(m.file_type().is_char_device(), "/dev/null was replaced");
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.json");
        let link = dir.path().join("link.json");
        fs::write(&target, "old\n").unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();
        write_atomic(&link, "new\n").unwrap();
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read_to_string(&target).unwrap(), "new\n");
    }

    #[test]
    fn modes_are_kept_and_new_files_are_0600_less_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        let page = dir.path().join("kheap.1");
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let old_umask = unsafe { libc::umask(0o077) };
        write_atomic(&path, "new\n").unwrap();
        write_file(&page, b"page\n", Readers::Everyone).unwrap();
        unsafe { libc::umask(0o022) };
        let (under_077, page_under_077) = (mode(&path), mode(&page));
        fs::remove_file(&path).unwrap();
        fs::remove_file(&page).unwrap();
        write_atomic(&path, "new\n").unwrap();
        write_file(&page, b"page\n", Readers::Everyone).unwrap();
        unsafe { libc::umask(0o277) };
        let other = dir.path().join("o.json");
        write_atomic(&other, "new\n").unwrap();
        unsafe { libc::umask(old_umask) };
        assert_eq!(under_077, 0o600);
        assert_eq!(page_under_077, 0o600);
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&page), 0o644);
        assert_eq!(mode(&other), 0o400);
        // One's own file keeps the mode it was given.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        write_atomic(&path, "again\n").unwrap();
        assert_eq!(mode(&path), 0o640);
        let mut f = create_stream(&path, "-o").unwrap();
        f.write_all(b"stream\n").unwrap();
        assert_eq!(mode(&path), 0o640);
        assert_eq!(fs::read_to_string(&path).unwrap(), "stream\n");
    }

    #[test]
    fn a_fifo_is_refused_at_once_not_written_or_waited_on() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("x.json");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        // No reader: these would block forever if they opened it.
        for e in [
            check_writable(&fifo, "-o").unwrap_err(),
            write_atomic(&fifo, "report").unwrap_err(),
            create_stream(&fifo, "-o").map(drop).unwrap_err(),
        ] {
            assert!(format!("{e:#}").contains("is a named pipe"), "{e:#}");
        }
        let st = fs::symlink_metadata(&fifo).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_fifo(&st.file_type()));
    }

    #[test]
    fn a_symlink_loop_is_refused_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("r.json");
        std::os::unix::fs::symlink("r.json", &link).unwrap();
        let e = check_writable(&link, "-o").unwrap_err();
        assert!(format!("{e:#}").contains("loop of symbolic links"), "{e:#}");
        assert!(write_atomic(&link, "x").is_err());
        assert!(create_stream(&link, "-o").is_err());
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
    }

    #[test]
    fn a_failed_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        write_atomic(&path, "old\n").unwrap();
        // Renaming a file onto a non-empty directory fails.
        let target = dir.path().join("d");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("x"), "").unwrap();
        assert!(write_atomic(&target, "new\n").is_err());
        assert_eq!(fs::read_to_string(&path).unwrap(), "old\n");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
