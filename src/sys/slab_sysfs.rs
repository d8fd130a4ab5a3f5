//! SLUB's per-cache directory `/sys/kernel/slab/<cache>/`, which knows what
//! `/proc/slabinfo` does not: the size callers asked for (`object_size`, as
//! opposed to the padded `slab_size`), partial slabs, and which caches were
//! merged into one.
//!
//! Merging: when a new cache is compatible with an existing one, SLUB reuses
//! the existing `kmem_cache`. sysfs then holds one real directory named by a
//! unique id such as `:A-0000192` (flags, then the padded size) and a symlink
//! per merged name pointing at it. `/proc/slabinfo` lists the shared cache
//! once, under the name of whichever cache created it.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

pub const SYS_KERNEL_SLAB: &str = "/sys/kernel/slab";

/// What sysfs says about one cache. Fields are `None` when the file is
/// missing (older kernels, or a cache that vanished while being read).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SysfsCache {
    /// The real directory: the cache's own name, or a `:flags-size` id when
    /// the cache is mergeable.
    pub dir: String,
    pub object_size: Option<u64>,
    pub slab_size: Option<u64>,
    pub order: Option<u64>,
    pub objs_per_slab: Option<u64>,
    /// Slabs on the per-node partial lists (neither empty nor full).
    pub partial_slabs: Option<u64>,
    /// Objects in use within those partial slabs.
    pub objects_partial: Option<u64>,
    /// Every other name that resolves to the same directory.
    pub aliases: Vec<String>,
}

/// The sysfs tree, plus its symlinks resolved once up front. The default
/// knows no cache (no sysfs: not SLUB).
#[derive(Clone, Debug, Default)]
pub struct SlabSysfs {
    root: PathBuf,
    /// Canonical directory → the names (symlinks) pointing at it.
    links_to: BTreeMap<String, Vec<String>>,
    /// Name (symlink) → canonical directory.
    link_target: BTreeMap<String, String>,
}

/// The sysfs tree, opened again only when its list of names changed: a
/// merge or a new cache adds a name, and listing the directory costs one
/// read, where opening it reads every symlink (kheap serve looked at the
/// merges at every read of the maps: a tenth of its idle time in a guest).
#[derive(Debug, Default)]
pub struct WatchedSlabSysfs {
    names: Vec<std::ffi::OsString>,
    fs: Option<SlabSysfs>,
}

impl WatchedSlabSysfs {
    /// The tree as it is now; `None` without SLUB's sysfs or when it
    /// cannot be read.
    pub fn current(&mut self, root: &Path) -> Option<&SlabSysfs> {
        let Ok(entries) = std::fs::read_dir(root) else {
            self.fs = None;
            return None;
        };
        let mut names: Vec<_> = entries
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        names.sort_unstable();
        if self.fs.is_none() || names != self.names {
            self.fs = SlabSysfs::open(root).ok().flatten();
            self.names = names;
        }
        self.fs.as_ref()
    }
}

impl SlabSysfs {
    /// `Ok(None)` when `root` does not exist: the allocator is not SLUB (or
    /// sysfs is not mounted), and callers fall back to `/proc/slabinfo` alone.
    pub fn open(root: &Path) -> Result<Option<SlabSysfs>> {
        let entries = match std::fs::read_dir(root) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("listing {}", root.display())),
        };
        let mut links_to: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut link_target = BTreeMap::new();
        for entry in entries {
            let entry = entry.with_context(|| format!("listing {}", root.display()))?;
            if !entry.file_type().is_ok_and(|t| t.is_symlink()) {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            // A link that vanished since the listing is simply skipped.
            let Ok(target) = std::fs::read_link(entry.path()) else {
                continue;
            };
            let Some(target) = target.file_name() else {
                continue;
            };
            let target = target.to_string_lossy().into_owned();
            links_to
                .entry(target.clone())
                .or_default()
                .push(name.clone());
            link_target.insert(name, target);
        }
        for names in links_to.values_mut() {
            names.sort();
        }
        Ok(Some(SlabSysfs {
            root: root.to_path_buf(),
            links_to,
            link_target,
        }))
    }

    /// The real directory behind `name`.
    pub fn canonical<'a>(&'a self, name: &'a str) -> &'a str {
        self.link_target.get(name).map_or(name, String::as_str)
    }

    /// Names merged with `name`, not counting `name` itself.
    pub fn aliases_of(&self, name: &str) -> Vec<String> {
        let dir = self.canonical(name);
        self.links_to
            .get(dir)
            .into_iter()
            .flatten()
            .filter(|n| *n != name && *n != dir)
            .cloned()
            .collect()
    }

    /// Reads the cache's attributes; `None` when it has no directory (it
    /// vanished since `/proc/slabinfo` was read, or it was never exported).
    pub fn read(&self, name: &str) -> Option<SysfsCache> {
        let dir = self.canonical(name).to_string();
        let path = self.root.join(&dir);
        if !path.is_dir() {
            return None;
        }
        let field = |file: &str| read_first_number(&path.join(file));
        Some(SysfsCache {
            object_size: field("object_size"),
            slab_size: field("slab_size"),
            order: field("order"),
            objs_per_slab: field("objs_per_slab"),
            partial_slabs: field("partial"),
            objects_partial: field("objects_partial"),
            aliases: self.aliases_of(name),
            dir,
        })
    }
}

/// sysfs counters read like `282 N0=282` (a total, then per NUMA node);
/// only the total is wanted.
fn read_first_number(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn write_cache(root: &Path, dir: &str, files: &[(&str, &str)]) {
        let d = root.join(dir);
        std::fs::create_dir(&d).unwrap();
        for (f, v) in files {
            std::fs::write(d.join(f), format!("{v}\n")).unwrap();
        }
    }

    #[test]
    fn missing_root_means_not_slub() {
        assert!(SlabSysfs::open(Path::new("/nonexistent/slab"))
            .unwrap()
            .is_none());
    }

    #[test]
    fn merged_caches_resolve_to_their_unique_id_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        write_cache(
            root,
            ":A-0000192",
            &[
                ("object_size", "184"),
                ("slab_size", "192"),
                ("order", "0"),
                ("objs_per_slab", "21"),
                ("partial", "3 N0=3"),
                ("objects_partial", "40 N0=40"),
            ],
        );
        write_cache(root, "kmalloc-4k", &[("object_size", "4096")]);
        symlink(":A-0000192", root.join("cred")).unwrap();
        symlink(":A-0000192", root.join("pid")).unwrap();

        let fs = SlabSysfs::open(root).unwrap().unwrap();
        let cred = fs.read("cred").unwrap();
        assert_eq!(cred.dir, ":A-0000192");
        assert_eq!(cred.object_size, Some(184));
        assert_eq!(cred.slab_size, Some(192));
        assert_eq!(cred.partial_slabs, Some(3));
        assert_eq!(cred.objects_partial, Some(40));
        assert_eq!(cred.aliases, vec!["pid".to_string()]);

        let k4 = fs.read("kmalloc-4k").unwrap();
        assert_eq!(k4.dir, "kmalloc-4k");
        assert!(k4.aliases.is_empty());
        assert_eq!(k4.partial_slabs, None, "missing files read as None");

        assert!(fs.read("vanished").is_none());
    }

    /// The symlinks captured from this 6.18 machine: every link points at a
    /// `:`-prefixed unique id, and `lsm_inode_cache` (a slabinfo name) has
    /// two merged aliases.
    #[test]
    fn captured_6_18_links_all_target_unique_ids() {
        let links = include_str!("../../tests/fixtures/sysfs-slab-links-6.18.txt");
        let tmp = tempfile::tempdir().unwrap();
        for line in links.lines() {
            let (name, target) = line.split_once(" -> ").unwrap();
            assert!(target.starts_with(':'), "{line}");
            let dir = tmp.path().join(target);
            if !dir.exists() {
                std::fs::create_dir(&dir).unwrap();
            }
            symlink(target, tmp.path().join(name)).unwrap();
        }
        let fs = SlabSysfs::open(tmp.path()).unwrap().unwrap();
        assert_eq!(fs.canonical("lsm_inode_cache"), ":0000032");
        assert_eq!(
            fs.aliases_of("lsm_inode_cache"),
            vec!["btrfs_delayed_extent_op", "ext4_io_end_vec"]
        );
    }

    /// Opened again when a name comes or goes, and only then: a link moved
    /// under the same names is not looked at (SLUB does not move one).
    #[test]
    fn the_watched_tree_is_read_again_only_when_its_names_change() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        write_cache(root, ":A-0000192", &[]);
        write_cache(root, ":0000064", &[]);
        symlink(":A-0000192", root.join("cred")).unwrap();
        symlink(":A-0000192", root.join("pid")).unwrap();
        let mut watched = WatchedSlabSysfs::default();
        assert_eq!(watched.current(root).unwrap().aliases_of("cred"), ["pid"]);

        std::fs::remove_file(root.join("pid")).unwrap();
        symlink(":0000064", root.join("pid")).unwrap();
        assert_eq!(watched.current(root).unwrap().aliases_of("cred"), ["pid"]);

        symlink(":A-0000192", root.join("UNIX")).unwrap();
        assert_eq!(watched.current(root).unwrap().aliases_of("cred"), ["UNIX"]);

        std::fs::remove_dir_all(root).unwrap();
        assert!(watched.current(root).is_none());
    }
}
