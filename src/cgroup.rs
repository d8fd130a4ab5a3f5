//! cgroup v2: the id of a cgroup directory
//! (its inode number, which is what `bpf_get_current_cgroup_id()` returns),
//! the path of an id (walking the mount, cached so a cgroup removed during a
//! run keeps its last known path), and the container or service a path
//! names. No libbpf: the parsing is unit-tested without root.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

// The root tests (tests/common) reach the mount through this module; it is
// read in `sys` like the other small system reads.
pub use crate::sys::cgroup2_mount;

/// What `kheap doctor` says about cgroups, from a /proc/mounts text.
pub fn doctor_line(mounts: &str) -> String {
    let v1 = mounts
        .lines()
        .any(|l| l.split_whitespace().nth(2) == Some("cgroup"));
    match crate::sys::cgroup2_mount_in(mounts) {
        Some(m) if v1 => format!(
            "cgroup2 mounted at {} (hybrid: v1 controllers too; --cgroup and --by cgroup use cgroup2)",
            m.display()
        ),
        Some(m) => format!("cgroup2 mounted at {}", m.display()),
        None => "no cgroup2 mount: --cgroup is refused and --by cgroup shows ids only".into(),
    }
}

/// A cgroup given on the command line, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupTarget {
    pub id: u64,
    /// Relative to the cgroup2 mount, starting with `/`.
    pub path: String,
}

/// Resolves `--cgroup ARG`: a directory under the cgroup2 mount, absolute,
/// or relative to the mount.
pub fn resolve_target(arg: &str, mount: &Path) -> Result<CgroupTarget> {
    let given = Path::new(arg);
    let full = if given.is_absolute() {
        given.to_path_buf()
    } else {
        mount.join(given)
    };
    let canon = std::fs::canonicalize(&full).map_err(|e| {
        anyhow::anyhow!(
            "--cgroup {arg}: {}: {e} (give a directory under the cgroup2 mount {})",
            full.display(),
            mount.display()
        )
    })?;
    let mount_canon = std::fs::canonicalize(mount).unwrap_or_else(|_| mount.to_path_buf());
    let Ok(rel) = canon.strip_prefix(&mount_canon) else {
        bail!(
            "--cgroup {arg}: {} is not under the cgroup2 mount {} (only cgroup v2 directories can be filtered on)",
            canon.display(),
            mount.display()
        );
    };
    if !canon.join("cgroup.procs").exists() {
        bail!(
            "--cgroup {arg}: {} is not a cgroup directory",
            canon.display()
        );
    }
    let meta = std::fs::metadata(&canon)
        .map_err(|e| anyhow::anyhow!("--cgroup {arg}: {}: {e}", canon.display()))?;
    Ok(CgroupTarget {
        id: meta.ino(),
        path: rel_path(rel),
    })
}

/// The processes in `dir` (a cgroup directory) and in every cgroup below
/// it, as their cgroup.procs files list them now.
pub fn pids_in(dir: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue; // removed meanwhile
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// The cgroup v2 path in a /proc/PID/cgroup text (its `0::` line).
pub fn v2_path_in(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"))
}

/// The cgroup v2 a process is in now, resolved under `mount`; None when it
/// has exited or its cgroup is gone.
pub fn of_pid(pid: u32, mount: &Path) -> Option<CgroupRef> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = v2_path_in(&text)?.trim_end();
    let id = std::fs::metadata(mount.join(path.trim_start_matches('/')))
        .ok()?
        .ino();
    Some(CgroupRef {
        id,
        path: Some(path.to_string()),
        container: container_of(path),
    })
}

fn rel_path(rel: &Path) -> String {
    format!("/{}", rel.to_string_lossy())
}

/// Paths of cgroup ids, learned by walking the cgroup2 mount. An id is kept
/// once seen: a cgroup removed later still has its last known path.
#[derive(Debug, Default)]
pub struct CgroupNames {
    mount: Option<PathBuf>,
    paths: HashMap<u64, String>,
    /// Ids a walk did not find (gone before it): not walked for again.
    missing: std::collections::HashSet<u64>,
}

impl CgroupNames {
    pub fn new(mount: Option<PathBuf>) -> Self {
        CgroupNames {
            mount,
            paths: HashMap::new(),
            missing: Default::default(),
        }
    }

    /// Learns a path without walking (a `--cgroup` target, a test).
    pub fn insert(&mut self, id: u64, path: String) {
        self.paths.insert(id, path);
    }

    /// Walks the mount once if any of `ids` is unknown, remembering every
    /// cgroup found (so later lookups of cgroups seen now need no walk). An
    /// id a walk did not find is gone for good: it is not walked for again.
    pub fn learn<I: IntoIterator<Item = u64>>(&mut self, ids: I) {
        let Some(mount) = self.mount.clone() else {
            return;
        };
        let unknown: Vec<u64> = ids
            .into_iter()
            .filter(|id| !self.paths.contains_key(id) && !self.missing.contains(id))
            .collect();
        if unknown.is_empty() {
            return;
        }
        let mut stack = vec![mount.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(meta) = std::fs::metadata(&dir) else {
                continue; // removed while walking
            };
            if let Ok(rel) = dir.strip_prefix(&mount) {
                self.paths.insert(meta.ino(), rel_path(rel));
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
        let found = &self.paths;
        self.missing
            .extend(unknown.into_iter().filter(|id| !found.contains_key(id)));
    }

    /// Forgets every id but `keep` (those the maps still hold), so that a
    /// daemon's memory does not grow with every cgroup that ever existed;
    /// an id seen again later is walked for again.
    pub fn retain(&mut self, keep: &std::collections::HashSet<u64>) {
        self.paths.retain(|id, _| keep.contains(id));
        self.missing.retain(|id| keep.contains(id));
    }

    pub fn path(&self, id: u64) -> Option<&str> {
        self.paths.get(&id).map(String::as_str)
    }

    /// The reported identity of an id (its path if known, and what the
    /// path says it runs).
    pub fn describe(&self, id: u64) -> CgroupRef {
        let path = self.path(id).map(str::to_string);
        let container = path.as_deref().and_then(container_of);
        CgroupRef {
            id,
            path,
            container,
        }
    }
}

/// A cgroup as reports carry it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CgroupRef {
    pub id: u64,
    /// Relative to the cgroup2 mount; null if it could not be found (a
    /// cgroup created and removed between two walks).
    pub path: Option<String>,
    pub container: Option<Container>,
}

impl CgroupRef {
    /// A cgroup known by its id only, until `CgroupNames` names it.
    pub fn unnamed(id: u64) -> CgroupRef {
        CgroupRef {
            id,
            path: None,
            container: None,
        }
    }
}

/// What a cgroup path says runs in it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Container {
    /// docker, containerd, cri-o, podman, kubernetes (a pod-level cgroup or
    /// a container whose runtime the path does not name), systemd-service,
    /// systemd-scope
    pub kind: String,
    /// What to show: a short container id, a pod, or a unit name.
    pub name: String,
    /// The full container id, when there is one.
    pub id: Option<String>,
    pub pod_uid: Option<String>,
    /// Kubernetes QoS class: guaranteed, burstable, besteffort.
    pub qos: Option<String>,
}

fn is_container_id(s: &str) -> bool {
    s.len() >= 12 && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A container id in a systemd scope name: `docker-<id>.scope`,
/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `libpod-<id>.scope`.
fn scoped_container(seg: &str) -> Option<(&'static str, &str)> {
    let stem = seg.strip_suffix(".scope")?;
    for (prefix, kind) in [
        ("docker-", "docker"),
        ("cri-containerd-", "containerd"),
        ("crio-", "cri-o"),
        ("libpod-", "podman"),
    ] {
        if let Some(id) = stem.strip_prefix(prefix) {
            if is_container_id(id) {
                return Some((kind, id));
            }
        }
    }
    None
}

/// A pod segment: systemd driver `kubepods[-<qos>]-pod<uid>.slice` (uid with
/// `_` for `-`), or cgroupfs driver `pod<uid>` (qos from its parent).
fn pod_of(seg: &str, parent: Option<&str>) -> Option<(String, String)> {
    if let Some(stem) = seg.strip_suffix(".slice") {
        let rest = stem.strip_prefix("kubepods-")?;
        let (qos, uid) = match rest.split_once("pod") {
            Some(("", uid)) => ("guaranteed", uid),
            Some((q, uid)) => (q.strip_suffix('-')?, uid),
            None => return None,
        };
        if uid.is_empty() {
            return None;
        }
        return Some((uid.replace('_', "-"), qos.to_string()));
    }
    let uid = seg.strip_prefix("pod")?;
    if uid.len() < 8 || !uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
        return None;
    }
    let qos = parent
        .filter(|q| matches!(*q, "burstable" | "besteffort"))
        .unwrap_or("guaranteed");
    Some((uid.to_string(), qos.to_string()))
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// The container, pod or systemd unit a cgroup path names, if any.
pub fn container_of(path: &str) -> Option<Container> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let mut pod = None;
    let mut ctr: Option<(&str, &str)> = None;
    for (i, &seg) in segs.iter().enumerate() {
        let parent = i.checked_sub(1).map(|p| segs[p]);
        if let Some(p) = pod_of(seg, parent) {
            pod = Some(p);
        } else if let Some(c) = scoped_container(seg) {
            ctr = Some(c);
        } else if is_container_id(seg) && seg.len() >= 32 {
            // cgroupfs drivers: /docker/<id>, /kubepods/<qos>/pod<uid>/<id>
            let kind = if parent == Some("docker") {
                "docker"
            } else {
                "kubernetes"
            };
            ctr = Some((kind, seg));
        }
    }
    let (pod_uid, qos) = match pod {
        Some((u, q)) => (Some(u), Some(q)),
        None => (None, None),
    };
    if let Some((kind, id)) = ctr {
        let name = match &pod_uid {
            Some(uid) => format!("pod {uid} {kind}:{}", short(id)),
            None => format!("{kind}:{}", short(id)),
        };
        return Some(Container {
            kind: kind.to_string(),
            name,
            id: Some(id.to_string()),
            pod_uid,
            qos,
        });
    }
    if let Some(uid) = pod_uid {
        return Some(Container {
            kind: "kubernetes".into(),
            name: format!("pod {uid}"),
            id: None,
            pod_uid: Some(uid),
            qos,
        });
    }
    // The innermost systemd unit: a service, or a scope (sessions, runs).
    segs.iter().rev().find_map(|&seg| {
        let kind = if seg.ends_with(".service") {
            "systemd-service"
        } else if seg.ends_with(".scope") {
            "systemd-scope"
        } else {
            return None;
        };
        Some(Container {
            kind: kind.into(),
            name: seg.to_string(),
            id: None,
            pod_uid: None,
            qos: None,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f1c9b0d3e2a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c";

    #[test]
    fn names_keep_only_the_ids_still_in_use() {
        let mut names = CgroupNames::new(None);
        names.insert(1, "/a".into());
        names.insert(2, "/b".into());
        names.retain(&[2].into_iter().collect());
        assert_eq!(names.path(1), None);
        assert_eq!(names.path(2), Some("/b"));
    }

    #[test]
    fn doctor_says_where_and_whether_hybrid() {
        let hybrid = "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\ncgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n";
        assert!(
            doctor_line(hybrid).starts_with("cgroup2 mounted at /sys/fs/cgroup/unified (hybrid")
        );
        assert_eq!(
            doctor_line("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n"),
            "cgroup2 mounted at /sys/fs/cgroup"
        );
        assert!(doctor_line("proc /proc proc rw 0 0\n").starts_with("no cgroup2 mount"));
    }

    #[test]
    fn kubernetes_systemd_driver() {
        let p = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_5e6f_7a8b_9c0d_1e2f3a4b5c6d.slice/cri-containerd-{ID}.scope"
        );
        let c = container_of(&p).unwrap();
        assert_eq!(c.kind, "containerd");
        assert_eq!(c.id.as_deref(), Some(ID));
        assert_eq!(
            c.pod_uid.as_deref(),
            Some("1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d")
        );
        assert_eq!(c.qos.as_deref(), Some("burstable"));
        assert_eq!(
            c.name,
            "pod 1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d containerd:4f1c9b0d3e2a"
        );

        let g = format!("/kubepods.slice/kubepods-pod0000aaaa_bbbb.slice/crio-{ID}.scope");
        let c = container_of(&g).unwrap();
        assert_eq!(
            (c.kind.as_str(), c.qos.as_deref()),
            ("cri-o", Some("guaranteed"))
        );
        assert_eq!(c.pod_uid.as_deref(), Some("0000aaaa-bbbb"));

        let be =
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12345678_aaaa.slice";
        let c = container_of(be).unwrap();
        assert_eq!((c.kind.as_str(), c.id.as_deref()), ("kubernetes", None));
        assert_eq!(c.qos.as_deref(), Some("besteffort"));
        assert_eq!(c.name, "pod 12345678-aaaa");
    }

    #[test]
    fn kubernetes_cgroupfs_driver() {
        let p = format!("/kubepods/burstable/pod1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d/{ID}");
        let c = container_of(&p).unwrap();
        assert_eq!(c.kind, "kubernetes");
        assert_eq!(c.id.as_deref(), Some(ID));
        assert_eq!(c.qos.as_deref(), Some("burstable"));
        assert_eq!(
            c.pod_uid.as_deref(),
            Some("1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d")
        );
        let g = format!("/kubepods/pod1a2b3c4d-5e6f/{ID}");
        assert_eq!(container_of(&g).unwrap().qos.as_deref(), Some("guaranteed"));
    }

    #[test]
    fn docker_and_podman() {
        let c = container_of(&format!("/system.slice/docker-{ID}.scope")).unwrap();
        assert_eq!(
            (c.kind.as_str(), c.name.as_str()),
            ("docker", "docker:4f1c9b0d3e2a")
        );
        let c = container_of(&format!("/docker/{ID}")).unwrap();
        assert_eq!(c.kind, "docker");
        let c = container_of(&format!(
            "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container"
        ))
        .unwrap();
        assert_eq!(c.kind, "podman");
    }

    #[test]
    fn systemd_units() {
        let c = container_of("/system.slice/nginx.service").unwrap();
        assert_eq!(
            (c.kind.as_str(), c.name.as_str()),
            ("systemd-service", "nginx.service")
        );
        let c = container_of("/user.slice/user-1000.slice/session-3.scope").unwrap();
        assert_eq!(
            (c.kind.as_str(), c.name.as_str()),
            ("systemd-scope", "session-3.scope")
        );
        // The innermost unit wins: a user's service under user@.service.
        let c = container_of(
            "/user.slice/user-1000.slice/user@1000.service/app.slice/pipewire.service",
        )
        .unwrap();
        assert_eq!(c.name, "pipewire.service");
        // A docker scope whose id is not hex is only a scope.
        let c = container_of("/system.slice/docker-compose.scope").unwrap();
        assert_eq!(c.kind, "systemd-scope");
    }

    #[test]
    fn processes_of_a_cgroup_and_cgroup_of_a_process() {
        let hybrid = "12:memory:/system.slice/a.service\n0::/system.slice/a.service\n";
        assert_eq!(v2_path_in(hybrid), Some("/system.slice/a.service"));
        assert_eq!(v2_path_in("3:cpu:/\n"), None);

        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/cgroup.procs"), "30\n10\n").unwrap();
        std::fs::write(dir.path().join("a/b/cgroup.procs"), "20\n10\n").unwrap();
        assert_eq!(pids_in(&dir.path().join("a")), vec![10, 20, 30]);
        assert_eq!(pids_in(&dir.path().join("a/b")), vec![10, 20]);
        assert!(pids_in(&dir.path().join("missing")).is_empty());
    }

    #[test]
    fn plain_paths_name_nothing() {
        assert_eq!(container_of("/"), None);
        assert_eq!(container_of("/user.slice"), None);
        assert_eq!(container_of("/kheap-test-a/nested"), None);
        // "pod" alone or a short hex name is not a pod or a container.
        assert_eq!(container_of("/pod/cafe"), None);
    }

    #[test]
    fn names_survive_removal_and_targets_resolve() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a/b");
        std::fs::create_dir_all(&sub).unwrap();
        let ino = std::fs::metadata(&sub).unwrap().ino();
        let mut names = CgroupNames::new(Some(dir.path().to_path_buf()));
        names.learn([ino]);
        assert_eq!(names.path(ino), Some("/a/b"));
        std::fs::remove_dir(&sub).unwrap();
        names.learn([ino, 999_999_999]);
        assert_eq!(
            names.path(ino),
            Some("/a/b"),
            "a removed cgroup keeps its path"
        );
        assert_eq!(names.describe(999_999_999).path, None);

        // Not a cgroup directory (no cgroup.procs), and outside the mount.
        let err = resolve_target("a", dir.path()).unwrap_err().to_string();
        assert!(err.contains("not a cgroup directory"), "{err}");
        let err = resolve_target("/proc", dir.path()).unwrap_err().to_string();
        assert!(err.contains("not under the cgroup2 mount"), "{err}");
        let err = resolve_target("missing", dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing"), "{err}");
        std::fs::write(dir.path().join("a/cgroup.procs"), "").unwrap();
        let t = resolve_target("a", dir.path()).unwrap();
        assert_eq!(t.path, "/a");
        let abs = dir.path().join("a");
        assert_eq!(
            resolve_target(abs.to_str().unwrap(), dir.path()).unwrap(),
            t
        );
    }
}
