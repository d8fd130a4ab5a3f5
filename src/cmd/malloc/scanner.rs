//! Keeping up with the processes `kheap malloc` traces while it runs:
//! their names, cgroups and mappings (for symbolization), the allocator
//! libraries they load later (probed then), and the ones that run without
//! the preload library (said once).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::allocators::libraries::other_allocators;
use crate::kernel::malloc::MallocSession;
use crate::malloc::preload;
use crate::symbolize::user::{host_path, Modules};
use crate::sys::procmaps;

/// Keeps up with the traced processes: learns their mappings (paths for
/// symbolization) and probes any new C library one of them maps.
#[derive(Default)]
pub struct Scanner {
    /// When each process was last read, and its exec count then.
    seen: HashMap<u32, (Instant, u32)>,
    /// Each process's command name when last read (after an exec, the new
    /// program's).
    pub comms: HashMap<u32, String>,
    /// The command kheap started: its name is read once it has exec'd.
    pub held: Option<u32>,
    /// Each process's cgroup v2 when last read.
    pub cgroups: HashMap<u32, crate::cgroup::CgroupRef>,
    cgroup_mount: Option<PathBuf>,
    /// Files whose symbols were read for allocator functions.
    inspected: HashSet<(u32, u64)>,
    /// With the preload library, processes that run without it are named
    /// once (`check_preloadable`). Why a program cannot load it (None: it can), by (device, inode).
    preload_unusable: HashMap<(u64, u64), Option<String>>,
    /// (process, program) pairs already named.
    preload_warned: HashSet<(u32, (u64, u64))>,
}

/// Known processes are re-read this often (for libraries they load later);
/// new ones and those that just exec'd at once.
const RESCAN_EVERY: Duration = Duration::from_secs(2);

impl Scanner {
    /// A scanner that reads each process's cgroup under `cgroup_mount`
    /// (none: no cgroups).
    pub fn new(cgroup_mount: Option<PathBuf>) -> Scanner {
        Scanner {
            cgroup_mount,
            ..Scanner::default()
        }
    }

    pub fn scan(
        &mut self,
        session: &mut MallocSession,
        modules: &mut Modules,
        probe_new_libraries: bool,
        everything: bool,
    ) {
        let execs = session.exec_counts();
        let now = Instant::now();
        for pid in session.traced_pids() {
            let exec = execs.get(&pid).copied().unwrap_or(0);
            let due = match self.seen.get(&pid) {
                Some(&(when, n)) => everything || n != exec || now - when >= RESCAN_EVERY,
                None => true,
            };
            if !due {
                continue;
            }
            self.seen.insert(pid, (now, exec));
            // Name and cgroup first: a short-lived process may be gone by
            // the time its mappings have been read.
            let not_yet_execd = self.held == Some(pid) && exec == 0;
            if let (false, Some(c)) = (not_yet_execd, crate::sys::process_name(pid)) {
                self.comms.insert(pid, c);
            }
            if let Some(c) = self
                .cgroup_mount
                .as_deref()
                .and_then(|m| crate::cgroup::of_pid(pid, m))
            {
                self.cgroups.insert(pid, c);
            }
            let Some(maps) = procmaps::read(pid) else {
                continue;
            };
            modules.add_maps(pid, &maps);
            // Until it execs, the held command is a copy of kheap.
            if not_yet_execd {
                continue;
            }
            if session.preloaded() && !self.check_preloadable(pid, &maps) {
                // Caught between exec and its loader mapping the C library
                // (seen under TCG in the 6.1 guest): looked at again on the
                // next scan, not after RESCAN_EVERY, which a program that
                // runs for a second would never see.
                self.seen.remove(&pid);
            }
            if !probe_new_libraries {
                continue;
            }
            // The C library, the C++ runtime whose operator new the
            // program may call, and allocator libraries (jemalloc…).
            let mut found = other_allocators(pid, &maps, &mut self.inspected);
            found.extend(procmaps::find_libc(&maps).and_then(|m| host_path(pid, m)));
            for path in found {
                if session.has_library(&path) {
                    continue;
                }
                // Late by up to one scan interval: allocations before are missed.
                match session.probe_library(&path) {
                    Ok(false) => {}
                    Ok(true) => eprintln!(
                        "kheap: process {pid} maps another allocator library, now probed too: {}",
                        path.display()
                    ),
                    Err(e) => eprintln!("kheap: warning: cannot probe {}: {e:#}", path.display()),
                }
            }
        }
    }
}

impl Scanner {
    /// Says once when a traced process runs without the preload library,
    /// so that its allocations are not seen: its program cannot load it
    /// (static, set-user-ID, defines malloc itself), or its loader failed
    /// to (it said why on the process's standard error). The second is
    /// known only once the loader has mapped the C library, which it does
    /// after the preloaded libraries.
    /// Whether the process is settled: it maps the library, was named, or
    /// is gone; false while its loader has not mapped the C library yet.
    fn check_preloadable(&mut self, pid: u32, maps: &[procmaps::Mapping]) -> bool {
        use std::os::unix::fs::MetadataExt;
        if preload::maps_it(maps) {
            return true;
        }
        let exe = PathBuf::from(format!("/proc/{pid}/exe"));
        let Ok(meta) = std::fs::metadata(&exe) else {
            return true;
        };
        let program = (meta.dev(), meta.ino());
        if self.preload_warned.contains(&(pid, program)) {
            return true;
        }
        let why = self
            .preload_unusable
            .entry(program)
            .or_insert_with(|| preload::unusable_reason(&exe))
            .clone();
        let name = std::fs::read_link(&exe).unwrap_or(exe);
        let message = match why {
            Some(why) => format!(
                "process {pid} runs {}, which {why} and so does not load kheap's preload library",
                name.display()
            ),
            None if procmaps::find_libc(maps).is_some() => format!(
                "process {pid} ({}) did not load kheap's preload library (its loader said why on its standard error)",
                name.display()
            ),
            None => return false, // not loaded yet: the next scan looks again
        };
        self.preload_warned.insert((pid, program));
        eprintln!(
            "kheap: warning: {message}: its allocations are not seen; use --no-preload to probe the C library instead"
        );
        true
    }
}
