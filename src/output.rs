//! Where reports and snapshots go: checked before tracing starts (so a bad
//! `-o` costs nothing), and written atomically (a temporary file in the same
//! directory, then a rename), so a full disk or a signal never leaves a
//! half-written report behind. Every subcommand writes through here.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{bail, Context, Result};

/// The directory a file goes into ("." for a bare name).
fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// A temporary name beside `path`, unique to this process and call.
fn temp_beside(path: &Path) -> PathBuf {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "report".into());
    dir_of(path).join(format!(
        ".{name}.kheap-{}-{}.tmp",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Checks, before anything is attached, that a file can be written at
/// `path`: its directory exists and takes a new file (a byte is written and
/// removed, so a read-only or full file system is caught now).
pub fn check_writable(path: &Path, flag: &str) -> Result<()> {
    if fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
        // A device or pipe (`-o /dev/null`): written in place.
        return OpenOptions::new()
            .write(true)
            .open(path)
            .map(drop)
            .with_context(|| format!("{flag} {}: cannot write there", path.display()));
    }
    if path.is_dir() {
        bail!("{flag} {} is a directory: give a file name", path.display());
    }
    let dir = dir_of(path);
    if !dir.is_dir() {
        bail!(
            "{flag} {}: directory {} does not exist",
            path.display(),
            dir.display()
        );
    }
    probe_dir(dir).with_context(|| format!("{flag} {}: cannot write there", path.display()))
}

/// Checks that files can be created in `dir` (for --snapshot-dir).
pub fn check_dir_writable(dir: &Path, flag: &str) -> Result<()> {
    if !dir.is_dir() {
        bail!("{flag} {} is not a directory", dir.display());
    }
    probe_dir(dir).with_context(|| format!("{flag} {}: cannot write there", dir.display()))
}

fn probe_dir(dir: &Path) -> Result<()> {
    let probe = temp_beside(&dir.join("probe"));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .and_then(|mut f| f.write_all(b"k").and_then(|()| f.sync_all()));
    let _ = fs::remove_file(&probe);
    Ok(written?)
}

/// Writes `text` to `path` atomically: readers see the old file or the
/// whole new one, never a part. Only a regular file (or a new one) is
/// replaced: a device, pipe or socket (`-o /dev/null`, `-o /dev/stdout`)
/// is written in place, and a symbolic link's target is replaced, not the
/// link.
pub fn write_atomic(path: &Path, text: &str) -> Result<()> {
    write_bytes_atomic(path, text.as_bytes())
}

/// [`write_atomic`] for binary reports (pprof).
pub fn write_bytes_atomic(path: &Path, text: &[u8]) -> Result<()> {
    let resolved;
    let path = match fs::canonicalize(path) {
        Ok(p) => {
            resolved = p;
            &resolved
        }
        Err(_) => path,
    };
    if fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        return OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|mut f| f.write_all(text))
            .with_context(|| format!("writing {}", path.display()));
    }
    let tmp = temp_beside(path);
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text).and_then(|()| f.sync_all()))
        .and_then(|()| fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    Ok(())
}

/// Prints a report, or writes it to `output` atomically.
pub fn emit(text: &str, output: Option<&Path>) -> Result<()> {
    match output {
        Some(path) => write_atomic(path, text),
        None => {
            // A closed pipe (| head) is the reader's choice, not an error.
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            Ok(())
        }
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
        None => {
            let _ = std::io::stdout().lock().write_all(bytes);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn bad_destinations_are_refused_before_tracing() {
        let dir = tempfile::tempdir().unwrap();
        let e = check_writable(Path::new("/nonexistent/x"), "-o").unwrap_err();
        assert!(format!("{e:#}").contains("does not exist"), "{e:#}");
        let e = check_writable(dir.path(), "-o").unwrap_err();
        assert!(format!("{e:#}").contains("is a directory"), "{e:#}");
        assert!(check_writable(&dir.path().join("r.json"), "-o").is_ok());
        // A bare name goes into the working directory (which a unit test
        // cannot assume writable: the VM tests run in a read-only tree).
        assert_eq!(dir_of(Path::new("r.json")), Path::new("."));
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
