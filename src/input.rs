//! Reading the files kheap is given (reports and snapshots for `diff`,
//! serve's `--config`): bounded, so `/dev/zero` or a 2 GB sparse file costs
//! nothing, and interruptible, so SIGINT or SIGTERM ends the read.

use std::io::Read;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// The largest input kheap reads (docs/reliability.md): far above any
/// report (a record of a busy machine is a few MiB).
pub const MAX_INPUT: u64 = 256 << 20;

/// Opens `path` to read without blocking on it: a FIFO with no writer
/// (another user's, put where a config or certificate was expected) opens
/// at once instead of waiting forever. The descriptor blocks again once
/// open, for the reads.
pub fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    // SAFETY: plain fcntl calls on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
    }
    Ok(f)
}

/// Opens a file that must be a regular file (a config, a certificate, a
/// library): never blocks on a FIFO, and refuses anything but a regular
/// file in one line. `shown` names it ("the config file /etc/x.yml").
pub fn open_regular(path: &Path, shown: &str) -> Result<std::fs::File> {
    let file = open_nonblocking(path).with_context(|| format!("cannot read {shown}"))?;
    let meta = file
        .metadata()
        .with_context(|| format!("cannot read {shown}"))?;
    if meta.is_dir() {
        bail!("{shown} is a directory: give a file");
    }
    if !meta.is_file() {
        bail!("{shown} is not a regular file (a named pipe, socket or device): give a file");
    }
    Ok(file)
}

/// [`read_bounded`] for a file that must be a regular file (configs):
/// see [`open_regular`].
pub fn read_regular(path: &Path, what: &str, limit: u64) -> Result<String> {
    let file = open_regular(path, &format!("{what} {}", path.display()))?;
    read_open(file, path, what, limit)
}

/// Reads the text file at `path` (`what` names it in messages, e.g. "the
/// config file"). A regular file larger than `limit` is refused before a
/// byte is read; anything else (a pipe, a device) is read up to `limit`
/// bytes and refused past them. Opening never blocks (a FIFO with no
/// writer reads as empty). A stop signal (crate::signals) ends it.
pub fn read_bounded(path: &Path, what: &str, limit: u64) -> Result<String> {
    let file =
        open_nonblocking(path).with_context(|| format!("cannot read {what} {}", path.display()))?;
    read_open(file, path, what, limit)
}

fn read_open(mut file: std::fs::File, path: &Path, what: &str, limit: u64) -> Result<String> {
    let shown = || format!("{what} {}", path.display());
    let meta = file
        .metadata()
        .with_context(|| format!("cannot read {}", shown()))?;
    if meta.is_dir() {
        bail!("{} is a directory: give a file", shown());
    }
    let too_big = || {
        anyhow::anyhow!(
            "{} is larger than {} MiB, more than kheap reads: give a kheap file",
            shown(),
            limit >> 20
        )
    };
    if meta.is_file() && meta.len() > limit {
        return Err(too_big());
    }
    let regular = meta.is_file() || meta.file_type().is_block_device();
    let mut bytes = Vec::with_capacity(if regular { meta.len() as usize } else { 0 });
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        if crate::signals::stop_requested() {
            bail!("stopped while reading {}", shown());
        }
        let n = match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", shown())),
        };
        if bytes.len() as u64 + n as u64 > limit {
            return Err(too_big());
        }
        bytes.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("{} is not text (not UTF-8): give a kheap file", shown()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn inputs_past_the_limit_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small.json");
        std::fs::write(&small, "{}\n").unwrap();
        assert_eq!(read_bounded(&small, "report", 16).unwrap(), "{}\n");
        // A sparse file: refused by its size, nothing read.
        let sparse = dir.path().join("sparse.json");
        let f = std::fs::File::create(&sparse).unwrap();
        f.set_len(2 << 30).unwrap();
        let e = read_bounded(&sparse, "report", MAX_INPUT).unwrap_err();
        assert!(format!("{e}").contains("larger than 256 MiB"), "{e}");
        // A device: read up to the limit, then refused.
        let e = read_bounded(Path::new("/dev/zero"), "the config file", 1 << 20).unwrap_err();
        assert!(format!("{e}").contains("larger than 1 MiB"), "{e}");
        let e = read_bounded(dir.path(), "report", 16).unwrap_err();
        assert!(format!("{e}").contains("is a directory"), "{e}");
        let mut bin = std::fs::File::create(dir.path().join("bin")).unwrap();
        bin.write_all(&[0xff, 0xfe]).unwrap();
        let e = read_bounded(&dir.path().join("bin"), "report", 16).unwrap_err();
        assert!(format!("{e}").contains("not UTF-8"), "{e}");
    }
}
