//! Root tests for issue 27: kheap run as root on a machine other people log
//! into. A real second local user plants links in a sticky, world-writable
//! directory; root's files must stay untouched, and kheap says so in one
//! line. Also what kheap leaves behind when killed, and signals it does
//! not use.

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// A local user made for one test (useradd) and removed (userdel) when
/// dropped, so a failing test leaves no account behind.
struct TestUser {
    name: String,
    uid: u32,
    gid: u32,
}

impl TestUser {
    fn create(tag: &str) -> TestUser {
        let name = format!("kht{}{tag}", std::process::id());
        let ok = Command::new("useradd")
            .args(["-M", "-N", "-s", "/usr/sbin/nologin", &name])
            .status()
            .expect("running useradd")
            .success();
        assert!(ok, "useradd {name} failed");
        let user = TestUser {
            uid: id(&name, "-u"),
            gid: id(&name, "-g"),
            name,
        };
        assert_ne!(user.uid, 0);
        user
    }

    /// Runs a command as this user.
    fn run(&self, program: &str, args: &[&str]) {
        let (uid, gid) = (
            format!("--reuid={}", self.uid),
            format!("--regid={}", self.gid),
        );
        let ok = Command::new("setpriv")
            .args([uid.as_str(), gid.as_str(), "--clear-groups", program])
            .args(args)
            .status()
            .expect("running as the test user")
            .success();
        assert!(ok, "{program} {args:?} as {} failed", self.name);
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).status();
    }
}

fn id(name: &str, flag: &str) -> u32 {
    let out = Command::new("id").args([flag, name]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// A sticky, world-writable directory like /tmp (a fresh one: the test owns
/// its names), removed when dropped.
fn sticky_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("kheap-sticky-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    dir
}

/// A root file with a secret, mode 0600, out of the users' reach.
fn root_file(dir: &Path) -> PathBuf {
    let victim = dir.join("victim");
    std::fs::write(&victim, "secret\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    victim
}

fn assert_untouched(victim: &Path) {
    assert_eq!(std::fs::read_to_string(victim).unwrap(), "secret\n");
    let m = std::fs::metadata(victim).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o600);
    assert_eq!(m.uid(), 0);
}

fn refused_in_one_line(args: &[&str]) -> String {
    let out = wait_bounded(
        Command::new(KHEAP)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
        HANG_LIMIT,
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "kheap {args:?} was accepted: {err}");
    assert_eq!(err.lines().count(), 1, "kheap {args:?}: {err}");
    assert!(!err.contains("tracing"), "traced before refusing: {err}");
    err
}

#[test]
fn another_users_link_in_a_sticky_directory_is_not_followed() {
    require_root();
    let user = TestUser::create("a");
    let sticky = sticky_dir();
    let private = tempfile::tempdir().unwrap();
    let victim = root_file(private.path());
    let link = sticky.path().join("x.json");
    user.run(
        "ln",
        &["-s", victim.to_str().unwrap(), link.to_str().unwrap()],
    );
    // A dangling one to a file root does not have yet, and a directory.
    let new_target = private.path().join("cron-job");
    let dangling = sticky.path().join("d.json");
    user.run(
        "ln",
        &[
            "-s",
            new_target.to_str().unwrap(),
            dangling.to_str().unwrap(),
        ],
    );
    let dir_link = sticky.path().join("dir");
    user.run(
        "ln",
        &[
            "-s",
            private.path().to_str().unwrap(),
            dir_link.to_str().unwrap(),
        ],
    );
    let l = link.to_str().unwrap();
    let d = dangling.to_str().unwrap();
    let through_dir = dir_link.join("victim");
    let t = through_dir.to_str().unwrap();
    let dl = dir_link.to_str().unwrap();
    for args in [
        &["slab", "-o", l][..],
        &["slab", "--format", "json", "-o", d],
        &["slab", "-o", t],
        &["record", "-d", "1", "--json", l],
        &["top", "-b", "--iterations", "1", "-i", "0.2", "-o", l],
        &["leaks", "-d", "1", "--snapshot-dir", dl],
        &["man", "--dir", dl],
        &["malloc", "-o", l, "--", "true"],
    ] {
        let err = refused_in_one_line(args);
        assert!(err.contains("refusing to follow"), "{args:?}: {err}");
        assert!(err.contains(&user.name), "{args:?}: {err}");
        assert_untouched(&victim);
        assert!(!new_target.exists(), "{args:?} created {new_target:?}");
        // Nothing new in root's directory (no man page, no snapshot).
        assert_eq!(std::fs::read_dir(private.path()).unwrap().count(), 1);
    }
    // The links are the user's still, and nothing else was left.
    for l in [&link, &dangling, &dir_link] {
        let m = std::fs::symlink_metadata(l).unwrap();
        assert!(m.file_type().is_symlink() && m.uid() == user.uid);
    }
    assert_eq!(std::fs::read_dir(sticky.path()).unwrap().count(), 3);
}

#[test]
fn root_links_are_followed_and_modes_are_kept() {
    require_root();
    // The rule is not "never follow": root's own link in the sticky
    // directory leads to its file, which is replaced keeping its mode.
    let sticky = sticky_dir();
    let private = tempfile::tempdir().unwrap();
    let target = root_file(private.path());
    let link = sticky.path().join("mine.json");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    assert_ok(&kheap(&[
        "slab",
        "--format",
        "json",
        "-o",
        link.to_str().unwrap(),
    ]));
    let text = std::fs::read_to_string(&target).unwrap();
    assert!(text.contains("\"kind\""), "{text}");
    assert_eq!(std::fs::metadata(&target).unwrap().mode() & 0o7777, 0o600);
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    // A new report is 0600, less the umask: slab data is root's.
    for (umask, mode) in [("022", 0o600), ("077", 0o600), ("277", 0o400)] {
        let new = sticky.path().join(format!("new-{umask}.json"));
        let out = Command::new("sh")
            .args([
                "-c",
                &format!("umask {umask}; exec {KHEAP} slab -o {}", new.display()),
            ])
            .output()
            .unwrap();
        assert_ok(&out);
        assert_eq!(
            std::fs::metadata(&new).unwrap().mode() & 0o7777,
            mode,
            "umask {umask}"
        );
    }
    // A loop of links is refused, not replaced.
    let looped = sticky.path().join("loop.json");
    std::os::unix::fs::symlink("loop.json", &looped).unwrap();
    let err = refused_in_one_line(&["slab", "-o", looped.to_str().unwrap()]);
    assert!(err.contains("loop of symbolic links"), "{err}");
    assert!(std::fs::symlink_metadata(&looped)
        .unwrap()
        .file_type()
        .is_symlink());
}

/// Issue 47: the user's own directory (not sticky, so the kernel's
/// protected_symlinks says nothing) with a link to root's file, a FIFO with
/// no reader, and a 0666 file of theirs: root's report goes through none
/// of them, and nothing blocks.
#[test]
fn another_users_directory_links_and_fifos_are_refused() {
    require_root();
    let user = TestUser::create("b");
    let base = tempfile::Builder::new()
        .prefix("kheap-users-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let theirs = base.path().join("s");
    // The user's own directory (in a root directory the test owns).
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(user.uid), Some(user.gid)).unwrap();
    let private = tempfile::tempdir().unwrap();
    let victim = root_file(private.path());
    let link = theirs.join("report.json");
    user.run(
        "ln",
        &["-s", victim.to_str().unwrap(), link.to_str().unwrap()],
    );
    let fifo = theirs.join("x.json");
    user.run("mkfifo", &[fifo.to_str().unwrap()]);
    let l = link.to_str().unwrap();
    let f = fifo.to_str().unwrap();
    for args in [
        &["slab", "-o", l][..],
        &["slab", "--format", "json", "-o", l],
    ] {
        let err = refused_in_one_line(args);
        assert!(err.contains("refusing to follow"), "{args:?}: {err}");
        assert!(err.contains(&user.name), "{args:?}: {err}");
        assert_untouched(&victim);
    }
    // A FIFO: refused at once (it had kheap write root's slabinfo to the
    // user, or block forever with no reader).
    for args in [
        &["slab", "--format", "json", "-o", f][..],
        &["top", "-b", "-n", "1", "-o", f],
        &["serve", "--config", f],
        &["serve", "--web-config", f],
        &["malloc", "--lib", f, "--", "true"],
    ] {
        let err = refused_in_one_line(args);
        assert!(
            err.contains("is a named pipe") || err.contains("not a regular file"),
            "{args:?}: {err}"
        );
    }
    assert_untouched(&victim);
    // A 0666 file the user left is replaced by a root file with root's
    // mode, not left world-writable with root's report in it.
    let open_file = theirs.join("open.json");
    user.run("touch", &[open_file.to_str().unwrap()]);
    user.run("chmod", &["666", open_file.to_str().unwrap()]);
    assert_ok(&kheap(&["slab", "-o", open_file.to_str().unwrap()]));
    let m = std::fs::metadata(&open_file).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o600));
    // The user's files are still theirs.
    for p in [&link, &fifo] {
        assert_eq!(std::fs::symlink_metadata(p).unwrap().uid(), user.uid);
    }
}

/// The preload directories of kheap `pid` in any place kheap may put them.
fn preload_dirs(pid: u32, tmpdir: &Path) -> Vec<PathBuf> {
    [
        tmpdir,
        Path::new("/dev/shm"),
        Path::new("/run"),
        Path::new("/var/tmp"),
    ]
    .iter()
    .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
    .filter(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        name == format!("kheap-preload-{pid}") || name.starts_with(&format!("kheap-preload-{pid}-"))
    })
    .map(|e| e.path())
    .collect()
}

#[test]
fn the_preload_directory_goes_when_kheap_is_killed() {
    require_root();
    let tmpdir = tempfile::tempdir().unwrap();
    let mut kh = Command::new(KHEAP)
        .args(["malloc", "--", "sleep", "kheap-preload-test-30"])
        .env("TMPDIR", tmpdir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = kh.id();
    // `sleep` refuses its odd argument at once; what matters is that the
    // directory was made: wait (bounded) until it is there.
    let mut seen = Vec::new();
    poll_every(HANG_LIMIT, Duration::from_millis(5), || {
        seen = preload_dirs(pid, tmpdir.path());
        !seen.is_empty() || kh.try_wait().unwrap().is_some()
    });
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    kh.wait().unwrap();
    assert!(!seen.is_empty(), "no preload directory appeared");
    poll_until(Duration::from_secs(10), || {
        preload_dirs(pid, tmpdir.path()).is_empty()
    });
    assert_eq!(preload_dirs(pid, tmpdir.path()), Vec::<PathBuf>::new());
}

#[test]
fn unused_signals_do_not_cost_the_report() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.json");
    let mut bg = Background::spawn(
        KHEAP,
        &["record", "--format", "json", "-o", path.to_str().unwrap()],
    );
    bg.wait_for("tracing");
    for sig in [libc::SIGUSR2, libc::SIGPWR, libc::SIGRTMIN() + 3] {
        bg.signal(sig);
    }
    // Once none of them is pending any more (each was delivered, or
    // discarded as ignored), kheap must still be running: SIGALRM (a
    // "stop" signal) then ends it with the report.
    let status = format!("/proc/{}/status", bg.child.id());
    let pending = |line: &str| {
        line.split_once(':').is_some_and(|(k, v)| {
            (k == "SigPnd" || k == "ShdPnd") && v.trim() != "0000000000000000"
        })
    };
    assert!(
        poll_until(HANG_LIMIT, || !std::fs::read_to_string(&status)
            .is_ok_and(|s| s.lines().any(pending))),
        "signals still pending"
    );
    assert!(
        bg.child.try_wait().unwrap().is_none(),
        "killed by {:?}",
        bg.seen
    );
    bg.signal(libc::SIGALRM);
    assert!(bg.wait(), "{:?}", bg.seen);
    let text = std::fs::read_to_string(&path).unwrap();
    parse_valid(&text);
}
