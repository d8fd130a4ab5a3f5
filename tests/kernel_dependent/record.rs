//! `kheap record` against the real kernel: known allocation patterns driven
//! by kheap-load, exact numbers asserted.

use crate::common;

use std::os::unix::process::CommandExt;
use std::process::Command;

use common::*;

/// SysV messages: each msgsnd of SIZE bytes is one kmalloc of 48 + SIZE
/// bytes (struct msg_msg + text) in load_msg.
const MSG_HEADER: u64 = 48;

fn assert_msg_site(report: &serde_json::Value, count: u64, size: u64) {
    let sites = rows_of_fn(report, "sites", msg_fn());
    assert_eq!(
        sites.len(),
        1,
        "one load_msg site expected: {:#}",
        report["sites"]
    );
    let s = sites[0];
    let req = MSG_HEADER + size;
    assert_eq!(u(&s["count"]), count, "exact site count");
    assert_eq!(u(&s["bytes_req"]), count * req);
    assert_eq!(
        u(&s["bytes_alloc"]),
        count * 4096,
        "2148 bytes round up to 4k"
    );
    assert_eq!(u(&s["waste_bytes"]), count * (4096 - req));
    let hist = s["hist"].as_array().unwrap();
    assert_eq!(hist.len(), 1, "one bucket: {hist:?}");
    assert_eq!(
        (u(&hist[0]["lo"]), u(&hist[0]["hi"]), u(&hist[0]["count"])),
        (2048, 4096, count)
    );
}

#[test]
fn msgsnd_sites_are_exact_with_sampled_stacks() {
    require_root();
    let r = record_json(&[], &["msg", "3000", "2100"]);
    assert_msg_site(&r, 3000, 2100);
    assert_eq!(r["sampling"]["stack_sample_every"], 1024);
    assert_eq!(r["sampling"]["stacks_estimated"], true);
    // Each site's first allocation and about 1 in 1024 after it capture a
    // stack (3000 events: a few samples); the estimate is scaled to the
    // exact total, so the stacks of the site add up to it.
    let stacks = rows_of_fn(&r, "stacks", msg_fn());
    assert!(
        !stacks.is_empty(),
        "no sampled load_msg stack: {:#}",
        r["stacks"]
    );
    let total: u64 = stacks.iter().map(|s| u(&s["count"])).sum();
    assert!(
        (2990..=3010).contains(&total),
        "scaled stacks sum to {total}"
    );
    assert!(stacks.iter().all(|s| s["estimated"] == true));
    assert!(u(&r["totals"]["count"]) >= 3000);
    assert!(
        u(&r["totals"]["frees"]) >= 3000,
        "msgrcv frees every message"
    );
}

#[test]
fn exact_stacks_attribute_every_allocation() {
    require_root();
    let r = record_json(&["--exact-stacks"], &["msg", "1000", "2100"]);
    assert_msg_site(&r, 1000, 2100);
    // Stacks are stored by the hash of their frames: no stack can lose its
    // bucket to another (a stack-trace map lost load_msg's stack in about
    // one run in 200).
    assert_eq!(u(&r["lost"]["stack_collisions"]), 0, "{:#}", r["lost"]);
    let stacks = rows_of_fn(&r, "stacks", msg_fn());
    assert_eq!(stacks.len(), 1, "{:#}", r["stacks"]);
    let s = stacks[0];
    assert_eq!(s["estimated"], false);
    // Every allocation's stack is taken; only a failed capture (counted in
    // lost.stacks, which covers all sites) may be missing.
    let (count, lost) = (u(&s["count"]), u(&r["lost"]["stacks"]));
    if lost == 0 {
        assert_eq!(count, 1000);
    } else {
        assert!(
            count <= 1000 && count + lost >= 1000,
            "count {count}, lost {lost}"
        );
    }
    let frames = frames(s);
    assert!(
        frames[0].starts_with("__kmalloc"),
        "innermost frame is the allocator: {frames:?}"
    );
    let pos = |name: &str| {
        frames
            .iter()
            .position(|f| f.starts_with(&format!("{name}+0x")))
    };
    assert!(
        pos(msg_fn()) < pos("do_msgsnd") && pos(msg_fn()).is_some(),
        "{frames:?}"
    );
}

#[test]
fn writev_iovec_array_lands_in_kmalloc_192() {
    require_root();
    let r = record_json(&[], &["writev", "20000"]);
    let sites = rows_of_fn(&r, "sites", "iovec_from_user");
    assert_eq!(sites.len(), 1, "{:#}", r["sites"]);
    let s = sites[0];
    assert_eq!(u(&s["count"]), 20000);
    assert_eq!(u(&s["bytes_req"]), 20000 * 144, "9 iovecs of 16 bytes");
    assert_eq!(u(&s["bytes_alloc"]), 20000 * 192);
    assert_eq!(s["caches"][0], "kmalloc-192");
    assert_eq!(u(&s["hist"][0]["lo"]), 128);
}

#[test]
fn every_attach_mechanism_gives_the_same_numbers() {
    require_root();
    let mut load_msg_caches = Vec::new();
    for (mode, shown) in [
        ("tracepoint", "tracepoint"),
        ("raw", "raw_tp"),
        ("auto", ""),
    ] {
        let r = record_json(&["--attach", mode], &["msg", "500", "2100"]);
        assert_msg_site(&r, 500, 2100);
        let attach = attach_line(&r, "kmalloc");
        assert!(attach.contains(shown), "{mode}: {attach}");
        // Dedicated caches are told apart from kmalloc: by name (tp_btf and
        // raw_tp read struct kmem_cache; classic records carry it since
        // 6.18) or, on older classic layouts, by object size.
        let names: Vec<&str> = r["caches"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert!(
            names.iter().any(|n| !n.starts_with("kmalloc")),
            "{mode}: {names:?}"
        );
        if mode != "tracepoint" {
            assert!(
                names.iter().all(|n| !n.starts_with("cache-of-")),
                "{mode}: {names:?}"
            );
        }
        // The cache kmalloc really used (msg_msg-4k from 6.11 on) is found
        // the same way whatever the programs are attached with.
        let caches = rows_of_fn(&r, "sites", msg_fn())[0]["caches"].clone();
        load_msg_caches.push((mode, caches));
    }
    let (first, caches) = &load_msg_caches[0];
    for (mode, other) in &load_msg_caches[1..] {
        assert_eq!(other, caches, "load_msg's cache: {mode} against {first}");
    }
}

/// Each CPU counts sites in slots of its own, and sites that find no free
/// slot in the site map (bpf/kheap/site_slots.c): with 8 slots per CPU
/// (--max-entries 64) the 40-odd sites of a kheap-load run cannot all have
/// slots on a machine of up to 4 CPUs, yet every site adds up exactly.
#[test]
fn sites_add_up_across_slots_and_the_site_map() {
    require_root();
    // Run once untraced first: the first exec of kheap-load in a freshly
    // booted guest reads it over 9p, and those first reads alone allocate
    // from more than 64 sites (seen when this test ran first after boot:
    // 1144 allocations lost to a full site map), which is the test
    // machine's, not the 40-odd sites this test is about.
    let warm = Command::new(LOAD)
        .args(["msg", "1", "2100"])
        .output()
        .expect("running kheap-load");
    assert!(warm.status.success(), "{warm:?}");
    let r = record_json(&["--max-entries", "64"], &["msg", "1000", "2100"]);
    assert_eq!(u(&r["lost"]["map_full_sites"]), 0, "{}", r["lost"]);
    assert_msg_site(&r, 1000, 2100);
    let sites = r["sites"].as_array().unwrap();
    let counted: u64 = sites.iter().map(|s| u(&s["count"])).sum();
    assert_eq!(counted, u(&r["totals"]["count"]), "{}", r["totals"]);
    assert!(
        sites.len() > 16,
        "{} sites: too few to need the map",
        sites.len()
    );
}

/// Every mode's programs pass the verifier, unfiltered (a filter lets the
/// verifier drop paths: `leaks --by cgroup` alone once went over its limit
/// of a million instructions while the filtered tests passed). From 6.13
/// on they are the typed programs (tp_btf): a mode whose typed programs
/// the verifier refused would fall back to raw_tp with the same numbers,
/// unseen by every other test. Before 6.13 the kernel refuses tp_btf
/// (5.10, 6.1 and 6.12 do), and kheap knows it from a small probe program
/// before it loads its whole object for nothing.
#[test]
fn programs_load_in_every_mode() {
    require_root();
    for (cmd, args) in [
        ("record", &[][..]),
        ("record", &["--exact-stacks"]),
        ("record", &["--by", "process"]),
        ("record", &["--by", "cgroup"]),
        ("leaks", &[]),
        ("leaks", &["--by", "cgroup"]),
        ("leaks", &["--by", "process"]),
    ] {
        let r = report_json(cmd, args, &["msg", "10", "100"]);
        assert_typed_programs(&format!("{cmd} {args:?}"), &r["run"]);
    }
    // top (and slab) also count kfree() frees per cache.
    let out = kheap(&["top", "-b", "-i", "1", "-n", "1", "--format", "json"]);
    assert!(out.status.success(), "{out:?}");
    let top: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_typed_programs("top", &top["run"]);
}

fn assert_typed_programs(what: &str, run: &serde_json::Value) {
    let hooks = run["attach"].as_array().unwrap();
    assert!(!hooks.is_empty(), "{what}: {run:#}");
    if kernel_before(6, 13) {
        let skipped = run["skipped"].to_string();
        assert!(
            skipped.contains(
                "tp_btf: refused by this kernel (its verifier refuses a typed read of \
                 kmalloc's `const void *ptr`, which Linux 6.13 accepts); raw_tp used instead"
            ),
            "{what}: {run:#}"
        );
        return;
    }
    assert_eq!(run["skipped"], serde_json::json!([]), "{what}: {run:#}");
    for hook in hooks {
        let hook = hook.as_str().unwrap();
        // The interrupt brackets read no argument: raw_tp everywhere.
        let want = if hook.starts_with("interrupts: ") {
            ": raw_tp on "
        } else {
            ": tp_btf"
        };
        assert!(hook.contains(want), "{what}: {hook}");
    }
}

#[test]
fn size_filter_and_process_view() {
    require_root();
    let r = record_json(
        &[
            "--min-size",
            "2000",
            "--max-size",
            "2200",
            "--by",
            "process",
        ],
        &["msg", "200", "2100"],
    );
    for s in r["sites"].as_array().unwrap() {
        let avg = u(&s["bytes_req"]) / u(&s["count"]);
        assert!((2000..=2200).contains(&avg), "outside the size range: {s}");
    }
    assert_msg_site(&r, 200, 2100);
    let procs = rows(&r, "processes", "comm", "kheap-load");
    assert_eq!(procs.len(), 1, "{:#}", r["processes"]);
    // The process row is every allocation of the command in the range:
    // its messages, and whatever else it made there (in the 5.10 guest,
    // 22 virtio buffers of 2016 bytes, virtqueue_add_split, when reading
    // its files over 9p). Exactly the sites' counts.
    let sites: u64 = r["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| u(&s["count"]))
        .sum();
    assert_eq!(u(&procs[0]["count"]), sites, "{:#}", r["sites"]);
}

#[test]
fn folded_and_table_output() {
    require_root();
    let out = kheap(&[
        "record",
        "--exact-stacks",
        "--format",
        "folded",
        "--",
        LOAD,
        "msg",
        "100",
        "2100",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l.contains("do_msgsnd;load_msg;")
            && l.contains(&format!("{};__kmalloc", msg_fn()))
            && l.ends_with(" 100")),
        "{text}"
    );
    // Only the messages' size (2100 bytes and msg_msg's 48-byte header):
    // the table shows three stacks, and where the command's files are read
    // over 9p (the guests) its 512 KiB 9p buffers can take all three.
    let size = ["--min-size", "2148", "--max-size", "2148"];
    let out = kheap(&[&["record"][..], &size, &["--", LOAD, "msg", "100", "2100"]].concat());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("{}+0x", msg_fn())), "{text}");
    assert!(text.contains("47.6%"), "waste of 2148 in 4096: {text}");
    // A stack row says which process made it.
    assert!(
        text.lines().any(|l| l.starts_with('#')
            && l.contains(&format!(" {} ", msg_fn()))
            && l.contains("; by kheap-load [")),
        "{text}"
    );
    assert!(
        text.contains("stacks: sampled 1 in 1024 (and each site's first"),
        "{text}"
    );
}

fn stop_and_check(signal: i32) {
    let child = spawn_tracing(&["record"]);
    let pid = child.id();
    let progs = bpf_prog_ids(pid);
    assert!(
        progs.len() >= 4,
        "kheap should hold its programs: {progs:?}"
    );
    let load = Command::new(LOAD)
        .args(["msg", "300", "2100"])
        .output()
        .unwrap();
    assert!(load.status.success());
    unsafe { libc::kill(pid as i32, signal) };
    let out = wait_bounded(child, HANG_LIMIT);
    assert!(out.status.success(), "exit status {:?}", out.status);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains(&format!("{}+0x", msg_fn())),
        "report printed after the signal: {report}"
    );
    assert_unloaded(&progs, "after kheap exited");
}

#[test]
fn ctrl_c_prints_the_report_and_detaches() {
    require_root();
    stop_and_check(libc::SIGINT);
}

#[test]
fn sigterm_prints_the_report_and_detaches() {
    require_root();
    stop_and_check(libc::SIGTERM);
}

/// A bad invocation: one line on stderr, non-zero exit.
fn assert_one_line_error(out: &std::process::Output, expect: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "should fail: {err}");
    assert!(err.contains(expect), "expected '{expect}' in: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(out.stdout.is_empty(), "no report on error");
}

#[test]
fn bad_input_gives_one_line_errors() {
    require_root();
    assert_one_line_error(
        &kheap(&["record", "-p", "3999999"]),
        "no process with PID 3999999",
    );
    assert_one_line_error(
        &kheap(&["record", "--", "kheap-no-such-command"]),
        "command not found",
    );
    assert_one_line_error(
        &kheap(&["record", "--min-size", "100", "--max-size", "10", "-d", "1"]),
        "bad size range",
    );
    let out = Command::new(KHEAP)
        .args(["record", "-d", "1"])
        .env("KHEAP_BTF", "/nonexistent/vmlinux")
        .output()
        .unwrap();
    assert_one_line_error(&out, "no BTF");
    let out = Command::new(KHEAP)
        .args(["record", "-d", "1"])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert_one_line_error(&out, "needs root");
}

/// Runs `kheap ARGS` in a mount namespace of its own in which tracefs is not
/// mounted, so kheap has to mount it itself whatever the rest of the machine
/// (another tracer, say) does with tracefs. Returns kheap's output and
/// whether tracefs was still mounted in that namespace after kheap exited.
fn kheap_without_tracefs(args: &[&str]) -> (std::process::Output, bool) {
    use std::ffi::CString;
    // After kheap: one last line saying whether tracefs is mounted.
    const SCRIPT: &str = r#"
        if grep -q ' /sys/kernel/tracing ' /proc/self/mounts; then
            echo 'tracefs was mounted before kheap ran' >&2; exit 97
        fi
        "$@"; rc=$?
        if grep -q ' /sys/kernel/tracing ' /proc/self/mounts; then
            echo 'tracefs: mounted'; else echo 'tracefs: not mounted'; fi
        exit $rc"#;
    let sys = CString::new("/sys").unwrap();
    // debugfs too: kheap would find tracefs at /sys/kernel/debug/tracing.
    let mounts = [
        CString::new("/sys/kernel/tracing").unwrap(),
        CString::new("/sys/kernel/debug").unwrap(),
    ];
    let mut cmd = Command::new("sh");
    cmd.args(["-c", SCRIPT, "sh", KHEAP]).args(args);
    // Between fork and exec only system calls: a private copy of the mount
    // table, nothing propagated back to the machine's, tracefs and debugfs
    // detached from the copy.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0
                || libc::mount(
                    std::ptr::null(),
                    sys.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            for path in &mounts {
                // Stacked mounts come off one at a time.
                while libc::umount2(path.as_ptr(), libc::MNT_DETACH) == 0 {}
            }
            Ok(())
        });
    }
    let out = wait_bounded(
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("starting kheap in a mount namespace of its own"),
        HANG_LIMIT,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let still_mounted = match stdout.lines().last() {
        Some("tracefs: mounted") => true,
        Some("tracefs: not mounted") => false,
        _ => panic!(
            "no tracefs line after kheap {args:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        ),
    };
    (out, still_mounted)
}

#[test]
fn mounts_tracefs_itself_and_restores_it() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    let (out, still_mounted) = kheap_without_tracefs(&[
        "record",
        "--attach",
        "tracepoint",
        "--format",
        "json",
        "-o",
        path.to_str().unwrap(),
        "--",
        LOAD,
        "msg",
        "50",
        "2100",
    ]);
    assert_ok(&out);
    // Classic tracepoints are found and attached through tracefs, so these
    // numbers came through the tracefs kheap mounted.
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(
        attach_line(&r, "kmalloc").contains("tracepoint"),
        "{}",
        r["run"]["attach"]
    );
    assert_msg_site(&r, 50, 2100);
    assert!(
        !still_mounted,
        "kheap should unmount the tracefs it mounted"
    );
}

#[test]
fn latency_is_measured_or_refused_in_one_line() {
    require_root();
    let kprobes = std::path::Path::new("/sys/bus/event_source/devices/kprobe").exists();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.json");
    let out = kheap(&[
        "record",
        "--latency",
        "--format",
        "json",
        "-o",
        path.to_str().unwrap(),
        "--",
        LOAD,
        "msg",
        "300",
        "2100",
    ]);
    if out.status.success() {
        let r: serde_json::Value = parse_valid(&std::fs::read_to_string(&path).unwrap());
        let rows = rows_of_fn(&r, "latency", msg_fn());
        assert!(
            !rows.is_empty(),
            "no latency row for load_msg: {:#}",
            r["latency"]
        );
        let calls: u64 = rows.iter().map(|l| u(&l["count"])).sum();
        assert_eq!(calls, 300, "one timed allocator call per message");
        assert!(rows
            .iter()
            .all(|l| l["allocator"].as_str().unwrap().contains("kmalloc")));
        let hist_total: u64 = rows
            .iter()
            .flat_map(|l| l["hist"].as_array().unwrap().iter().map(|b| u(&b["count"])))
            .sum();
        assert_eq!(hist_total, 300);
    } else if kernel_before(5, 15) {
        // Its programs read the probed function with bpf_get_func_ip.
        assert_one_line_error(
            &out,
            "--latency needs the BPF helper bpf_get_func_ip (Linux 5.15)",
        );
    } else {
        assert!(
            !kprobes,
            "kprobes exist, so --latency must work: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("cannot time the allocator"), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(!path.exists(), "no report on error");
        partial_check(
            "latency_is_measured_or_refused_in_one_line: this kernel has no kprobes and refuses \
             fentry; only the refusal was checked",
        );
    }
}

/// The kprobe/kretprobe latency path, forced: measured where the kernel has
/// kprobes (the 6.1 and 6.12 guests of scripts/vm-test), refused in one line
/// where it has none (this development kernel).
#[test]
fn kprobe_latency_path_is_measured_or_refused() {
    require_root();
    let kprobes = std::path::Path::new("/sys/bus/event_source/devices/kprobe").exists();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.json");
    let out = kheap(&[
        "record",
        "--latency",
        "--latency-probe",
        "kprobe",
        "--format",
        "json",
        "-o",
        path.to_str().unwrap(),
        "--",
        LOAD,
        "msg",
        "200",
        "2100",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    if kernel_before(5, 15) {
        assert_one_line_error(
            &out,
            "--latency needs the BPF helper bpf_get_func_ip (Linux 5.15)",
        );
        return;
    }
    if !kprobes {
        assert!(!out.status.success());
        assert!(err.contains("has no kprobes"), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        partial_check(
            "kprobe_latency_path_is_measured_or_refused: no kprobes on this kernel; \
             only the refusal was checked",
        );
        return;
    }
    assert!(out.status.success(), "{err}");
    let r: serde_json::Value = parse_valid(&std::fs::read_to_string(&path).unwrap());
    let attach = r["run"]["attach"].to_string();
    assert!(attach.contains("kprobe/kretprobe"), "{attach}");
    let rows = rows_of_fn(&r, "latency", msg_fn());
    let calls: u64 = rows.iter().map(|l| u(&l["count"])).sum();
    assert_eq!(calls, 200, "{:#}", r["latency"]);
    // The record rows keep the real call site although kretprobes replace
    // the return address.
    assert_msg_site(&r, 200, 2100);
}

/// The hang guard the signal tests rely on: a child still running at the
/// limit is killed and reaped, and the wait fails instead of blocking.
#[test]
fn a_hung_child_is_killed_and_the_wait_fails() {
    let child = Command::new("sleep").arg("600").spawn().unwrap();
    let pid = child.id();
    let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_bounded(child, std::time::Duration::from_millis(200))
    }));
    assert!(waited.is_err(), "waiting past the limit must fail the test");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the hung child is killed and reaped"
    );
}

/// `--btf FILE`: the kernel's BTF from a file (for kernels without
/// /sys/kernel/btf/vmlinux) gives the same exact numbers; what is not a BTF
/// file of this kernel, or one with another kernel's layouts, is refused
/// in one line.
#[test]
fn a_btf_file_of_this_kernel_gives_the_same_numbers() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let btf = dir.path().join("vmlinux.btf");
    std::fs::copy("/sys/kernel/btf/vmlinux", &btf).unwrap();
    let r = record_json(&["--btf", btf.to_str().unwrap()], &["msg", "300", "2100"]);
    assert_msg_site(&r, 300, 2100);

    let link = dir.path().join("link.btf");
    std::os::unix::fs::symlink(&btf, &link).unwrap();
    let out = kheap(&["record", "--btf", link.to_str().unwrap(), "-d", "1"]);
    assert_one_line_error(&out, "not a regular file");

    let bytes = std::fs::read(&btf).unwrap();
    let cut = dir.path().join("cut.btf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let out = kheap(&["record", "--btf", cut.to_str().unwrap(), "-d", "1"]);
    assert_one_line_error(&out, "reading kernel BTF from");

    // Another kernel's layout: this kernel's BTF with task_struct's
    // nsproxy moved to the next pointer's place, as a kernel that inserted
    // a field before it would describe it. Read through it, the release is
    // not this kernel's, and kheap refuses instead of counting.
    let other = dir.path().join("other.btf");
    std::fs::write(&other, move_member(&bytes, "task_struct", "nsproxy", 64)).unwrap();
    let out = kheap(&["record", "--btf", other.to_str().unwrap(), "-d", "1"]);
    assert_one_line_error(&out, "give the BTF of");
}

/// Raw BTF (as /sys/kernel/btf/vmlinux) with one struct member's bit offset
/// moved by `by` bits.
fn move_member(btf: &[u8], strukt: &str, member: &str, by: u32) -> Vec<u8> {
    let word = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    assert_eq!(
        &btf[..2],
        &0xeb9f_u16.to_le_bytes(),
        "raw BTF, little-endian"
    );
    let hdr_len = word(btf, 4) as usize;
    let (type_off, type_len) = (word(btf, 8) as usize, word(btf, 12) as usize);
    let str_off = word(btf, 16) as usize;
    let strings = &btf[hdr_len + str_off..];
    let name = |off: u32| {
        let s = &strings[off as usize..];
        std::str::from_utf8(&s[..s.iter().position(|&c| c == 0).unwrap()]).unwrap()
    };
    let mut out = btf.to_vec();
    let (mut at, end) = (hdr_len + type_off, hdr_len + type_off + type_len);
    while at < end {
        let info = word(btf, at + 4);
        let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
        let body = at + 12;
        // The bytes after each kind's 12-byte common part (linux/btf.h).
        let extra = match kind {
            1 | 14 | 17 => 4,
            3 => 12,
            4 | 5 | 15 | 19 => vlen * 12,
            6 | 13 => vlen * 8,
            _ => 0,
        };
        if kind == 4 && name(word(btf, at)) == strukt {
            for m in (0..vlen).map(|i| body + i * 12) {
                if name(word(btf, m)) == member {
                    let offset = word(btf, m + 8) + by;
                    out[m + 8..m + 12].copy_from_slice(&offset.to_le_bytes());
                    return out;
                }
            }
        }
        at = body + extra;
    }
    panic!("no member {member} of struct {strukt} in this BTF");
}

/// A kernel that exposes no BTF of its own (no /sys/kernel/btf/vmlinux, as
/// Ubuntu 20.04's), read through `--btf FILE`: kheap loads only untyped
/// programs and the object without kfuncs, and counts exactly what it
/// counts with the kernel's own BTF, in the same cache. The kernel's BTF is
/// hidden from kheap alone: a tmpfs over /sys/kernel/btf in a mount
/// namespace of its own, gone when it exits.
#[test]
fn a_kernel_without_its_own_btf_is_read_through_a_file() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let btf = dir.path().join("vmlinux.btf");
    std::fs::copy("/sys/kernel/btf/vmlinux", &btf).unwrap();
    let own = record_json(&[], &["msg", "300", "2100"]);
    assert_msg_site(&own, 300, 2100);

    let report = dir.path().join("report.json");
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs kheap-test-no-btf /sys/kernel/btf && test ! -e /sys/kernel/btf/vmlinux && exec \"$@\"")
        .arg("sh")
        .arg(KHEAP)
        .args(["record", "--btf", btf.to_str().unwrap(), "--format", "json", "-o"])
        .arg(&report)
        .args(["--", LOAD, "msg", "300", "2100"])
        .output()
        .expect("running unshare");
    assert_ok(&out);
    let r = parse_valid(&std::fs::read_to_string(&report).unwrap());
    assert_msg_site(&r, 300, 2100);
    let caches = |r: &serde_json::Value| rows_of_fn(r, "sites", msg_fn())[0]["caches"].clone();
    assert_eq!(
        caches(&own).as_array().map(Vec::len),
        Some(1),
        "{:#}",
        caches(&own)
    );
    let skipped = r["run"]["skipped"].to_string();
    if skipped.contains("kmalloc caches: named by size class") {
        // Without the kfunc the object's page is the way to its slab, and
        // this kernel lists no memory-layout symbols (a kernel without
        // CONFIG_KALLSYMS_ALL, as the development host), or the arm64
        // bases could not be established (src/kernel/kmem/page_map.rs):
        // the report's header says which.
        let why = if cfg!(target_arch = "x86_64") {
            "page_offset_base"
        } else {
            "the page bases could not be established"
        };
        assert!(skipped.contains(why), "{skipped}");
    } else {
        assert_eq!(
            caches(&r),
            caches(&own),
            "the cache found with the kernel's own BTF"
        );
    }
    let attach = attach_lines(&r);
    assert!(
        attach.iter().any(|a| a.ends_with("raw_tp"))
            && !attach.iter().any(|a| a.contains("tp_btf")),
        "untyped programs only: {attach:?}"
    );
    assert!(
        std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
        "the kernel's BTF is hidden from kheap alone"
    );
}
