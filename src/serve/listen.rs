//! Where `kheap serve` listens: a TCP address or a unix socket. The unix
//! socket is created the way a root daemon must on a shared machine: never
//! through a link another user planted, replacing only a stale socket of
//! root's own, with the mode and group asked for from the moment it exists.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// `--listen`: `ADDR:PORT` or `unix:PATH`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::str::FromStr for Listen {
    type Err = String;

    fn from_str(s: &str) -> Result<Listen, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if !path.starts_with('/') {
                return Err(format!(
                    "unix:{path}: give the socket's absolute path (unix:/run/kheap/kheap.sock)"
                ));
            }
            return Ok(Listen::Unix(PathBuf::from(path)));
        }
        s.parse()
            .map(Listen::Tcp)
            .map_err(|_| format!("{s:?}: expected ADDR:PORT (127.0.0.1:9464) or unix:PATH"))
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Tcp(a) => write!(f, "{a}"),
            Listen::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// Owner and mode of a unix socket (`--socket-mode`, `--socket-group`).
#[derive(Clone, Copy, Debug)]
pub struct SocketAccess {
    pub mode: u32,
    pub gid: Option<u32>,
}

/// `--socket-mode`: octal permission bits.
pub fn parse_mode(s: &str) -> Result<u32, String> {
    match u32::from_str_radix(s.trim_start_matches("0o"), 8) {
        Ok(m) if m <= 0o777 => Ok(m),
        _ => Err(format!(
            "{s:?}: expected octal permission bits such as 0660"
        )),
    }
}

/// `--socket-group`: a group name or number, either naming a group that
/// exists (a number no group has is a typo, not a grant).
pub fn group_id(name: &str) -> Result<u32> {
    if let Ok(gid) = name.parse::<u32>() {
        let mut group: libc::group = unsafe { std::mem::zeroed() };
        let mut buf = vec![0u8; 16 * 1024];
        let mut found: *mut libc::group = std::ptr::null_mut();
        // SAFETY: group, buf and found are writable and outlive the call.
        let rc = unsafe {
            libc::getgrgid_r(
                gid,
                &mut group,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut found,
            )
        };
        if rc != 0 || found.is_null() {
            bail!("--socket-group {name}: no group has this number (see /etc/group)");
        }
        return Ok(gid);
    }
    let cname = std::ffi::CString::new(name).context("--socket-group: a NUL in the name")?;
    let mut group: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0u8; 16 * 1024];
    let mut found: *mut libc::group = std::ptr::null_mut();
    let rc = unsafe {
        libc::getgrnam_r(
            cname.as_ptr(),
            &mut group,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() {
        bail!("--socket-group {name}: no such group (see /etc/group)");
    }
    Ok(group.gr_gid)
}

/// A bound listener.
pub enum Listener {
    Tcp(TcpListener),
    /// The socket, and the inode of its path (removed on exit only if the
    /// path still names it).
    Unix(UnixListener, PathBuf, u64),
}

impl Listener {
    pub fn bind(listen: &Listen, access: SocketAccess) -> Result<Listener> {
        match listen {
            Listen::Tcp(addr) => TcpListener::bind(addr)
                .map(Listener::Tcp)
                .with_context(|| format!("cannot listen on {addr}")),
            Listen::Unix(path) => bind_unix(path, access),
        }
    }

    /// The TCP address bound (its port chosen by the kernel for port 0).
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr().ok(),
            Listener::Unix(..) => None,
        }
    }

    pub fn is_unix(&self) -> bool {
        matches!(self, Listener::Unix(..))
    }

    pub fn set_nonblocking(&self) -> std::io::Result<()> {
        match self {
            Listener::Tcp(l) => l.set_nonblocking(true),
            Listener::Unix(l, ..) => l.set_nonblocking(true),
        }
    }

    pub fn accept(&self) -> std::io::Result<Stream> {
        match self {
            Listener::Tcp(l) => l.accept().map(|(s, _)| Stream::Tcp(s)),
            Listener::Unix(l, ..) => l.accept().map(|(s, _)| Stream::Unix(s)),
        }
    }
}

impl AsRawFd for Listener {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(l, ..) => l.as_raw_fd(),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path, ino) = self {
            if std::fs::symlink_metadata(&*path).is_ok_and(|m| m.ino() == *ino) {
                let _ = std::fs::remove_file(&*path);
            }
        }
    }
}

/// Refuses a socket path in a directory another user could change
/// entries of (they could swap the socket for something else between two
/// steps).
fn check_directory(dir: &Path) -> Result<()> {
    let meta = std::fs::metadata(dir)
        .with_context(|| format!("the socket's directory {}", dir.display()))?;
    let me = unsafe { libc::geteuid() };
    let sticky = meta.mode() & libc::S_ISVTX != 0;
    if !meta.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    if meta.uid() != me && meta.uid() != 0 {
        bail!(
            "the socket's directory {} belongs to uid {}: choose a directory of root's (e.g. /run/kheap)",
            dir.display(),
            meta.uid()
        );
    }
    if meta.mode() & 0o022 != 0 && !sticky {
        bail!(
            "the socket's directory {} is writable by other users: choose one only root can write (e.g. /run/kheap)",
            dir.display()
        );
    }
    Ok(())
}

fn bind_unix(path: &Path, access: SocketAccess) -> Result<Listener> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    check_directory(dir)?;
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => bail!("cannot look at {}: {e}", path.display()),
        Ok(meta) => {
            let me = unsafe { libc::geteuid() };
            if !meta.file_type().is_socket() || (meta.uid() != me && meta.uid() != 0) {
                bail!(
                    "{} exists and is not a socket of root's: remove it or choose another path",
                    path.display()
                );
            }
            // lstat said socket: connecting cannot follow a link.
            match UnixStream::connect(path) {
                Ok(_) => bail!(
                    "{} is in use by a running server: stop it or choose another path",
                    path.display()
                ),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    std::fs::remove_file(path).with_context(|| {
                        format!("cannot remove the stale socket {}", path.display())
                    })?;
                }
                Err(e) => bail!("{}: {e}", path.display()),
            }
        }
    }
    // Created with its final mode (bind makes the node; it never follows a
    // link at the path, failing with EADDRINUSE instead).
    let old = unsafe { libc::umask(!access.mode & 0o777) };
    let bound = UnixListener::bind(path);
    unsafe { libc::umask(old) };
    let listener = bound.with_context(|| format!("cannot listen on unix:{}", path.display()))?;
    let ino = std::fs::symlink_metadata(path)
        .with_context(|| format!("unix:{}", path.display()))?
        .ino();
    let bound = Listener::Unix(listener, path.to_path_buf(), ino);
    if let Some(gid) = access.gid {
        std::os::unix::fs::lchown(path, None, Some(gid))
            .with_context(|| format!("cannot give unix:{} to group {gid}", path.display()))?;
    }
    Ok(bound)
}

/// An accepted connection.
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nonblocking(on),
            Stream::Unix(s) => s.set_nonblocking(on),
        }
    }

    pub fn set_timeouts(&self, read: Duration, write: Duration) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_read_timeout(Some(read))?;
                s.set_write_timeout(Some(write))
            }
            Stream::Unix(s) => {
                s.set_read_timeout(Some(read))?;
                s.set_write_timeout(Some(write))
            }
        }
    }

    pub fn shutdown_write(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Write),
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Write),
        };
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_parses_addresses_and_unix_paths() {
        assert_eq!(
            "127.0.0.1:9464".parse::<Listen>().unwrap(),
            Listen::Tcp("127.0.0.1:9464".parse().unwrap())
        );
        assert_eq!(
            "unix:/run/k.sock".parse::<Listen>().unwrap(),
            Listen::Unix("/run/k.sock".into())
        );
        assert!("unix:k.sock"
            .parse::<Listen>()
            .unwrap_err()
            .contains("absolute"));
        assert!("localhost"
            .parse::<Listen>()
            .unwrap_err()
            .contains("unix:PATH"));
        assert_eq!(parse_mode("0660"), Ok(0o660));
        assert!(parse_mode("0999").is_err() && parse_mode("7777").is_err());
        assert_eq!(group_id("0").unwrap(), 0);
        assert_eq!(group_id("root").unwrap(), 0);
        assert!(group_id("no-such-group-kheap").is_err());
        let e = group_id("99999999").unwrap_err().to_string();
        assert_eq!(
            e,
            "--socket-group 99999999: no group has this number (see /etc/group)"
        );
    }

    #[test]
    fn a_unix_socket_replaces_only_a_stale_socket_and_never_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let access = SocketAccess {
            mode: 0o640,
            gid: None,
        };
        let path = dir.path().join("k.sock");
        let target = dir.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let e = format!("{:#}", bind_unix(&path, access).err().unwrap());
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        std::fs::remove_file(&path).unwrap();

        let l = bind_unix(&path, access).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.mode() & 0o777, 0o640);
        // A live server's socket is not taken over.
        let e = format!("{:#}", bind_unix(&path, access).err().unwrap());
        assert!(e.contains("in use"), "{e}");
        drop(l);
        assert!(!path.exists(), "removed on drop");
        // A stale one (its server gone without removing it) is replaced.
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let again = bind_unix(&path, access).unwrap();
        drop(again);
        assert!(!path.exists(), "removed on drop");
    }
}
