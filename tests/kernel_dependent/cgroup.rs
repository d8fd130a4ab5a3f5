//! cgroups against the real kernel: workloads of known counts run in cgroup
//! v2 directories the test creates; `--by cgroup` and `--cgroup` must show
//! each one's exact numbers, nested cgroups, cgroups removed mid-run, and
//! the memory-cgroup accounting of each workload's kernel path.
//!
//! Every workload allocates exactly 144 bytes per operation and the runs
//! count only 144-byte requests: a SysV message of 96 bytes is one kmalloc
//! of 48 + 96 bytes (load_msg, charged to the memcg), one writev(2) of 9
//! iovecs one kmalloc of 9 * 16 bytes (iovec_from_user, GFP_KERNEL: not
//! charged). Each workload starts, is moved into its cgroup, and only then
//! runs (KHEAP_LOAD_WAIT), so its exec and start-up are not in the cgroup.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::cgroup::{run_in, DirOpened, TestCgroup, Workload};
use common::*;
use serde_json::Value;

const REQ: &str = "144";

/// A kheap started by a test: interrupted (and reaped) if the test fails
/// before stopping it, so nothing stays attached.
struct Tracing(std::process::Child);

impl Tracing {
    fn start(args: &[&str]) -> Tracing {
        Tracing(spawn_tracing(args))
    }

    /// Stops it with SIGINT (as Ctrl-C) and says whether it succeeded.
    fn stop(&mut self) -> bool {
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        self.wait()
    }

    fn wait(&mut self) -> bool {
        wait_or_kill(&mut self.0, HANG_LIMIT).success()
    }
}

impl Drop for Tracing {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
            // Killed after the limit rather than hanging the suite (as
            // Background's drop); no panic: the test already failed.
            if exit_within(&mut self.0, HANG_LIMIT).is_none() {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
    }
}

/// Starts `kheap record ARGS` (144-byte requests only, JSON to a file),
/// runs `work`, stops kheap with SIGINT and returns its report.
fn record_around(args: &[&str], work: impl FnOnce()) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.json");
    let mut all = vec![
        "record",
        "--min-size",
        REQ,
        "--max-size",
        REQ,
        "--format",
        "json",
        "-o",
        out.to_str().unwrap(),
    ];
    all.extend(args);
    let mut kheap = Tracing::start(&all);
    work();
    assert!(kheap.stop(), "kheap {all:?} failed");
    parse_valid(&std::fs::read_to_string(&out).expect("kheap wrote no report"))
}

fn cgroup_row<'a>(r: &'a Value, rel: &str) -> &'a Value {
    let rows = r["cgroups"].as_array().expect("cgroups list");
    let found: Vec<&Value> = rows
        .iter()
        .filter(|c| c["cgroup"]["path"].as_str() == Some(rel))
        .collect();
    assert_eq!(found.len(), 1, "one row for {rel}: {rows:#?}");
    found[0]
}

/// Whether kmalloc events can show that msg_msg is charged: 6.11 moved it
/// to SLAB_ACCOUNT bucket caches (kmem_buckets_alloc without
/// __GFP_ACCOUNT). 6.13+ names an object's cache to tp_btf programs
/// (bpf_get_kmem_cache); elsewhere kheap finds the object's slab through
/// the direct map and vmemmap bases, which kallsyms lists only with
/// CONFIG_KALLSYMS_ALL (distribution kernels have it).
fn msg_accounting_visible(r: &Value) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut v = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
    let tp_btf = r["run"]["attach"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a.as_str() == Some("kmalloc: tp_btf"));
    let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
    // The symbols the page walk's bases come from (src/arch.rs,
    // SLAB_PAGE_BASES; arm64: src/kernel/kmem/page_map.rs).
    let symbols: &[&str] = if cfg!(target_arch = "x86_64") {
        &["page_offset_base", "vmemmap_base"]
    } else {
        &[
            "memstart_addr",
            "mem_section",
            "kmem_cache",
            "kmalloc_caches",
        ]
    };
    let bases_known = symbols
        .iter()
        .all(|sym| kallsyms.lines().any(|l| l.ends_with(&format!(" {sym}"))));
    (major, minor) < (6, 11) || ((major, minor) >= (6, 13) && tp_btf) || bases_known
}

#[test]
fn by_cgroup_counts_each_cgroup_exactly() {
    require_root();
    // kmalloc's object for 144 bytes: 192 on x86-64.
    let obj = kmalloc_object_size(144);
    let a = TestCgroup::top("a");
    let nested = a.child("nested");
    let b = TestCgroup::top("b");
    let gone = TestCgroup::top("gone");
    let r = record_around(
        &[
            "--by",
            "cgroup",
            "--cgroup",
            a.path(),
            "--cgroup",
            b.path(),
            "--cgroup",
            gone.path(),
        ],
        || {
            // kheap learns paths by walking the cgroup2 tree, on its next
            // tick (every second) after a cgroup it does not know has
            // allocated: wait until a walk has opened this one, then
            // remove the cgroup while the run goes on.
            let walked = DirOpened::watch(&gone.dir);
            run_in(&gone, &["writev", "200"]);
            assert!(
                walked.wait(Duration::from_secs(20)),
                "no walk of the cgroup tree opened {} within 20 s",
                gone.path()
            );
            gone.remove();
            assert!(!gone.dir.exists());
            run_in(&a, &["msg", "500", "96"]);
            run_in(&nested, &["writev", "300"]);
            run_in(&b, &["writev", "700"]);
        },
    );

    let row_a = cgroup_row(&r, &a.rel());
    assert_eq!(u(&row_a["count"]), 500, "A: its 500 messages");
    assert_eq!(u(&row_a["bytes_req"]), 500 * 144);
    assert_eq!(
        u(&row_a["bytes_alloc"]),
        500 * obj,
        "144 bytes round up to kmalloc-{obj}"
    );
    if msg_accounting_visible(&r) {
        assert_eq!(
            u(&row_a["accounted_count"]),
            500,
            "msg_msg is charged: {row_a:#}"
        );
        assert_eq!(u(&row_a["accounted_bytes"]), 500 * obj);
        assert_eq!(u(&row_a["unaccounted_count"]), 0);
    } else {
        partial_check(
            "this kernel allocates msg_msg from SLAB_ACCOUNT buckets that its kmalloc events do not name, and kheap cannot find its objects' slabs here (the report says why): A's accounting not checked",
        );
    }

    for (cg, n) in [(&nested, 300), (&b, 700), (&gone, 200)] {
        let row = cgroup_row(&r, &cg.rel());
        assert_eq!(u(&row["count"]), n, "{}: {row:#}", cg.rel());
        assert_eq!(u(&row["bytes_alloc"]), n * obj);
        assert_eq!(
            u(&row["unaccounted_count"]),
            n,
            "writev's iovec array is not charged"
        );
        assert_eq!(u(&row["unaccounted_bytes"]), n * obj);
        assert_eq!(u(&row["accounted_count"]), 0);
        assert_eq!(row["interrupt"], false);
    }
    // Only the three targets and the one below A ran anything.
    let rows = r["cgroups"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{rows:#?}");
    assert_eq!(u(&r["totals"]["count"]), 500 + 300 + 700 + 200);
}

#[test]
fn cgroup_filter_counts_only_that_cgroup_and_below() {
    require_root();
    let a = TestCgroup::top("fa");
    let nested = a.child("nested");
    let b = TestCgroup::top("fb");
    let rel = a.rel();
    // Relative to the cgroup2 mount, as a user may give it.
    let r = record_around(&["--cgroup", rel.trim_start_matches('/')], || {
        run_in(&a, &["msg", "400", "96"]);
        run_in(&nested, &["writev", "300"]);
        run_in(&b, &["writev", "700"]);
    });
    assert_eq!(
        u(&r["totals"]["count"]),
        400 + 300,
        "A's messages and its nested cgroup's writes, none of B's"
    );
    let msg = rows_of_fn(&r, "sites", msg_fn());
    assert_eq!(msg.iter().map(|s| u(&s["count"])).sum::<u64>(), 400);
    let iov = rows_of_fn(&r, "sites", "iovec_from_user");
    assert_eq!(iov.iter().map(|s| u(&s["count"])).sum::<u64>(), 300);
    assert!(
        r["run"]["filters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f.as_str() == Some(&format!("cgroup {rel}"))),
        "{:#}",
        r["run"]["filters"]
    );
}

#[test]
fn bad_cgroups_are_refused_in_one_line() {
    require_root();
    let mount = kheap::cgroup::cgroup2_mount().unwrap();
    let missing = mount.join("kheap-no-such-cgroup");
    for (arg, expect) in [
        (missing.to_str().unwrap(), "No such file"),
        ("/proc", "not under the cgroup2 mount"),
        ("kheap-no-such-cgroup", "No such file"),
    ] {
        let out = kheap(&["record", "--cgroup", arg, "-d", "1"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--cgroup {arg} accepted");
        assert!(err.contains(expect), "--cgroup {arg}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert!(!err.contains("tracing"), "nothing attached: {err}");
    }
    // malloc: the same refusals, and a cgroup where nothing runs.
    let empty = TestCgroup::top("empty");
    for (arg, expect) in [
        ("/proc", "not under the cgroup2 mount"),
        ("kheap-no-such-cgroup", "No such file"),
        (empty.path(), "no process runs in it"),
    ] {
        let out = kheap(&["malloc", "--cgroup", arg, "-d", "1"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "malloc --cgroup {arg} accepted");
        assert!(err.contains(expect), "malloc --cgroup {arg}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    }
}

/// Loopback TCP: the receive side runs in softirq context (on x86-64 on the
/// IRQ stack), where ACKs and other skbs are allocated: those allocations
/// are no task's and land in the interrupt row, with no cgroup.
#[test]
fn by_cgroup_puts_interrupt_allocations_in_their_own_row() {
    let r = interrupt_rows(&[]);
    assert!(
        r["run"]["attach"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| !a.as_str().unwrap().ends_with(": tracepoint")),
        "{:#}",
        r["run"]["attach"]
    );
}

/// The same on classic tracepoints (the fallback where tp_btf and raw_tp
/// are refused), whose records are not on the interrupted stack: the
/// context comes from the registers the event stored.
#[test]
fn classic_tracepoints_put_interrupt_allocations_in_their_own_row() {
    let r = interrupt_rows(&["--attach", "tracepoint"]);
    assert!(
        r["run"]["attach"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a.as_str() == Some("kmalloc: tracepoint")),
        "{:#}",
        r["run"]["attach"]
    );
}

/// A timer's interrupt of a process that computes in user mode runs on the
/// process's own kernel stack (x86-64 switches stacks only for an interrupt
/// of kernel code), with the process as the current task; each SIGALRM of
/// its interval timer allocates a `sigqueue` object there, under
/// it_real_fn. Those allocations are still no task's: the interrupt row and
/// the stacks' interrupt entries have them, and a run that traces the
/// process by PID does not count them.
#[test]
fn an_interrupt_of_user_mode_is_no_task_s() {
    require_root();
    let (r, _) = record_alarms("cgroup");
    let stacks = stacks_from_timer(&r);
    let count: u64 = stacks.iter().map(|s| u(&s["count"])).sum();
    nearly_every("alarm", count, ALARMS, &r);
    for p in stacks
        .iter()
        .flat_map(|s| s["processes"].as_array().unwrap())
    {
        assert_eq!(p["interrupt"], true, "{p:#}");
    }
    let irq = r["cgroups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["interrupt"] == true)
        .expect("an interrupt row");
    assert!(u(&irq["count"]) >= count, "{irq:#}");
    stacks_blame_interrupts_on_no_process(&r, irq);

    // Traced by PID: the process's own allocations (its start) only.
    let r = record_json(&["--exact-stacks"], &["alarm-spin", &ALARMS.to_string()]);
    assert!(u(&r["totals"]["count"]) > 0, "{:#}", r["totals"]);
    assert_eq!(stacks_from_timer(&r), Vec::<Value>::new());
}

/// An interrupt that allocates while kheap's program is capturing a task's
/// stack on the same CPU (the kernel runs the interrupt's program inside
/// the task's) keeps its stack apart: each captures into its own scratch
/// buffer. With one buffer, the interrupt's frames were stored as the
/// task's stack (writev's kmalloc-192 events showed the timer's it_real_fn
/// frames, about 5 in 2000 alarms on this host). Two writev loops keep the
/// CPUs in kheap's program while the alarms fire.
#[test]
fn an_interrupt_in_a_capture_leaves_the_captured_stack_alone() {
    require_root();
    const MANY_ALARMS: u64 = 2000;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.json");
    #[rustfmt::skip]
    let mut kheap = Tracing::start(&[
        "record", "--exact-stacks", "--max-entries", "65536", "--kernel-memory", "256M",
        "--format", "json", "-o", out.to_str().unwrap(),
    ]);
    let loops = Loops(
        (0..2)
            .map(|_| {
                Command::new(LOAD)
                    .args(["writev", "1000000000"])
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect(),
    );
    let alarms = Command::new(LOAD)
        .args(["alarm-spin", &MANY_ALARMS.to_string()])
        .output()
        .unwrap();
    assert!(alarms.status.success(), "{alarms:?}");
    drop(loops);
    assert!(kheap.stop());
    let r = parse_valid(&std::fs::read_to_string(&out).unwrap());
    let stacks = stacks_from_timer(&r);
    let count: u64 = stacks.iter().map(|s| u(&s["count"])).sum();
    nearly_every("alarm", count, MANY_ALARMS, &r);
    // The signal's cache only (named as this kernel merges it): a writev
    // event stored under the timer's frames would add its kmalloc cache.
    let caches: std::collections::BTreeSet<&str> = stacks
        .iter()
        .map(|s| s["cache"].as_str().unwrap())
        .collect();
    assert_eq!(caches.len(), 1, "{stacks:#?}");
}

/// Load processes killed (and reaped) when dropped, as when a test fails.
struct Loops(Vec<std::process::Child>);

impl Drop for Loops {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `--by process` has the same interrupt row: the alarms' allocations are
/// not the interrupted process's. Its row holds what its stacks' entries
/// of its PID hold, none under it_real_fn, and the interrupt row what the
/// stacks' interrupt entries hold.
#[test]
fn by_process_puts_interrupt_allocations_in_their_own_row() {
    require_root();
    let (r, pid) = record_alarms("process");
    let rows = r["processes"].as_array().unwrap();
    let irq = interrupt_process_row(rows);
    let from_timer: u64 = stacks_from_timer(&r).iter().map(|s| u(&s["count"])).sum();
    nearly_every("alarm", from_timer, ALARMS, &r);
    assert!(u(&irq["count"]) >= from_timer, "{irq:#}");
    stacks_blame_interrupts_on_no_process(&r, irq);

    let mine = rows
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("no row of alarm-spin [{pid}]: {rows:#?}"));
    assert_eq!(mine["interrupt"], false);
    let shares: Vec<&Value> = r["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["processes"].as_array().unwrap())
        .filter(|p| p["pid"] == pid)
        .collect();
    assert_eq!(
        (u(&mine["count"]), u(&mine["bytes_alloc"])),
        (
            shares.iter().map(|p| u(&p["count"])).sum(),
            shares.iter().map(|p| u(&p["bytes_alloc"])).sum()
        ),
        "the process row vs its stacks' entries: {mine:#}"
    );
    for s in stacks_from_timer(&r) {
        for p in s["processes"].as_array().unwrap() {
            assert_eq!(p["interrupt"], true, "{p:#}");
        }
    }
}

/// leaks `--by process`: objects allocated in interrupt context and still
/// held (a pending SIGALRM's `sigqueue` in each of HELD children, allocated
/// by the timer's interrupt) are in the interrupt row, not in the rows of
/// the processes the interrupt hit. With every stack kept, each row holds
/// exactly what the stacks' entries of the same owner hold; with sampled
/// stacks (most objects have none), the row is still there: each
/// allocation's context is tested, not only a sampled stack's.
#[test]
fn leaks_by_process_holds_interrupt_objects_in_their_own_row() {
    require_root();
    let r = leaks_alarms_pending(&["--exact-stacks"]);
    let rows = r["leaks"]["processes"].as_array().unwrap();
    let irq = interrupt_process_row(rows);
    let held_by_timer: u64 = stacks_from_timer(&r)
        .iter()
        .flat_map(|s| s["processes"].as_array().unwrap())
        .map(|p| {
            assert_eq!(p["interrupt"], true, "{p:#}");
            u(&p["outstanding_count"])
        })
        .sum();
    // Before the interrupt row the children's rows held them.
    nearly_every("held alarm", held_by_timer, HELD, &r);
    assert!(u(&irq["outstanding_count"]) >= held_by_timer, "{irq:#}");
    // Each row, the interrupt row among them, holds what the stacks'
    // entries of its owner hold.
    let entries: Vec<&Value> = r["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["processes"].as_array().unwrap())
        .collect();
    for row in rows {
        let held: u64 = entries
            .iter()
            .filter(|p| p["pid"] == row["pid"] && p["interrupt"] == row["interrupt"])
            .map(|p| u(&p["outstanding_count"]))
            .sum();
        assert_eq!(u(&row["outstanding_count"]), held, "{row:#}");
    }

    let r = leaks_alarms_pending(&[]);
    let irq = interrupt_process_row(r["leaks"]["processes"].as_array().unwrap());
    nearly_every("held alarm", u(&irq["outstanding_count"]), HELD, &r);
    assert!(u(&irq["outstanding_count"]) <= u(&r["leaks"]["outstanding_count"]));
}

/// Held `sigqueue` objects of `kheap-load alarm-pending`.
const HELD: u64 = 40;

/// `leaks --by process EXTRA` of the whole machine, reported while HELD
/// children of `kheap-load alarm-pending` hold their signals.
fn leaks_alarms_pending(extra: &[&str]) -> Value {
    use std::io::{BufRead as _, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("l.json");
    #[rustfmt::skip]
    let mut args = vec![
        "leaks", "--by", "process", "--max-entries", "65536", "--kernel-memory", "256M",
        "--format", "json", "-o", out.to_str().unwrap(),
    ];
    args.extend(extra);
    let mut kheap = Tracing::start(&args);
    // Its children exit when its stdin ends, as when this test fails.
    let mut load = Command::new(LOAD)
        .args(["alarm-pending", &HELD.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    BufReader::new(load.stdout.take().unwrap())
        .read_line(&mut said)
        .unwrap();
    assert_eq!(said.trim(), format!("{HELD} pending"));
    assert!(kheap.stop());
    drop(load.stdin.take());
    assert!(load.wait().unwrap().success());
    let r = parse_valid(&std::fs::read_to_string(&out).unwrap());
    assert_eq!(
        (u(&r["lost"]["stacks"]), u(&r["lost"]["map_full_stacks"])),
        (0, 0),
        "every stack kept: {:#}",
        r["lost"]
    );
    r
}

/// The one interrupt row of process rows, which names no process.
fn interrupt_process_row(rows: &[Value]) -> &Value {
    let irq: Vec<&Value> = rows.iter().filter(|p| p["interrupt"] == true).collect();
    assert_eq!(irq.len(), 1, "one interrupt row: {rows:#?}");
    assert!(
        irq[0]["pid"].is_null() && irq[0]["comm"].is_null() && irq[0]["cgroup"].is_null(),
        "{:#}",
        irq[0]
    );
    irq[0]
}

const ALARMS: u64 = 300;

/// Checks that `counted` of the `load`'s `expected` allocations (alarms'
/// `sigqueue` objects) were seen: nearly all of them, and says on stderr
/// what the report lost when one is missing. The interrupt-row tests
/// compare rows with each other exactly; against the load they allow a
/// few missing: an alarm that interrupts a task inside a BPF system call
/// (another BPF agent's, or kheap's own map reads) may reach no program
/// and no counter (docs/design/numbers.md; one CI run counted 299 of 300).
/// Before the interrupt row, none was counted.
fn nearly_every(load: &str, counted: u64, expected: u64, r: &Value) {
    if counted < expected {
        eprintln!(
            "kheap test: {counted} of {expected} {load}s counted; lost: {}",
            r["lost"]
        );
    }
    assert!(
        counted >= expected * 9 / 10,
        "{counted} of {expected} {load}s: lost {:#}",
        r["lost"]
    );
}

/// The stack rows under it_real_fn: the alarms' allocations.
fn stacks_from_timer(r: &Value) -> Vec<Value> {
    r["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| frames(s).iter().any(|f| f.starts_with("it_real_fn+")))
        .cloned()
        .collect()
}

/// `record --by BY --exact-stacks` of the whole machine around
/// `kheap-load alarm-spin`: the report and the load's PID.
fn record_alarms(by: &str) -> (Value, u32) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.json");
    #[rustfmt::skip]
    let mut kheap = Tracing::start(&[
        "record", "--by", by, "--exact-stacks", "--max-entries", "65536", "--kernel-memory", "256M",
        "--format", "json", "-o", out.to_str().unwrap(),
    ]);
    let load = Command::new(LOAD)
        .args(["alarm-spin", &ALARMS.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = load.id();
    let load = load.wait_with_output().unwrap();
    assert!(load.status.success(), "{load:?}");
    assert!(kheap.stop());
    (parse_valid(&std::fs::read_to_string(&out).unwrap()), pid)
}

/// Runs `record --by cgroup EXTRA` around loopback TCP traffic and checks
/// its rows: one interrupt row, and the sends in the test's own cgroup.
fn interrupt_rows(extra: &[&str]) -> Value {
    use std::io::{Read, Write as _};
    use std::net::{TcpListener, TcpStream};
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.json");
    // Every stack, with room for every (stack, process, cgroup) of the
    // machine: the stacks' interrupt share is then the interrupt row.
    #[rustfmt::skip]
    let mut args = vec![
        "record", "--by", "cgroup", "--exact-stacks", "--max-entries", "65536", "--kernel-memory", "256M",
        "--format", "json", "-o", out.to_str().unwrap(),
    ];
    args.extend(extra);
    let mut kheap = Tracing::start(&args);
    // In a network namespace of its own (its loopback brought up there),
    // so the test needs no host network set-up and leaves none behind: the
    // namespace ends with the thread.
    std::thread::spawn(|| {
        assert_eq!(
            unsafe { libc::unshare(libc::CLONE_NEWNET) },
            0,
            "unshare(CLONE_NEWNET)"
        );
        loopback_up();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let mut buf = [0u8; 4096];
        for _ in 0..5000 {
            client.write_all(&[7u8; 1000]).unwrap();
            let mut got = 0;
            while got < 1000 {
                got += server.read(&mut buf).unwrap();
            }
        }
    })
    .join()
    .unwrap();
    assert!(kheap.stop());
    let r = parse_valid(&std::fs::read_to_string(&out).unwrap());
    let rows = r["cgroups"].as_array().unwrap();
    let irq: Vec<&Value> = rows.iter().filter(|c| c["interrupt"] == true).collect();
    assert_eq!(irq.len(), 1, "one interrupt row: {rows:#?}");
    assert!(irq[0]["cgroup"].is_null());
    assert!(u(&irq[0]["count"]) > 0);
    // Task rows are never flagged, and each has a cgroup; the sends
    // (tcp_sendmsg's skbs) are the test's own, in its cgroup.
    for c in rows.iter().filter(|c| c["interrupt"] == false) {
        assert!(c["cgroup"]["id"].is_u64(), "{c:#}");
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let own = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("a cgroup v2 line in /proc/self/cgroup");
    let mine = cgroup_row(&r, own);
    assert!(
        u(&mine["count"]) >= 5000,
        "the sends are the test's: {mine:#}"
    );
    stacks_blame_interrupts_on_no_process(&r, irq[0]);
    r
}

/// The stacks' interrupt entries have no process and no cgroup, and with
/// every stack kept they add up to the interrupt row exactly (the same test
/// of context on the same events); no process entry is flagged.
fn stacks_blame_interrupts_on_no_process(r: &Value, irq_row: &Value) {
    assert_eq!(
        (u(&r["lost"]["stacks"]), u(&r["lost"]["map_full_stacks"])),
        (0, 0),
        "every stack kept: {:#}",
        r["lost"]
    );
    let entries = r["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["processes"].as_array().expect("stack processes"));
    let (mut count, mut bytes) = (0, 0);
    for p in entries {
        if p["interrupt"] == true {
            assert!(
                p["pid"].is_null() && p["comm"].is_null() && p["cgroup"].is_null(),
                "{p:#}"
            );
            count += u(&p["count"]);
            bytes += u(&p["bytes_alloc"]);
        } else {
            assert!(p["pid"].is_u64() && p["cgroup"]["id"].is_u64(), "{p:#}");
        }
    }
    assert_eq!(
        (count, bytes),
        (u(&irq_row["count"]), u(&irq_row["bytes_alloc"])),
        "interrupt entries of the stacks vs the interrupt row"
    );
}

/// Brings up `lo` in the calling thread's network namespace.
fn loopback_up() {
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        assert!(fd >= 0, "socket");
        let mut req: libc::ifreq = std::mem::zeroed();
        for (d, s) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *d = *s as libc::c_char;
        }
        assert_eq!(
            libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req),
            0,
            "SIOCGIFFLAGS lo"
        );
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        assert_eq!(
            libc::ioctl(fd, libc::SIOCSIFFLAGS, &req),
            0,
            "SIOCSIFFLAGS lo"
        );
        libc::close(fd);
    }
}

/// `top --by cgroup`: per-interval rows whose counts add up to each
/// cgroup's workload, every interval naming the cgroup by its path.
#[test]
fn top_by_cgroup_intervals_add_up_to_each_workload() {
    require_root();
    let a = TestCgroup::top("ta");
    let b = TestCgroup::top("tb");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("top.jsonl");
    let mut kheap = Tracing::start(&[
        "top",
        "-b",
        "--by",
        "cgroup",
        "--cgroup",
        a.path(),
        "--cgroup",
        b.path(),
        "--min-size",
        REQ,
        "--max-size",
        REQ,
        "-i",
        "1",
        "-d",
        "4",
        "--format",
        "json",
        "-o",
        out.to_str().unwrap(),
    ]);
    run_in(&a, &["writev", "400"]);
    run_in(&b, &["msg", "300", "96"]);
    assert!(kheap.wait());
    let text = std::fs::read_to_string(&out).unwrap();
    let (mut in_a, mut in_b) = (0, 0);
    for iv in text.lines().map(parse_valid) {
        for row in iv["cgroups"].as_array().unwrap() {
            let path = row["cgroup"]["path"]
                .as_str()
                .unwrap_or_else(|| panic!("unnamed: {row:#}"));
            if path == a.rel() {
                in_a += u(&row["count"]);
                assert_eq!(u(&row["unaccounted_count"]), u(&row["count"]));
            } else if path == b.rel() {
                in_b += u(&row["count"]);
            } else {
                panic!("a row of neither cgroup: {row:#}");
            }
        }
    }
    assert_eq!((in_a, in_b), (400, 300), "{text}");
}

/// `leaks --by cgroup`: each cgroup's outstanding objects and bytes, what it
/// allocated and freed, the split by memory-cgroup charging, and the cgroup
/// of each process that holds them. A holds 300 messages; B wrote 700
/// iovec arrays (all freed) and holds 200 messages. kheap stops while both
/// still hold theirs.
#[test]
fn leaks_by_cgroup_shows_what_each_cgroup_holds() {
    require_root();
    // kmalloc's object for 144 bytes: 192 on x86-64.
    let obj = kmalloc_object_size(144);
    let a = TestCgroup::top("la");
    let b = TestCgroup::top("lb");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("leaks.json");
    let mut kheap = Tracing::start(&[
        "leaks",
        "--by",
        "cgroup",
        "--cgroup",
        a.path(),
        "--cgroup",
        b.path(),
        "--min-size",
        REQ,
        "--max-size",
        REQ,
        "--format",
        "json",
        "-o",
        out.to_str().unwrap(),
    ]);
    let mut held_a = Workload::start_in(&a, &["msg", "300", "96", "60"]);
    held_a.wait_holding();
    run_in(&b, &["writev", "700"]);
    let mut held_b = Workload::start_in(&b, &["msg", "200", "96", "60"]);
    held_b.wait_holding();
    assert!(kheap.stop(), "kheap leaks failed");
    let (pid_a, pid_b) = (held_a.child.id(), held_b.child.id());
    drop((held_a, held_b));

    let r = parse_valid(&std::fs::read_to_string(&out).expect("kheap wrote no report"));
    assert_eq!(r["kind"], "leaks");
    let rows = r["cgroups"].as_array().expect("cgroups list");
    assert_eq!(rows.len(), 2, "only A and B ran anything: {rows:#?}");
    let accounting = msg_accounting_visible(&r);
    for (cg, held, freed) in [(&a, 300, 0), (&b, 200, 700)] {
        let row = cgroup_row(&r, &cg.rel());
        let what = format!("{}: {row:#}", cg.rel());
        assert_eq!(u(&row["count"]), held + freed, "allocated: {what}");
        assert_eq!(u(&row["outstanding_count"]), held, "held: {what}");
        assert_eq!(u(&row["outstanding_bytes"]), held * obj, "{what}");
        assert_eq!(u(&row["outstanding_bytes_req"]), held * 144, "{what}");
        assert_eq!(u(&row["freed_count"]), freed, "{what}");
        assert_eq!(u(&row["freed_bytes"]), freed * obj, "{what}");
        // The iovec arrays are never charged, the messages always are.
        if accounting {
            assert_eq!(u(&row["outstanding_accounted_count"]), held, "{what}");
            assert_eq!(u(&row["outstanding_accounted_bytes"]), held * obj);
            assert_eq!(u(&row["outstanding_unaccounted_count"]), 0, "{what}");
            assert_eq!(u(&row["accounted_count"]), held, "{what}");
            assert_eq!(u(&row["unaccounted_count"]), freed, "{what}");
        }
        assert_eq!(row["interrupt"], false);
    }
    if !accounting {
        partial_check(
            "this kernel allocates msg_msg from SLAB_ACCOUNT buckets that its kmalloc events do not name, and kheap cannot find its objects' slabs here (the report says why): the outstanding accounting split not checked",
        );
    }
    // The processes holding them carry their cgroup.
    let procs = r["leaks"]["processes"].as_array().unwrap();
    for (pid, cg, held) in [(pid_a, &a, 300), (pid_b, &b, 200)] {
        let p = procs
            .iter()
            .find(|p| u(&p["pid"]) == u64::from(pid))
            .unwrap_or_else(|| panic!("no process row for {pid}: {procs:#?}"));
        assert_eq!(
            p["cgroup"]["path"].as_str(),
            Some(cg.rel().as_str()),
            "{p:#}"
        );
        assert_eq!(u(&p["outstanding_count"]), held, "{p:#}");
    }
    assert_eq!(u(&r["leaks"]["outstanding_count"]), 300 + 200);
}

/// `malloc --cgroup A`: the processes in A are traced, and only allocations
/// made in A count, even of a process also given by PID (B's). Every
/// process entry names its cgroup.
#[test]
fn malloc_cgroup_counts_only_that_cgroup_and_names_it() {
    require_root();
    let a = TestCgroup::top("ma");
    let b = TestCgroup::top("mb");
    let mut in_a = Workload::spawn_in(&a, &["malloc", "3000", "100"]);
    let mut in_b = Workload::spawn_in(&b, &["malloc", "2000", "100"]);
    let (pid_a, pid_b) = (in_a.child.id(), in_b.child.id());
    if malloc_refused_here(
        "malloc_cgroup_counts_only_that_cgroup_and_names_it",
        &["--cgroup", a.path(), "-p", &pid_b.to_string(), "-d", "1"],
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("malloc.json");
    let err_path = dir.path().join("malloc.err");
    let pid_b_arg = pid_b.to_string();
    // Its stderr goes to a file, to be shown if it fails.
    let mut kheap = Tracing(
        Command::new(KHEAP)
            .args([
                "malloc",
                "--cgroup",
                a.path(),
                "-p",
                &pid_b_arg,
                "--format",
                "json",
                "-o",
                out.to_str().unwrap(),
            ])
            .stderr(std::fs::File::create(&err_path).unwrap())
            .spawn()
            .expect("starting kheap malloc"),
    );
    let stderr = || std::fs::read_to_string(&err_path).unwrap_or_default();
    let started = poll_until(HANG_LIMIT, || {
        assert!(
            kheap.0.try_wait().unwrap().is_none(),
            "kheap malloc ended: {}",
            stderr()
        );
        stderr().contains("tracing")
    });
    assert!(started, "kheap malloc did not start: {}", stderr());
    in_a.go();
    in_b.go();
    in_a.finish();
    in_b.finish();
    // It ends by itself once the processes it traces have exited.
    assert!(kheap.wait(), "kheap malloc failed: {}", stderr());
    let r = parse_valid(&std::fs::read_to_string(&out).expect("kheap wrote no report"));
    assert_eq!(r["kind"], "malloc");
    // A call whose return address kheap could not read is counted under
    // `[caller unreadable]` and in `lost.caller_unreadable` (issue 48), never
    // under a guessed caller: A's 3000 are in the two, exactly.
    let rows: Vec<&Value> = r["sites"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| {
            let f = s["function"].as_str().unwrap();
            s["allocator"] == "malloc" && (f.contains("malloc_free") || f == "[caller unreadable]")
        })
        .collect();
    let unreadable: u64 = r["sites"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["function"] == "[caller unreadable]")
        .map(|s| u(&s["count"]))
        .sum();
    assert_eq!(
        unreadable,
        u(&r["lost"]["caller_unreadable"]),
        "{:#}",
        r["lost"]
    );
    assert_eq!(
        rows.iter().map(|s| u(&s["count"])).sum::<u64>(),
        3000,
        "A's 3000 calls (PID {pid_a}), none of B's (PID {pid_b}): {rows:#?}\nevery site: {:?}\nlost: {:#}\nheader: {:#}",
        r["sites"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (
                s["allocator"].clone(),
                s["function"].clone(),
                s["count"].clone(),
                s["processes"].clone()
            ))
            .collect::<Vec<_>>(),
        r["lost"],
        r["run"]
    );
    for row in r["sites"].as_array().unwrap() {
        for p in row["processes"].as_array().unwrap() {
            assert_ne!(u(&p["pid"]), u64::from(pid_b), "B counted: {row:#}");
            assert_eq!(
                u(&p["pid"]),
                u64::from(pid_a),
                "a row of a process other than A's {pid_a} (B is {pid_b}): {row:#}\nlost: {:#}\nheader: {:#}\nstderr: {}",
                r["lost"],
                r["run"],
                stderr()
            );
            assert_eq!(
                p["cgroup"]["path"].as_str(),
                Some(a.rel().as_str()),
                "{p:#}"
            );
        }
    }
    assert!(
        r["run"]["filters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f.as_str() == Some(&format!("cgroup {}", a.rel()))),
        "{:#}",
        r["run"]["filters"]
    );
}
