//! One static read of the slab state: `/proc/slabinfo` rows completed with
//! sysfs attributes where SLUB provides them, and the derived memory and
//! loss figures.

use std::path::Path;

use anyhow::Result;

use crate::model::slab_loss::{partial_bytes, slab_bytes, slab_loss};
use crate::sys::slab_sysfs::SlabSysfs;
use crate::sys::slabinfo::{read_slabinfo, SlabinfoRow};

/// One cache, statically.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaticCache {
    pub name: String,
    /// The sysfs directory, a `:flags-size` id when the cache is mergeable.
    pub sysfs_dir: Option<String>,
    /// Other cache names merged into this one.
    pub aliases: Vec<String>,
    /// Unpadded object size (sysfs `object_size`); the padded size when
    /// sysfs is unavailable.
    pub object_size: u64,
    /// Object size including alignment and metadata (slabinfo `<objsize>`).
    pub padded_size: u64,
    pub objs_per_slab: u64,
    pub pages_per_slab: u64,
    pub active_objs: u64,
    pub num_objs: u64,
    pub num_slabs: u64,
    /// Memory held by the cache's slabs.
    pub memory_bytes: u64,
    /// Memory in partially used slabs (SLUB sysfs only).
    pub partial_bytes: Option<u64>,
    /// See [`slab_loss`].
    pub loss_bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StaticSnapshot {
    pub caches: Vec<StaticCache>,
    /// Whether `/sys/kernel/slab` was there (SLUB).
    pub sysfs: bool,
    pub page_size: u64,
    /// Caveats about the data, shown under the report.
    pub notes: Vec<String>,
}

impl StaticSnapshot {
    pub fn get(&self, name: &str) -> Option<&StaticCache> {
        self.caches.iter().find(|c| c.name == name)
    }

    /// The row for `name`, also when `name` is a merged alias of it, or
    /// names the others merged into it (`merged_cache_name`).
    pub fn find(&self, name: &str) -> Option<&StaticCache> {
        let name = crate::model::unmerged_cache_name(name);
        self.get(name).or_else(|| {
            self.caches
                .iter()
                .find(|c| c.aliases.iter().any(|a| a == name))
        })
    }

    pub fn total_memory(&self) -> u64 {
        self.caches.iter().map(|c| c.memory_bytes).sum()
    }
}

/// Reads both sources. Only `/proc/slabinfo` is required.
pub fn read_static(slabinfo: &Path, sysfs_root: &Path) -> Result<StaticSnapshot> {
    let rows = read_slabinfo(slabinfo)?;
    // sysfs trouble other than absence (say, EACCES in a container) should
    // not cost the whole report: treat it like absence and say so.
    let (sysfs, sysfs_error) = match SlabSysfs::open(sysfs_root) {
        Ok(s) => (s, None),
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    let mut snap = build_static(rows, sysfs.as_ref(), crate::sys::page_size());
    if let Some(e) = sysfs_error {
        snap.notes
            .push(format!("could not read {}: {e}", sysfs_root.display()));
    }
    Ok(snap)
}

/// Joins parsed rows with sysfs (if any) and computes the derived figures.
pub fn build_static(
    rows: Vec<SlabinfoRow>,
    sysfs: Option<&SlabSysfs>,
    page_size: u64,
) -> StaticSnapshot {
    let mut notes = Vec::new();
    if sysfs.is_none() {
        notes.push(
            "no /sys/kernel/slab (allocator is not SLUB, or sysfs is not mounted): \
             working from /proc/slabinfo alone, so object sizes include padding, loss \
             excludes it, and partial slabs and merged aliases are unknown"
                .to_string(),
        );
    }
    if rows.iter().any(|r| r.tunables != [0, 0, 0]) {
        notes.push(
            "slabinfo has tunables set: this is the SLAB allocator, whose per-CPU \
             arrays hold objects that count as active"
                .to_string(),
        );
    }
    let caches = rows
        .into_iter()
        .map(|row| {
            let sys = sysfs.and_then(|s| s.read(&row.name));
            let object_size = sys
                .as_ref()
                .and_then(|s| s.object_size)
                .unwrap_or(row.objsize);
            let memory_bytes = slab_bytes(row.num_slabs, row.pages_per_slab, page_size);
            StaticCache {
                sysfs_dir: sys.as_ref().map(|s| s.dir.clone()),
                aliases: sys.as_ref().map(|s| s.aliases.clone()).unwrap_or_default(),
                object_size,
                padded_size: row.objsize,
                objs_per_slab: row.objs_per_slab,
                pages_per_slab: row.pages_per_slab,
                active_objs: row.active_objs,
                num_objs: row.num_objs,
                num_slabs: row.num_slabs,
                memory_bytes,
                partial_bytes: sys
                    .as_ref()
                    .and_then(|s| s.partial_slabs)
                    .map(|p| partial_bytes(p, row.pages_per_slab, page_size)),
                loss_bytes: slab_loss(memory_bytes, row.active_objs, object_size),
                name: row.name,
            }
        })
        .collect();
    StaticSnapshot {
        caches,
        sysfs: sysfs.is_some(),
        page_size,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::slabinfo::parse_slabinfo;

    const FIXTURE: &str = include_str!("../../tests/fixtures/slabinfo-6.18.txt");

    #[test]
    fn slabinfo_alone_works_and_says_so() {
        let snap = build_static(parse_slabinfo(FIXTURE).unwrap(), None, 4096);
        assert!(!snap.sysfs);
        assert!(snap.notes[0].contains("not SLUB"));
        let k4 = snap.get("kmalloc-4k").unwrap();
        assert_eq!(k4.memory_bytes, k4.num_slabs * 8 * 4096);
        assert_eq!(
            k4.loss_bytes,
            k4.memory_bytes - k4.active_objs * 4096,
            "loss = slab memory - objects * object size"
        );
        assert_eq!(k4.partial_bytes, None);
        assert!(snap.total_memory() > 0);
    }

    #[test]
    fn sysfs_supplies_unpadded_size_partials_and_aliases() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(":A-0000192");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("object_size"), "184\n").unwrap();
        std::fs::write(dir.join("partial"), "2 N0=2\n").unwrap();
        std::os::unix::fs::symlink(":A-0000192", tmp.path().join("cred")).unwrap();
        std::os::unix::fs::symlink(":A-0000192", tmp.path().join("pid")).unwrap();
        let text = "slabinfo - version: 2.1\n\
            cred  200  210  192  21  1 : tunables 0 0 0 : slabdata 10 10 0\n";
        let sys = SlabSysfs::open(tmp.path()).unwrap().unwrap();
        let snap = build_static(parse_slabinfo(text).unwrap(), Some(&sys), 4096);
        let cred = snap.get("cred").unwrap();
        assert_eq!((cred.object_size, cred.padded_size), (184, 192));
        assert_eq!(cred.loss_bytes, 40960 - 200 * 184);
        assert_eq!(cred.partial_bytes, Some(8192));
        assert_eq!(cred.aliases, vec!["pid"]);
        assert_eq!(snap.find("pid").unwrap().name, "cred");
        assert!(snap.notes.is_empty());
    }
}
