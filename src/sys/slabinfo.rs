//! Parser for `/proc/slabinfo` version 2.1, the only version SLUB (and the
//! SLAB allocator before it) has printed since Linux 2.6.
//!
//! A line looks like
//! `kmalloc-4k  282  360  4096  8  8 : tunables 0 0 0 : slabdata 45 45 0`.
//! The name is printed with `%-17s`, so it is whitespace-padded and, in
//! principle, could itself contain spaces: the numbers are therefore taken
//! from the right of the `: tunables` marker, never by splitting the name.

use std::io::ErrorKind;
use std::path::Path;

use anyhow::{bail, Context, Result};

pub const PROC_SLABINFO: &str = "/proc/slabinfo";

/// One cache as `/proc/slabinfo` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlabinfoRow {
    pub name: String,
    /// Objects in use (SLUB counts every object of a per-CPU slab as active).
    pub active_objs: u64,
    /// Objects the cache's slabs can hold.
    pub num_objs: u64,
    /// The kernel's `s->size`: object plus alignment and debug metadata.
    /// sysfs `object_size` is the size callers asked for at cache creation.
    pub objsize: u64,
    pub objs_per_slab: u64,
    pub pages_per_slab: u64,
    /// Non-zero only under the old SLAB allocator (removed in 6.8).
    pub tunables: [u64; 3],
    pub active_slabs: u64,
    pub num_slabs: u64,
}

/// Reads and parses `path`, turning the usual failures into one-line
/// messages that say what to do.
pub fn read_slabinfo(path: &Path) -> Result<Vec<SlabinfoRow>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::PermissionDenied => bail!(
            "{} is readable only by root: run as root (sudo kheap slab)",
            path.display()
        ),
        Err(e) if e.kind() == ErrorKind::NotFound && path == Path::new(PROC_SLABINFO) => bail!(
            "{PROC_SLABINFO} does not exist: this kernel was built without \
             slabinfo support (CONFIG_SLUB_DEBUG), so per-cache numbers are unavailable"
        ),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            bail!("{} does not exist", path.display())
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    parse_slabinfo(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Parses the whole text: the version line, the `# name ...` header, then one
/// line per cache. A file with headers and no caches yields an empty list.
pub fn parse_slabinfo(text: &str) -> Result<Vec<SlabinfoRow>> {
    let mut lines = text.lines().enumerate();
    let Some((_, first)) = lines.next() else {
        bail!("empty slabinfo (expected a \"slabinfo - version: 2.1\" line)");
    };
    let version = first
        .strip_prefix("slabinfo - version:")
        .map(str::trim)
        .with_context(|| format!("not a slabinfo file: first line is {first:?}"))?;
    if version != "2.1" {
        bail!("unsupported slabinfo version {version} (kheap understands 2.1)");
    }
    let mut rows = Vec::new();
    for (i, line) in lines {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        rows.push(parse_line(line).with_context(|| format!("line {}: {line:?}", i + 1))?);
    }
    Ok(rows)
}

fn parse_line(line: &str) -> Result<SlabinfoRow> {
    let (head, rest) = line
        .split_once(" : tunables")
        .context("no \": tunables\" section")?;
    let (tunables, rest) = rest
        .split_once(" : slabdata")
        .context("no \": slabdata\" section")?;
    // SLAB with statistics appended ": globalstat ..." and ": cpustat ...";
    // those are ignored.
    let slabdata = rest.split(" : ").next().unwrap_or_default();

    // The five numbers are the last five words of `head`; the name is what
    // comes before them, trimmed of its padding.
    let mut numbers = [0u64; 5];
    let mut name_end = head.trim_end().len();
    for slot in numbers.iter_mut().rev() {
        let trimmed = head[..name_end].trim_end();
        let start = trimmed
            .rfind(char::is_whitespace)
            .context("fewer than five numbers before \": tunables\"")?
            + 1;
        *slot = parse_number(&trimmed[start..])?;
        name_end = start;
    }
    let name = head[..name_end].trim();
    if name.is_empty() {
        bail!("cache name is missing");
    }
    let [active_objs, num_objs, objsize, objs_per_slab, pages_per_slab] = numbers;
    let tunables = three_numbers(tunables, "tunables")?;
    let [active_slabs, num_slabs, _shared_avail] = three_numbers(slabdata, "slabdata")?;
    Ok(SlabinfoRow {
        name: name.to_string(),
        active_objs,
        num_objs,
        objsize,
        objs_per_slab,
        pages_per_slab,
        tunables,
        active_slabs,
        num_slabs,
    })
}

fn three_numbers(section: &str, what: &str) -> Result<[u64; 3]> {
    let words: Vec<&str> = section.split_whitespace().collect();
    if words.len() != 3 {
        bail!("expected 3 numbers after \"{what}\", found {}", words.len());
    }
    Ok([
        parse_number(words[0])?,
        parse_number(words[1])?,
        parse_number(words[2])?,
    ])
}

fn parse_number(word: &str) -> Result<u64> {
    word.parse()
        .with_context(|| format!("{word:?} is not a number"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = include_str!("../../tests/fixtures/slabinfo-6.18.txt");
    const HEADER: &str = "slabinfo - version: 2.1\n\
        # name            <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab> : tunables <limit> <batchcount> <sharedfactor> : slabdata <active_slabs> <num_slabs> <sharedavail>\n";

    #[test]
    fn parses_the_captured_6_18_file() {
        let rows = parse_slabinfo(FIXTURE).unwrap();
        assert_eq!(rows.len(), FIXTURE.lines().count() - 2);
        let k4 = rows.iter().find(|r| r.name == "kmalloc-4k").unwrap();
        assert_eq!(
            (k4.objsize, k4.objs_per_slab, k4.pages_per_slab),
            (4096, 8, 8)
        );
        assert!(k4.active_objs <= k4.num_objs);
        assert_eq!(k4.num_objs, k4.num_slabs * k4.objs_per_slab);
        // Both plain and memcg-accounted kmalloc caches are listed, which is
        // what joining traced CacheId::name()s to rows relies on.
        for name in [
            "kmalloc-96",
            "kmalloc-cg-4k",
            "kmalloc-8k",
            "dma-kmalloc-8k",
        ] {
            assert!(rows.iter().any(|r| r.name == name), "{name} missing");
        }
        // SLUB has no tunables.
        assert!(rows.iter().all(|r| r.tunables == [0, 0, 0]));
    }

    #[test]
    fn header_only_file_has_no_caches() {
        assert_eq!(parse_slabinfo(HEADER).unwrap(), vec![]);
    }

    #[test]
    fn names_with_spaces_and_odd_characters_survive() {
        let text = format!(
            "{HEADER}\
             my cache (v2):x     3      4    512    8    1 : tunables    0    0    0 : slabdata      1      1      0\n\
             a-very-long-cache-name-without-padding 10 20 64 64 1 : tunables 0 0 0 : slabdata 1 1 0\n\
             :A-0000192             1      2    192   21    1 : tunables    0    0    0 : slabdata      1      1      0\n"
        );
        let rows = parse_slabinfo(&text).unwrap();
        assert_eq!(rows[0].name, "my cache (v2):x");
        assert_eq!(
            (rows[0].active_objs, rows[0].num_objs, rows[0].objsize),
            (3, 4, 512)
        );
        assert_eq!(rows[1].name, "a-very-long-cache-name-without-padding");
        assert_eq!(rows[2].name, ":A-0000192");
    }

    #[test]
    fn slab_statistics_sections_are_ignored() {
        let text = format!(
            "{HEADER}foo 1 2 64 64 1 : tunables 120 60 8 : slabdata 1 1 0 : globalstat 5 5 1 0 0 0 0 0 0 : cpustat 1 2 3 4\n"
        );
        let rows = parse_slabinfo(&text).unwrap();
        assert_eq!(rows[0].tunables, [120, 60, 8]);
        assert_eq!((rows[0].active_slabs, rows[0].num_slabs), (1, 1));
    }

    #[test]
    fn wrong_version_and_garbage_are_clear_errors() {
        let err = parse_slabinfo("slabinfo - version: 1.1\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unsupported slabinfo version 1.1 (kheap understands 2.1)"
        );
        assert!(parse_slabinfo("")
            .unwrap_err()
            .to_string()
            .contains("empty"));
        assert!(parse_slabinfo("MemTotal: 1 kB\n")
            .unwrap_err()
            .to_string()
            .contains("not a slabinfo file"));
        let bad = format!("{HEADER}foo 1 x 64 64 1 : tunables 0 0 0 : slabdata 1 1 0\n");
        let err = format!("{:#}", parse_slabinfo(&bad).unwrap_err());
        assert!(
            err.contains("line 3") && err.contains("\"x\" is not a number"),
            "{err}"
        );
    }

    #[test]
    fn unreadable_file_says_what_to_do() {
        let err = read_slabinfo(Path::new("/nonexistent/slabinfo")).unwrap_err();
        assert!(err.to_string().contains("does not exist"));
        assert!(!err.to_string().contains('\n'));
    }
}
