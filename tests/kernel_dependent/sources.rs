//! `--source`: the page allocator, vmalloc and percpu beside the slab,
//! against the real kernel. Each workload (kheap-load) allocates a known
//! amount through a known kernel path; the test finds that path's stacks
//! (every stack captured: --exact-stacks) and asserts their exact counts and
//! bytes. The maps and mappings the workloads create go with their process.

use crate::common;

use std::io::Write;

use common::*;
use serde_json::Value;

const PAGE: u64 = 4096;

/// `kheap record --source all --exact-stacks -- kheap-load LOAD…`.
fn record_all(load: &[&str]) -> Value {
    require_root();
    record_json(&["--source", "all", "--exact-stacks"], load)
}

/// The stacks of `source` that pass through a frame starting with `frame`,
/// summed: (count, bytes_req, bytes_alloc, caches).
fn stacks_through(r: &Value, source: &str, frame: &str) -> (u64, u64, u64, Vec<String>) {
    let mut sum = (0, 0, 0, Vec::new());
    for s in rows(r, "stacks", "source", source) {
        let frames = s["frames"].as_array().unwrap();
        if frames
            .iter()
            .any(|f| f.as_str().is_some_and(|f| f.starts_with(frame)))
        {
            sum.0 += u(&s["count"]);
            sum.1 += u(&s["bytes_req"]);
            sum.2 += u(&s["bytes_alloc"]);
            let cache = s["cache"].as_str().unwrap().to_string();
            if !sum.3.contains(&cache) {
                sum.3.push(cache);
            }
        }
    }
    sum
}

/// Every source appears in the totals, each row says its source, and the
/// run's totals are the sum of the sources' (no page layer is separated
/// yet in these workloads' totals: counted_elsewhere_bytes is subtracted).
fn assert_totals_add_up(r: &Value) {
    let sources: Vec<&str> = r["totals"]["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["source"].as_str().unwrap())
        .collect();
    assert_eq!(
        sources,
        ["kmalloc", "page", "vmalloc", "percpu"],
        "{:#}",
        r["totals"]
    );
    let sum: u64 = r["totals"]["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| u(&t["bytes_alloc"]) - u(&t["counted_elsewhere_bytes"]))
        .sum();
    assert_eq!(sum, u(&r["totals"]["bytes_alloc"]), "{:#}", r["totals"]);
}

/// The frame under which `kheap-load pages` faults its pages in:
/// MADV_POPULATE_WRITE (5.14), or before it mlock.
fn populating_frame() -> &'static str {
    if kernel_before(5, 14) {
        "__mm_populate"
    } else {
        "do_madvise"
    }
}

#[test]
fn page_source_counts_anonymous_pages_faulted_in_by_madvise() {
    const N: u64 = 1000;
    let r = record_all(&["pages", &N.to_string()]);
    assert_totals_add_up(&r);
    // MADV_POPULATE_WRITE faults every page in for writing: N order-0
    // allocations in the fault handler under madvise. Two other kinds of
    // page are allocated on that path and left out: page tables
    // (pte_alloc_one…), and slabs, when a cache the first fault allocates
    // from (anon_vma, anon_vma_chain) has no free object on this CPU and
    // takes a new page (new_slab, allocate_slab: seen on a 128-CPU guest,
    // whose per-CPU slabs start empty). The handler's frames differ by
    // kernel (do_anonymous_page is inlined into handle_pte_fault on 6.1), so
    // the stack is matched by its ends.
    let anon: Vec<&Value> = rows(&r, "stacks", "source", "page")
        .into_iter()
        .filter(|s| {
            let frames = frames(s);
            frames.iter().any(|f| f.starts_with(populating_frame()))
                && frames.iter().any(|f| f.starts_with("handle_mm_fault"))
                && !frames.iter().any(|f| {
                    f.contains("pte_alloc") || f.contains("pmd_alloc") || f.contains("slab")
                })
        })
        .collect();
    let count: u64 = anon.iter().map(|s| u(&s["count"])).sum();
    let bytes: u64 = anon.iter().map(|s| u(&s["bytes_alloc"])).sum();
    assert_eq!((count, bytes), (N, N * PAGE), "{anon:#?}");
    assert!(anon
        .iter()
        .all(|s| s["source"] == "page" && s["cache"] == "pages-order0"));
    // The page source's one site is the whole allocator.
    let site = rows(&r, "sites", "source", "page");
    assert_eq!(site.len(), 1);
    assert_eq!(site[0]["function"], "[page]");
    assert!(u(&site[0]["count"]) >= N);
}

#[test]
fn vmalloc_source_counts_a_large_bpf_array() {
    // 256 values of 4 KiB and the struct bpf_array before them (under a
    // page): PAGE_ALIGN gives 257 pages, and the vmap area adds a guard
    // page: one area of 258 pages (__bpf_map_area_alloc vmallocs anything
    // above 32 KiB).
    let r = record_all(&["bpf-array", "array", "256", "4096"]);
    assert_totals_add_up(&r);
    // Before Linux 6.2 there are no vmalloc tracepoints: the fexit/fentry
    // fallback on the functions they sit in must count the same area, or
    // before 5.17 (no bpf_get_func_ret for fexit) kprobes.
    let how = if !kernel_before(6, 2) {
        "raw_tp"
    } else if kernel_before(5, 17) {
        "kprobe/kretprobe on alloc_vmap_area"
    } else {
        "fentry/fexit on alloc_vmap_area"
    };
    let attach = r["run"]["attach"].as_array().unwrap();
    assert!(
        attach.contains(&Value::from(format!("alloc_vmap_area: {how}"))),
        "{attach:?}"
    );
    let (count, req, alloc, caches) = stacks_through(&r, "vmalloc", "array_map_alloc");
    assert_eq!((count, req, alloc), (1, 258 * PAGE, 258 * PAGE));
    assert_eq!(caches, ["vmalloc"]);
    // Its 257 pages come from the page allocator below __vmalloc_node_range
    // (the guard page has none): counted by vmalloc, so the page source
    // shows them as its vmalloc layer and the totals leave them out. On
    // 6.18 all 257 emit mm_page_alloc (256 through alloc_pages, one through
    // the bulk allocator's fallback); on 6.12 (scripts/vm-test) none was
    // seen: most likely the bulk allocator took them all from the per-CPU
    // lists, which emits no event. Either way none is counted as direct.
    // Debian's 7.2 takes them in higher orders: one order-8 block of 256
    // pages and one page through the bulk allocator, 2 allocations.
    let (allocs, _, bytes, caches) = stacks_through(&r, "page", "array_map_alloc");
    assert!(
        bytes == 257 * PAGE || bytes == 0,
        "{allocs} page allocations of {bytes} bytes"
    );
    if bytes > 0 {
        assert!(
            caches
                .iter()
                .all(|c| c.starts_with("pages-order") && c.ends_with("-vmalloc")),
            "{caches:?}"
        );
        if caches == ["pages-order0-vmalloc"] {
            assert_eq!(allocs, 257);
        }
        let page_totals = rows(&r["totals"], "sources", "source", "page");
        assert!(u(&page_totals[0]["counted_elsewhere_bytes"]) >= 257 * PAGE);
    }
}

#[test]
fn vmap_areas_are_labelled_apart_from_vmalloc() {
    // A BPF ring buffer of 1 MiB: ringbuf_map_alloc allocates its 3 header
    // and 256 data pages one by one and maps them with vmap(), the data
    // pages twice (records wrap around): one vmap area of 3 + 2 x 256
    // pages and a guard page, with no vmalloc behind it. Its page array
    // (515 pointers) is kmalloc'd.
    let r = record_all(&["bpf-array", "ringbuf", "1048576", "0"]);
    assert_totals_add_up(&r);
    let (count, req, alloc, mut caches) = stacks_through(&r, "vmalloc", "ringbuf_map_alloc");
    // Where bpf_ringbuf_area_alloc vmallocs a page array above a page
    // (5.10), the 515 pointers are an area of their own, vmalloc proper:
    // 2 pages and a guard page.
    let array = u64::from(caches.iter().any(|c| c == "vmalloc"));
    assert_eq!(
        (count, req, alloc),
        (
            1 + array,
            (516 + 3 * array) * PAGE,
            (516 + 3 * array) * PAGE
        )
    );
    caches.sort();
    assert_eq!(caches, ["vmalloc", "vmap"][1 - array as usize..]);
    // The label is the area's, not its stack's: the cache row says it too,
    // and the one vmalloc site has both kinds when the workload also
    // vmallocs (its thread stack does not: its parent allocates that).
    let vmap = rows(&r, "caches", "name", "vmap");
    assert_eq!(vmap.len(), 1, "{:#}", r["caches"]);
    assert_eq!(vmap[0]["source"], "vmalloc");
    assert!(u(&vmap[0]["count"]) >= 1);
    let site = rows(&r, "sites", "source", "vmalloc");
    assert_eq!(site.len(), 1);
    assert!(site[0]["caches"]
        .as_array()
        .unwrap()
        .contains(&Value::from("vmap")));
    // No vmalloc-proper stack is labelled vmap, and the other way round.
    for s in rows(&r, "stacks", "source", "vmalloc") {
        let frames = frames(s);
        let proper = frames.iter().any(|f| f.starts_with("__vmalloc_node_range"));
        let mapped = frames.iter().any(|f| f.starts_with("vmap+"));
        let want = match (proper, mapped) {
            (true, _) => "vmalloc",
            (false, true) => "vmap",
            _ => continue,
        };
        assert_eq!(s["cache"], want, "{s:#}");
    }
    // Its pages are the ring buffer's own page allocations: direct.
    let ring_pages: u64 = rows(&r, "stacks", "source", "page")
        .into_iter()
        .filter(|s| {
            s["cache"] == "pages-order0"
                && frames(s).iter().any(|f| f.starts_with("ringbuf_map_alloc"))
        })
        .map(|s| u(&s["count"]))
        .sum();
    assert_eq!(ring_pages, 259);
}

/// The kretprobe/kprobe fallback (forced with KHEAP_FALLBACK=kprobe, since
/// tracepoints or fentry are preferred where they exist): where the kernel
/// has kprobes (6.1, 6.12), it counts the same one area as the tracepoints
/// and fexit do; where it has none (this 6.18 host), vmalloc is left out
/// with one line saying why, and the rest of the run goes on.
#[test]
fn vmalloc_kprobe_fallback_counts_the_same_area() {
    require_root();
    let forced = ForcedKprobes::new();
    let r = record_json(
        &["--source", "kmalloc,vmalloc", "--exact-stacks"],
        &["bpf-array", "array", "256", "4096"],
    );
    drop(forced);
    let attach = r["run"]["attach"].as_array().unwrap();
    let skipped = r["run"]["skipped"].as_array().unwrap();
    if std::path::Path::new("/sys/bus/event_source/devices/kprobe").exists() {
        assert!(
            attach.contains(&Value::from(
                "alloc_vmap_area: kprobe/kretprobe on alloc_vmap_area"
            )),
            "{attach:?}"
        );
        let (count, req, alloc, caches) = stacks_through(&r, "vmalloc", "array_map_alloc");
        assert_eq!((count, req, alloc), (1, 258 * PAGE, 258 * PAGE));
        assert_eq!(caches, ["vmalloc"]);
    } else {
        assert!(
            skipped.iter().any(|s| {
                let s = s.as_str().unwrap();
                s.contains("KHEAP_FALLBACK=kprobe") && s.contains("has none")
            }),
            "{skipped:?}"
        );
        assert!(rows(&r, "sites", "source", "vmalloc").is_empty());
        // The slab source still ran: the BPF array's struct came from it.
        assert!(!rows(&r, "sites", "source", "kmalloc").is_empty());
    }
}

/// `KHEAP_FALLBACK=kprobe` for the kheap runs of one test (threads: 1).
struct ForcedKprobes;

impl ForcedKprobes {
    fn new() -> ForcedKprobes {
        std::env::set_var("KHEAP_FALLBACK", "kprobe");
        ForcedKprobes
    }
}

impl Drop for ForcedKprobes {
    fn drop(&mut self) {
        std::env::remove_var("KHEAP_FALLBACK");
    }
}

#[test]
fn pages_of_new_slabs_are_the_slab_layer() {
    // 2000 messages of 4000 bytes: 4 KiB kmalloc objects, several new
    // order-3 slabs (how many depends on the partial slabs the kernel had).
    let r = record_all(&["msg", "2000", "4000"]);
    assert_totals_add_up(&r);
    // allocate_slab is inlined into new_slab on Debian's arm64 6.12 (the
    // stacks there go new_slab+0x3f4 -> ___slab_alloc), not on x86-64.
    let (mut slabs, _, mut bytes, mut caches) = stacks_through(&r, "page", "allocate_slab");
    if slabs == 0 {
        (slabs, _, bytes, caches) = stacks_through(&r, "page", "new_slab");
    }
    assert!(slabs > 0, "no new slab: {:#}", r["caches"]);
    assert!(caches.iter().all(|c| c.ends_with("-slab")), "{caches:?}");
    let page_totals = rows(&r["totals"], "sources", "source", "page");
    assert!(u(&page_totals[0]["counted_elsewhere_bytes"]) >= bytes);
    // No other page is in the slab layer (but kmalloc's pages above 8 KiB).
    for s in rows(&r, "stacks", "source", "page") {
        let through_slab = s["frames"].as_array().unwrap().iter().any(|f| {
            let f = f.as_str().unwrap();
            f.starts_with("allocate_slab")
                || f.starts_with("new_slab")
                || f.contains("kmalloc_large")
        });
        assert_eq!(
            s["cache"].as_str().unwrap().ends_with("-slab"),
            through_slab,
            "{s:#}"
        );
    }
}

/// Before Linux 5.19 the percpu tracepoint has no call site (nor the size
/// allocated): kheap leaves the source out of a run with one line saying
/// so, and traces the others. Checks that of report `r`, says that `test`
/// checked only that, and returns true; elsewhere returns false at once.
fn percpu_left_out_here(r: &Value, test: &str) -> bool {
    if !kernel_before(5, 19) {
        return false;
    }
    let skipped = r["run"]["skipped"].to_string();
    assert!(
        skipped.contains(
            "this kernel's percpu:percpu_alloc_percpu tracepoint predates its call_site argument (Linux 5.19)"
        ),
        "{skipped}"
    );
    assert!(rows(r, "sites", "source", "percpu").is_empty());
    assert!(!rows(r, "sites", "source", "kmalloc").is_empty());
    partial_check(&format!(
        "{test}: this kernel's percpu tracepoint predates call_site (5.19); only that the source is left out with one line was checked"
    ));
    true
}

#[test]
fn percpu_source_counts_one_allocation_per_entry_on_every_cpu() {
    const ENTRIES: u64 = 100;
    const VALUE: u64 = 24; // already a multiple of 8 (the kernel rounds up)
    let r = record_all(&[
        "bpf-array",
        "percpu",
        &ENTRIES.to_string(),
        &VALUE.to_string(),
    ]);
    assert_totals_add_up(&r);
    if percpu_left_out_here(
        &r,
        "percpu_source_counts_one_allocation_per_entry_on_every_cpu",
    ) {
        return;
    }
    // One percpu allocation per entry (bpf_array_alloc_percpu). Its real
    // footprint (the tracepoint's bytes_alloc) is the value on every
    // possible CPU, plus one obj_cgroup pointer per 4 bytes when the memory
    // controller accounts kernel memory (BPF maps are __GFP_ACCOUNT).
    let cpus = possible_cpus();
    let memcg_ptrs = if memcg_kmem() { VALUE / 4 * 8 } else { 0 };
    let (count, req, alloc, caches) = stacks_through(&r, "percpu", "array_map_alloc");
    assert_eq!(
        (count, req, alloc),
        (
            ENTRIES,
            ENTRIES * VALUE,
            ENTRIES * (VALUE * cpus + memcg_ptrs)
        )
    );
    assert_eq!(caches, ["percpu"]);
    let site = rows_of_fn(&r, "sites", "bpf_map_alloc_percpu");
    assert_eq!(site.len(), 1, "{:#}", r["sites"]);
    assert_eq!(site[0]["source"], "percpu");
}

#[test]
fn default_runs_load_no_other_source() {
    require_root();
    let r = record_json(&[], &["bpf-array", "percpu", "10", "8"]);
    let sources: Vec<&Value> = r["totals"]["sources"].as_array().unwrap().iter().collect();
    assert!(
        sources.iter().all(|t| t["source"] == "kmalloc"),
        "{sources:#?}"
    );
    assert!(r["run"]["attach"].as_array().unwrap().iter().all(|a| !a
        .as_str()
        .unwrap()
        .contains("page")
        && !a.as_str().unwrap().contains("percpu")));
}

#[test]
fn an_unknown_source_is_one_line() {
    let out = kheap(&["record", "--source", "slab", "-d", "1"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown source 'slab': use kmalloc, page, vmalloc, percpu or all"),
        "{err}"
    );
}

/// Whether the memory controller accounts kernel memory (the percpu
/// allocator then keeps an obj_cgroup pointer per 4 bytes of an object).
fn memcg_kmem() -> bool {
    let cgroups = std::fs::read_to_string("/proc/cgroups").unwrap_or_default();
    // /proc/cgroups lists only the controllers cgroup v1 can mount: on a
    // kernel built without v1's memory controller (CONFIG_MEMCG_V1 off,
    // Debian's 7.2) memory is missing there, and only the cgroup2 root's
    // cgroup.controllers names it.
    let v2_root = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
    let memcg_on = cgroups
        .lines()
        .any(|l| l.split_whitespace().next() == Some("memory") && l.ends_with('1'))
        || v2_root.split_whitespace().any(|c| c == "memory");
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    memcg_on && !cmdline.contains("cgroup.memory=nokmem")
}

/// What `kheap leaks --source all` compares a held amount with, and how
/// far apart they may be: /proc/meminfo is system-wide, so the rest of the
/// machine's change of the line over the run (a few hundred KiB on a quiet
/// machine: thread stacks, slab churn) is in the remainder. Measured with
/// 128 MiB held: at most 0.3% (vmalloc), 0.01% (percpu), 0.6% (kmalloc) on
/// 6.1, 6.12 and 6.18.
const ACCOUNTING_BOUND_PCT: i64 = 3;

/// `kheap leaks --source all -d 8 -- kheap-load LOAD…` (the load holds its
/// memory past the end), on an interval no other BPF user disturbed much:
/// another kheap starting or ending moves VmallocUsed by 20 to 50 MiB and
/// Percpu by about 8 MiB, which is not the remainder the test is about.
/// The kernel's BPF maps are listed before and after the run (the
/// workload's and kheap's own are gone by then); when the maps of other
/// processes that came or went hold more than 1% of `held` (by the kernel's
/// own figure, `memlock`), the run is measured again, at most five times,
/// each after the set of maps stayed the same for two seconds; then the
/// test fails (on a machine where other BPF tools keep starting and
/// ending, as when several test suites share it).
fn held_accounting(load: &[&str], line: &str, held: u64) -> Value {
    require_root();
    for attempt in 1..=5 {
        // Memory freed lazily by earlier runs (BPF maps) settles first.
        wait_for_quiet(line);
        wait_for_quiet_maps();
        let before = bpf_maps();
        let r = leaks_until_held(load, line);
        let after = bpf_maps();
        let moved: u64 = before
            .iter()
            .filter(|(id, _)| !after.contains_key(id))
            .chain(after.iter().filter(|(id, _)| !before.contains_key(id)))
            .map(|(_, bytes)| bytes)
            .sum();
        if moved * 100 <= held {
            return r;
        }
        let _ = writeln!(
            std::io::stderr(),
            "kheap test: attempt {attempt}: BPF maps of other processes holding {moved} bytes came or went during the run: measuring again"
        );
    }
    panic!("other processes kept creating or freeing large BPF maps: no quiet interval to compare /proc/meminfo over");
}

/// `kheap leaks --source all -- kheap-load LOAD…`, ended (SIGINT: kheap
/// reports and ends the command) once the workload says it holds
/// everything (`holding …` on the stderr it shares with kheap) and the
/// /proc/meminfo line `line` the test compares has settled (the kernel
/// populates per-CPU chunks and frees lazily in workers): with a fixed 8 s
/// run in a 6.12 TCG guest, kheap and Percpu alike saw only 89.6% of 128
/// MiB of per-CPU values, the workload not yet done.
fn leaks_until_held(load: &[&str], line: &str) -> Value {
    let mut extra = vec!["--", LOAD];
    extra.extend(load);
    leaks_interrupted(&extra, |tracer| {
        tracer.wait_for_within("holding", std::time::Duration::from_secs(300));
        wait_for_quiet(line);
    })
}

/// `kheap leaks --source all … EXTRA` in the background: once it traces,
/// `until` waits for what the test holds; then SIGINT ends the run (kheap
/// reports, and ends a command it started) and the report is read back.
fn leaks_interrupted(extra: &[&str], until: impl FnOnce(&mut Background)) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leaks.json");
    let mut args = vec![
        "leaks",
        "--source",
        "all",
        "--format",
        "json",
        "-o",
        path.to_str().unwrap(),
    ];
    args.extend(extra);
    let mut tracer = Background::spawn(KHEAP, &args);
    tracer.wait_for_within("tracing", std::time::Duration::from_secs(300));
    until(&mut tracer);
    tracer.signal(libc::SIGINT);
    // The whole machine's live objects take a while to report under TCG.
    let status = wait_or_kill(&mut tracer.child, std::time::Duration::from_secs(600));
    assert!(status.success(), "kheap leaks failed: {status}");
    parse_valid(&std::fs::read_to_string(&path).expect("kheap wrote no report"))
}

/// Waits (at most 60 s) until no BPF map came or went for two seconds; says
/// so on stderr when they never did (the caller's comparison of the maps
/// before and after the run then decides whether the run counts).
fn wait_for_quiet_maps() {
    let ids = || {
        let mut ids: Vec<u32> = bpf_maps().into_keys().collect();
        ids.sort_unstable();
        ids
    };
    let quiet = std::time::Duration::from_secs(2);
    let (mut last, mut since) = (ids(), std::time::Instant::now());
    let settled = poll_every(
        std::time::Duration::from_secs(60),
        std::time::Duration::from_millis(250),
        || {
            let now = ids();
            if now != last {
                (last, since) = (now, std::time::Instant::now());
            }
            since.elapsed() >= quiet
        },
    );
    if !settled {
        let _ = writeln!(
            std::io::stderr(),
            "kheap test: BPF maps kept coming or going for 60 s: measuring without a quiet start"
        );
    }
}

/// The BPF maps in the kernel (BPF_MAP_GET_NEXT_ID), each with the memory
/// the kernel says it holds (`memlock` in its fdinfo; 0 if it went away
/// while listed).
fn bpf_maps() -> std::collections::HashMap<u32, u64> {
    const BPF_MAP_GET_NEXT_ID: libc::c_long = 12;
    const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
    let bpf = |cmd: libc::c_long, attr: &mut [u32; 4]| {
        // SAFETY: attr outlives the call and its size is passed.
        unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), 16usize) }
    };
    let mut maps = std::collections::HashMap::new();
    let mut next = [0u32; 4]; // start_id, next_id
    while bpf(BPF_MAP_GET_NEXT_ID, &mut next) == 0 {
        let id = next[1];
        next[0] = id;
        let fd = bpf(BPF_MAP_GET_FD_BY_ID, &mut [id, 0, 0, 0]);
        let mut memlock = 0;
        if fd >= 0 {
            let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"));
            memlock = info
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix("memlock:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            // SAFETY: the fd was just opened here and is not used again.
            unsafe { libc::close(fd as i32) };
        }
        maps.insert(id, memlock);
    }
    maps
}

/// The accounting row of `source`, checked against the held amount: the
/// bytes compared (outstanding less what the line does not count) are at
/// least `held`, and the remainder is within the bound of the line's
/// change.
#[track_caller]
fn assert_accounting_closes(r: &Value, source: &str, held: u64) -> Value {
    let l = &r["leaks"];
    let acc = l["accounting"].as_array().expect("no accounting");
    let sources: Vec<&str> = acc.iter().map(|a| a["source"].as_str().unwrap()).collect();
    // The run traced one command: the page row, which compares with the
    // whole machine's free pages, is left out, and the report says why.
    assert_eq!(sources, ["kmalloc", "vmalloc", "percpu"], "{l:#}");
    let why = l["accounting_skipped"].as_str().expect("no reason given");
    assert!(why.contains("kheap-load' and its children"), "{why}");
    assert!(why.contains("run without filters"), "{why}");
    let row = acc.iter().find(|a| a["source"] == source).unwrap().clone();
    let compared = u(&row["outstanding_bytes"]) - u(&row["excluded_bytes"]);
    assert!(compared >= held, "{compared} < {held}: {row:#}");
    let change = row["meminfo_change_bytes"].as_i64().unwrap();
    let unexplained = row["unexplained_bytes"].as_i64().unwrap();
    assert_eq!(unexplained, change - compared as i64);
    // The figures docs/design.md quotes, on the real stderr (past the
    // harness's capture) so a guest run's log has them.
    let _ = writeln!(
        std::io::stderr(),
        "kheap test: accounting {source}: compared {compared} ({} outstanding, {} left out), {} {change:+}, remainder {unexplained:+} ({:+.2}%)",
        row["outstanding_bytes"],
        row["excluded_bytes"],
        row["meminfo"].as_str().unwrap(),
        unexplained as f64 * 100.0 / change.abs().max(1) as f64
    );
    assert!(
        unexplained.abs() * 100 <= change.abs() * ACCOUNTING_BOUND_PCT,
        "more than {ACCOUNTING_BOUND_PCT}% unexplained: {row:#}"
    );
    row
}

#[test]
fn leaks_accounting_matches_vmalloc_used_for_a_held_vmalloc_area() {
    // A 128 MiB BPF array held past the end of the run: one vmalloc area of
    // 32770 pages (a header page, a guard page). VmallocUsed counts the
    // pages behind it, not the guard page: the accounting leaves out one
    // page per outstanding vmalloc area.
    let held = 32769 * PAGE;
    let r = held_accounting(
        &["bpf-array", "array", "32768", "4096", "60"],
        "VmallocUsed",
        held,
    );
    let vmalloc = assert_accounting_closes(&r, "vmalloc", held);
    assert!(u(&vmalloc["excluded_bytes"]) >= PAGE, "{vmalloc:#}");
    assert_eq!(vmalloc["meminfo"], "VmallocUsed");
    // The area's pages are vmalloc's: not outstanding again as direct
    // pages (their page rows are the vmalloc layer, counted elsewhere).
    let direct_pages: u64 = r["caches"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["source"] == "page" && c.get("counted_elsewhere").is_none())
        .map(|c| c.get("outstanding_bytes").map_or(0, u))
        .sum();
    assert!(direct_pages < 16384 * PAGE / 10, "{:#}", r["caches"]);
}

#[test]
fn leaks_accounting_matches_percpu_for_a_held_percpu_array() {
    // 128 MiB of per-CPU memory whatever the CPUs: a per-CPU array of
    // 4 KiB values, one percpu allocation per entry. Percpu counts the
    // populated chunk pages on every CPU; the obj_cgroup pointers in the
    // allocations' footprint live in chunk metadata (slab or vmalloc), so
    // the accounting leaves them out.
    if kernel_before(5, 19) {
        let r = json_report(
            "leaks",
            &[
                "--source",
                "all",
                "--",
                LOAD,
                "bpf-array",
                "percpu",
                "10",
                "4096",
            ],
        );
        assert!(percpu_left_out_here(
            &r,
            "leaks_accounting_matches_percpu_for_a_held_percpu_array"
        ));
        return;
    }
    let cpus = possible_cpus();
    let entries = (128 << 20) / (4096 * cpus);
    let held = entries * 4096 * cpus;
    let r = held_accounting(
        &["bpf-array", "percpu", &entries.to_string(), "4096", "60"],
        "Percpu",
        held,
    );
    let percpu = assert_accounting_closes(&r, "percpu", held);
    let memcg_ptrs = if memcg_kmem() {
        entries * 4096 / 4 * 8
    } else {
        0
    };
    assert!(u(&percpu["excluded_bytes"]) >= memcg_ptrs, "{percpu:#}");
    assert_eq!(percpu["meminfo"], "Percpu");
}

#[test]
fn leaks_accounting_matches_slab_for_held_messages() {
    // 32768 SysV messages of 4000 bytes held past the end of the run: one
    // 4 KiB kmalloc object each (48 + 4000 bytes in load_msg), 128 MiB,
    // which fill order-3 slabs of 8 objects exactly: Slab grows by what
    // kmalloc holds (the queues' own objects are in both).
    const MSGS: u64 = 32768;
    let r = held_accounting(
        &["msg", &MSGS.to_string(), "4000", "60"],
        "Slab",
        MSGS * 4096,
    );
    let kmalloc = assert_accounting_closes(&r, "kmalloc", MSGS * 4096);
    assert_eq!(kmalloc["meminfo"], "Slab");
}

/// The page allocator's row of the accounting, for anonymous memory held
/// by a workload started after kheap attached: its pages are outstanding,
/// and, /proc/meminfo being the whole machine's, so is every page anyone
/// else allocated meanwhile, less what they freed (their frees of pages
/// allocated before the run included, by their order's size). The run has
/// no filter (`-- CMD` would leave the others' allocations out but not the
/// free pages' drop). What kheap cannot see is measured independently and,
/// when it exceeds 1% of the held amount, the run is measured again (at
/// most five times, then the test fails saying so): pages allocated with
/// no event (the bulk allocator: /proc/vmstat's `pgalloc_*` above kheap's
/// page allocations), page events the kernel dropped (recursion misses)
/// and allocations the object map had no room for. The bound is on the
/// held amount, not on the line's change: on a machine with a page cache
/// the change is mostly the others' (measured on this 6.18 host: -339 MB
/// to +541 MB with 512 MiB held).
#[test]
fn leaks_accounting_matches_free_pages_for_held_anonymous_memory() {
    require_root();
    let pages = held_pages();
    let held = pages * PAGE;
    for attempt in 1..=5 {
        let r = unfiltered_leaks_while_holding(pages);
        let acc = r["leaks"]["accounting"].as_array().expect("no accounting");
        let row = acc.iter().find(|a| a["source"] == "page").unwrap();
        assert!(
            r["leaks"].get("accounting_skipped").is_none(),
            "{:#}",
            r["leaks"]
        );
        let allocated: u64 = rows(&r, "caches", "source", "page")
            .iter()
            .map(|c| u(&c["bytes_alloc"]))
            .sum();
        let freed: u64 = rows(&r, "caches", "source", "page")
            .iter()
            .map(|c| u(&c["freed_bytes"]))
            .sum::<u64>()
            + u(&row["frees_untracked_bytes"]);
        let vmstat_alloc = row["vmstat_pgalloc_bytes"].as_i64().unwrap();
        let vmstat_free = row["vmstat_pgfree_bytes"].as_i64().unwrap();
        let page_misses: u64 = r["leaks"]["recursion_misses_by_program"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["program"].as_str().unwrap().starts_with("mm_page_"))
            .map(|p| u(&p["misses"]))
            .sum();
        let unseen = (vmstat_alloc - allocated as i64).max(0) as u64
            + (page_misses + u(&r["leaks"]["map_full_objects"])) * PAGE;
        // The free pool can also move with no allocation at all: free pages
        // isolated for a while (compaction, free page reporting to a
        // hypervisor) leave MemFree without any pgalloc.
        let isolated = row["meminfo_change_bytes"].as_i64().unwrap() - (vmstat_alloc - vmstat_free);
        let _ = writeln!(
            std::io::stderr(),
            "kheap test: attempt {attempt}: page events: allocated {allocated} (vmstat {vmstat_alloc:+}), freed {freed} (vmstat {vmstat_free:+}), {page_misses} missed, {} not tracked; free pool moved {isolated:+} beside vmstat",
            r["leaks"]["map_full_objects"]
        );
        if unseen * 100 > held || isolated.unsigned_abs() * 100 > held {
            let _ = writeln!(
                std::io::stderr(),
                "kheap test: attempt {attempt}: page allocations kheap could not see ({unseen} bytes) or free pages moved without an allocation ({isolated:+} bytes) above 1% of the held memory: measuring again"
            );
            continue;
        }
        assert_page_row_closes(row, held, isolated);
        return;
    }
    panic!("page allocations without events, or free pages moved without allocations, kept exceeding 1% of the held memory: no interval to compare MemFree over");
}

/// 512 MiB of anonymous pages, or a third of the available memory if less
/// (the guests of scripts/vm-test have 1 GiB).
fn held_pages() -> u64 {
    let available = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("MemAvailable in /proc/meminfo")
        * 1024;
    (512 << 20).min(available / 3) / PAGE
}

/// `kheap leaks --source all` on the whole machine while `kheap-load pages
/// PAGES` (started once kheap traces) faults its pages in and holds them;
/// interrupted once the workload says it is done.
fn unfiltered_leaks_while_holding(pages: u64) -> Value {
    // Room for the workload's pages and everything the others allocate.
    let max_objects = (pages * 4).to_string();
    let mut load = None;
    let r = leaks_interrupted(&["--max-objects", &max_objects], |_| {
        let held = load.insert(Held(
            std::process::Command::new(LOAD)
                .args(["pages", &pages.to_string(), "600"])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("starting kheap-load"),
        ));
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(held.0.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        // Every page is faulted in (and traced) before the line is
        // written. MemFree may still lag by the per-CPU counts the kernel
        // has not folded yet: a few hundred pages at most, well inside the
        // test's 1% of the held memory.
        assert_eq!(line.trim(), "populated", "kheap-load pages failed");
    });
    // Held past the end of the run, then killed and reaped.
    drop(load);
    r
}

/// A workload killed and reaped when dropped, so its memory goes with the
/// test even when it fails.
struct Held(std::process::Child);

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The page row compares every page kheap saw allocated and not freed
/// (its direct pages and the layers that back other sources), less the
/// pages freed that were allocated before the run, with the drop of the
/// free pages (MemFree and the per-CPU lists). Every held page is
/// outstanding, but for pages moved during the run without an allocation
/// event: compaction copies a page into a free page it took off the free
/// lists itself (no mm_page_alloc, nor pgalloc) and frees the old one
/// (mm_page_free), so kheap sees a held page freed and not its copy.
/// `isolated` (the free pool's move beside /proc/vmstat's counts) measures
/// such pages independently. Seen once in a 1 GiB 6.1 guest: 408 pages
/// short and 408 isolated; that it was compaction is inferred, not
/// confirmed (the compact_* counters were not read).
#[track_caller]
fn assert_page_row_closes(row: &Value, held: u64, isolated: i64) {
    assert_eq!(row["meminfo"], "-MemFree - pcp");
    let moved = isolated.max(0) as u64;
    assert!(
        u(&row["outstanding_bytes"]) + moved >= held,
        "{held} held, {moved} moved by compaction: {row:#}"
    );
    let compared = u(&row["outstanding_bytes"]) as i64 + u(&row["counted_elsewhere_bytes"]) as i64
        - u(&row["frees_untracked_bytes"]) as i64;
    let change = row["meminfo_change_bytes"].as_i64().unwrap();
    let unexplained = row["unexplained_bytes"].as_i64().unwrap();
    assert_eq!(unexplained, change - compared, "{row:#}");
    let _ = writeln!(
        std::io::stderr(),
        "kheap test: accounting page: compared {compared} ({} outstanding, {} counted elsewhere, {} freed untracked), {} {change:+}, remainder {unexplained:+} ({:+.2}% of {held} held)",
        row["outstanding_bytes"],
        row["counted_elsewhere_bytes"],
        row["frees_untracked_bytes"],
        row["meminfo"].as_str().unwrap(),
        unexplained as f64 * 100.0 / held as f64
    );
    assert!(
        unexplained.unsigned_abs() * 100 <= held * ACCOUNTING_BOUND_PCT as u64,
        "more than {ACCOUNTING_BOUND_PCT}% of the held memory unexplained: {row:#}"
    );
}

/// Waits (at most 10 s) until the /proc/meminfo line `name` has not moved
/// for a second; says so on stderr when it kept moving (the remainder the
/// test bounds then includes that movement).
fn wait_for_quiet(name: &str) {
    let read = || {
        std::fs::read_to_string("/proc/meminfo")
            .unwrap()
            .lines()
            .find(|l| l.split(':').next() == Some(name))
            .map(str::to_string)
    };
    // Quiet: the line did not change between two reads a second apart.
    let mut last = None;
    let settled = poll_every(
        std::time::Duration::from_secs(10),
        std::time::Duration::from_secs(1),
        || {
            let now = read();
            let same = last.as_ref() == Some(&now);
            last = Some(now);
            same
        },
    );
    if settled {
        return;
    }
    let _ = writeln!(
        std::io::stderr(),
        "kheap test: /proc/meminfo's {name} moved every second for 10 s: measuring without a quiet start"
    );
}

/// The tables of a run with more than the slab name each row's source:
/// the site table has a `source` column, each stack of the stack view says
/// its source, and the anonymous pages' stacks there add up to the exact
/// count. A default run's table has no such column.
#[test]
fn tables_name_the_source_of_every_row() {
    require_root();
    const N: u64 = 1000;
    let dir = tempfile::tempdir().unwrap();
    let table_of = |args: &[&str], load: &[&str]| -> String {
        let path = dir.path().join("report.txt");
        let mut all = vec!["record", "-n", "10000", "-o", path.to_str().unwrap()];
        all.extend(args);
        all.extend(["--", LOAD]);
        all.extend(load);
        assert_ok(&kheap(&all));
        std::fs::read_to_string(&path).unwrap()
    };
    let cells = |line: &str| -> Vec<String> {
        line.split(['│', '┆'])
            .map(|c| c.trim().to_string())
            .collect()
    };
    let header_of = |t: &str| cells(t.lines().find(|l| l.contains("waste%")).unwrap());

    let plain = table_of(&[], &["msg", "10", "100"]);
    assert_eq!(
        &header_of(&plain)[1..4],
        ["site", "cache", "count"],
        "{plain}"
    );

    let n = N.to_string();
    let sites = table_of(&["--source", "kmalloc,page"], &["pages", &n]);
    assert_eq!(
        &header_of(&sites)[1..4],
        ["site", "source", "cache"],
        "{sites}"
    );
    let page = sites.lines().find(|l| l.contains("[page]")).unwrap();
    let page = cells(page);
    assert_eq!(page[2], "page", "{sites}");
    assert!(page[4].parse::<u64>().unwrap() >= N, "{sites}");
    let kmalloc_rows = sites
        .lines()
        .filter(|l| l.starts_with('│') && !l.contains("waste%"))
        .filter(|l| cells(l)[2] == "kmalloc")
        .count();
    assert!(
        kmalloc_rows > 0,
        "the command's own slab allocations: {sites}"
    );

    // Stack blocks: a title "#i function  N allocs, …, cache C, source S",
    // then the frames, indented.
    let stacks = table_of(
        &[
            "--source",
            "kmalloc,page",
            "--exact-stacks",
            "--by",
            "stack",
        ],
        &["pages", &n],
    );
    let mut anon = 0;
    for block in stacks.split("\n#").skip(1) {
        // The title ends with the source, then the process that made the
        // stack ("; by comm [pid]").
        let title = block.lines().next().unwrap();
        let title = title.split("; by ").next().unwrap();
        let frames: Vec<&str> = block
            .lines()
            .skip(1)
            .map(str::trim)
            .filter(|f| f.contains("+0x"))
            .collect();
        let through = |name: &str| frames.iter().any(|f| f.starts_with(name));
        assert!(
            title.ends_with(", source page") || title.ends_with(", source kmalloc"),
            "{title}"
        );
        // The fault path's own slab allocations (anon_vma…) are kmalloc's.
        let anon_page = title.ends_with(", source page")
            && through(populating_frame())
            && through("handle_mm_fault")
            && !frames
                .iter()
                .any(|f| f.contains("pte_alloc") || f.contains("pmd_alloc"));
        if anon_page {
            assert!(
                title.ends_with("cache pages-order0, source page"),
                "{title}"
            );
            let count = title.split("  ").nth(1).unwrap();
            anon += count.split(' ').next().unwrap().parse::<u64>().unwrap();
        }
    }
    assert_eq!(anon, N, "{stacks}");
}

/// A PCI device's expansion ROM (sysfs path, size of its ROM BAR), if the
/// machine has one: the test guests of scripts/vm-test get an e1000 for it.
fn pci_rom() -> Option<(std::path::PathBuf, u64)> {
    let mut devices: Vec<_> = std::fs::read_dir("/sys/bus/pci/devices")
        .ok()?
        .flatten()
        .map(|e| e.path())
        .collect();
    devices.sort();
    devices.into_iter().find_map(|d| {
        // resource: one "start end flags" line per BAR; the ROM's is the 7th.
        let resources = std::fs::read_to_string(d.join("resource")).ok()?;
        let rom: Vec<u64> = resources
            .lines()
            .nth(6)?
            .split_whitespace()
            .map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).unwrap_or(0))
            .collect();
        let size = (rom[1] > rom[0]).then(|| rom[1] - rom[0] + 1)?;
        d.join("rom").exists().then(|| (d.join("rom"), size))
    })
}

/// Reading a ROM is enabled by writing 1 to its sysfs file; disabled again
/// when dropped, also when the test fails.
struct RomEnabled(std::path::PathBuf);

impl RomEnabled {
    fn new(rom: &std::path::Path) -> RomEnabled {
        std::fs::write(rom, "1").expect("enabling the ROM");
        RomEnabled(rom.to_path_buf())
    }
}

impl Drop for RomEnabled {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, "0");
    }
}

/// One read(2) of a PCI expansion ROM through sysfs maps the whole ROM BAR
/// with ioremap (pci_map_rom) and unmaps it: exactly one vmap area of the
/// BAR's size and a guard page, labelled ioremap, not vmalloc.
#[test]
fn ioremap_areas_are_labelled_apart_from_vmalloc() {
    require_root();
    let Some((rom, size)) = pci_rom() else {
        partial_check(
            "no PCI device with an expansion ROM here (the scripts/vm-test guests have one): the ioremap label is checked there",
        );
        return;
    };
    let _enabled = RomEnabled::new(&rom);
    let input = format!("if={}", rom.display());
    let r = json_report(
        "record",
        &[
            "--source",
            "vmalloc",
            "--exact-stacks",
            "--",
            "dd",
            &input,
            "of=/dev/null",
            "bs=4096",
            "count=1",
        ],
    );
    let (count, req, alloc, caches) = stacks_through(&r, "vmalloc", "pci_map_rom");
    assert_eq!(count, 1, "one read, one mapping: {:#}", r["stacks"]);
    assert_eq!((req, alloc), (size + PAGE, size + PAGE));
    assert_eq!(caches, ["ioremap"]);
    let row = rows(&r, "caches", "name", "ioremap");
    assert_eq!(row.len(), 1, "{:#}", r["caches"]);
    assert_eq!(u(&row[0]["count"]), 1);
    assert_eq!(row[0]["source"], "vmalloc");
}
