//! `kheap serve`'s pprof endpoints read back by the real consumer: `go tool
//! pprof` fetches /pprof/alloc and /pprof/inuse over HTTP while a private
//! copy of kheap-load holds a known number of SysV messages, and its `-top`
//! shows the workload's site with the exact site totals (site totals are
//! exact; only their split over sampled stacks is estimated). Needs root
//! and `go` (golang-go; scripts/setup installs it).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const COUNT: u64 = 300;
/// kheap-load msg's 2100-byte payload plus the message header lands in
/// kmalloc-4k.
const OBJECT: u64 = 4096;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A copy of kheap-load under a command name no other process has.
fn private_load(dir: &Path, comm: &str) -> PathBuf {
    let path = dir.join(comm);
    std::fs::copy(LOAD, &path).unwrap();
    path
}

fn start_serve(port: u16, comm: &str, extra: &[&str]) -> Background {
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec![
        "serve",
        "--listen",
        &listen,
        "--interval",
        "1",
        "--comm",
        comm,
    ];
    args.extend_from_slice(extra);
    let mut b = Background::spawn(KHEAP, &args);
    b.wait_for("serving on");
    b
}

/// `go tool pprof -top` of `url` (fetched over HTTP by pprof itself) for
/// one sample type, only the samples of cache kmalloc-4k: the cumulative
/// value of `function`, 0 when it is not in the profile.
fn pprof_cum(dir: &Path, url: &str, sample_index: &str, function: &str) -> u64 {
    let out = Command::new("go")
        .args([
            "tool",
            "pprof",
            "-top",
            "-nodecount=1000",
            "-unit=B",
            &format!("-sample_index={sample_index}"),
            "-tagfocus=cache=kmalloc-4k",
            url,
        ])
        // pprof saves each fetched profile under $PPROF_TMPDIR.
        .env("PPROF_TMPDIR", dir)
        .env("HOME", dir)
        .stdin(Stdio::null())
        .output()
        .expect("go (golang-go) is needed by this test");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "go tool pprof {url}: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    // flat flat% sum% cum cum% name
    text.lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.len() == 6 && cols[5] == function).then(|| {
                cols[3]
                    .trim_end_matches('B')
                    .parse::<u64>()
                    .unwrap_or_else(|_| panic!("cum column of {l:?}"))
            })
        })
        .next()
        .unwrap_or(0)
}

/// Polls until `f` returns `want` (the daemon reads every second).
fn wait_for_value(what: &str, want: u64, f: impl Fn() -> u64) {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let got = f();
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: expected {want}, last read {got}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn curl_status(url: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-w", "\n%{http_code}", url])
        .output()
        .expect("curl is needed by this test");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.trim().parse().unwrap(), body.to_string())
}

#[test]
fn go_tool_pprof_reads_alloc_and_inuse_over_http() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let comm = format!("ksp{}", std::process::id() % 100_000);
    let load = private_load(dir.path(), &comm);
    let port = free_port();
    let mut serve = start_serve(port, &comm, &["--track-outstanding"]);
    let base = format!("http://127.0.0.1:{port}");

    let (code, index) = curl_status(&format!("{base}/"));
    assert_eq!(code, 200);
    assert!(index.contains("/pprof/alloc") && index.contains("/pprof/inuse"));

    // Holds its COUNT messages for 20 s, then frees them and exits (on a
    // failure, dropping it interrupts it and it removes its queue).
    let count = COUNT.to_string();
    let mut holder = Background::spawn(load.to_str().unwrap(), &["msg", &count, "2100", "20"]);
    let (alloc, inuse) = (format!("{base}/pprof/alloc"), format!("{base}/pprof/inuse"));
    let cum = |url: &str, index: &str| pprof_cum(dir.path(), url, index, "load_msg");
    // While held: every message outstanding, exactly.
    wait_for_value("inuse_objects of load_msg", COUNT, || {
        cum(&inuse, "inuse_objects")
    });
    assert_eq!(cum(&inuse, "inuse_space"), COUNT * OBJECT);
    assert_eq!(cum(&alloc, "alloc_objects"), COUNT);
    assert_eq!(cum(&alloc, "alloc_space"), COUNT * OBJECT);
    // The inuse profile carries the allocations too (as Go's heap does).
    assert_eq!(cum(&inuse, "alloc_objects"), COUNT);

    assert!(holder.wait(), "kheap-load msg failed");
    // Freed: nothing outstanding, and the allocations since the start stay.
    wait_for_value("inuse_objects of load_msg after the frees", 0, || {
        cum(&inuse, "inuse_objects")
    });
    assert_eq!(cum(&alloc, "alloc_objects"), COUNT);
    assert_eq!(cum(&alloc, "alloc_space"), COUNT * OBJECT);

    serve.signal(libc::SIGTERM);
    assert!(serve.wait(), "kheap serve exits 0 on SIGTERM");
}

#[test]
fn inuse_without_outstanding_tracking_says_which_flag() {
    require_root();
    let port = free_port();
    let mut serve = start_serve(port, "kspnone", &[]);
    let base = format!("http://127.0.0.1:{port}");
    // The first read publishes within an interval.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (code, body) = loop {
        let r = curl_status(&format!("{base}/pprof/inuse"));
        if r.0 != 503 || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("--track-outstanding"), "{body}");
    let (code, _) = curl_status(&format!("{base}/pprof/alloc"));
    assert_eq!(code, 200);
    serve.signal(libc::SIGTERM);
    assert!(serve.wait());
}
