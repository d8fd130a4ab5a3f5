//! What `kheap serve` answers on each path, from the families and profile
//! the reading thread last published. The server threads only format what
//! was published: a scrape never touches the kernel.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use super::exposition::{encode_groups, Family, Format, Kind, Value};
use super::http::{Request, Response};
use super::profile::{ProfileSnapshot, Which};
use super::server::Access;

/// What the HTTP threads serve: replaced whole each interval.
pub struct Published {
    pub families: Vec<Family>,
    /// Families made of root-only data (`/proc/slabinfo` is mode 0400):
    /// served only to a reader who may read them (`served_root_only`).
    pub root_only: Vec<Family>,
    /// The profiles' rows, encoded on the first request of the interval
    /// (and kept for the next requests of the same interval).
    pub profile: ProfileSnapshot,
    alloc_pprof: OnceLock<Vec<u8>>,
    inuse_pprof: OnceLock<Vec<u8>>,
    at: Instant,
    interval: Duration,
}

impl Published {
    pub fn new(
        families: Vec<Family>,
        root_only: Vec<Family>,
        profile: ProfileSnapshot,
        interval: Duration,
    ) -> Published {
        Published {
            families,
            root_only,
            profile,
            alloc_pprof: OnceLock::new(),
            inuse_pprof: OnceLock::new(),
            at: Instant::now(),
            interval,
        }
    }

    pub fn empty(interval: Duration) -> Published {
        Published::new(Vec::new(), Vec::new(), ProfileSnapshot::default(), interval)
    }

    /// The encoded profile, built once per interval by whichever request
    /// (or triggered snapshot) comes first.
    pub fn pprof(&self, which: Which) -> &[u8] {
        let cell = match which {
            Which::Alloc => &self.alloc_pprof,
            Which::Inuse => &self.inuse_pprof,
        };
        cell.get_or_init(|| self.profile.encode(which))
    }
}

/// The state the reading thread and the HTTP threads share.
pub struct Shared {
    pub current: RwLock<Arc<Published>>,
    /// The last scrape's encoding time, in nanoseconds.
    last_scrape_ns: AtomicU64,
    /// `--expose-slabinfo`: root-only families served to every reader.
    pub expose_root_only: AtomicBool,
}

impl Shared {
    pub fn new(interval: Duration, expose_root_only: bool) -> Shared {
        Shared {
            current: RwLock::new(Arc::new(Published::empty(interval))),
            last_scrape_ns: AtomicU64::new(0),
            expose_root_only: AtomicBool::new(expose_root_only),
        }
    }

    /// Whether this reader gets the root-only families: over the unix
    /// socket (its mode says who may connect), after authentication, or
    /// when `--expose-slabinfo` said every reader may.
    fn served_root_only(&self, access: Access) -> bool {
        access.unix_socket || access.authenticated || self.expose_root_only.load(Ordering::Relaxed)
    }
}

const INDEX: &str = "<!doctype html><html><head><title>kheap serve</title></head><body>\
<h1>kheap serve</h1><p>Kernel heap allocations, from kheap's eBPF tracer.</p><ul>\
<li><a href=\"/metrics\">/metrics</a>: Prometheus text or OpenMetrics (by Accept)</li>\
<li><a href=\"/pprof/alloc\">/pprof/alloc</a>: pprof profile of kernel heap allocations since the start (go tool pprof, Pyroscope, Parca)</li>\
<li><a href=\"/pprof/inuse\">/pprof/inuse</a>: pprof profile of outstanding kernel heap memory now (needs --track-outstanding)</li>\
<li><a href=\"/healthz\">/healthz</a>: ok while the maps are being read</li>\
</ul></body></html>\n";

fn pprof_response(shared: &Shared, which: Which) -> Response {
    let current = shared.current.read().unwrap().clone();
    if current.families.is_empty() {
        return Response::text(
            503,
            "no profile yet: the kernel maps have not been read; retry after --interval\n",
        );
    }
    if which == Which::Inuse && !current.profile.inuse {
        return Response::text(
            404,
            "/pprof/inuse needs outstanding-memory tracking: start kheap serve with --track-outstanding (or add it to --config and send SIGHUP); /pprof/alloc has allocations\n",
        );
    }
    Response::new(
        200,
        "application/octet-stream",
        current.pprof(which).to_vec(),
    )
    .with_header(
        "Content-Disposition",
        "attachment; filename=\"profile.pb.gz\"",
    )
}

fn metrics(req: &Request, access: Access, shared: &Shared) -> Response {
    let format = Format::negotiate(req.header("Accept"));
    let t0 = Instant::now();
    let current = shared.current.read().unwrap().clone();
    let scrape = [Family::single(
        "kheap_scrape_duration_seconds",
        Kind::Gauge,
        "Time the previous scrape of /metrics took to encode",
        Value::Float(shared.last_scrape_ns.load(Ordering::Relaxed) as f64 / 1e9),
    )];
    let root_only: &[Family] = if shared.served_root_only(access) {
        &current.root_only
    } else {
        &[]
    };
    let body = encode_groups(&[&current.families, root_only, &scrape], format);
    shared
        .last_scrape_ns
        .store(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    Response::new(200, format.content_type(), body)
}

/// The answer to one request (authentication was checked before).
pub fn handle(req: &Request, access: Access, shared: &Shared) -> Response {
    match req.path.as_str() {
        "/metrics" => metrics(req, access, shared),
        "/healthz" => {
            let current = shared.current.read().unwrap().clone();
            // Healthy while reads keep coming: three intervals of slack.
            let fresh = current.at.elapsed() < current.interval * 3 + Duration::from_secs(5);
            if fresh && !current.families.is_empty() {
                Response::text(200, "ok\n")
            } else {
                Response::text(503, "the kernel maps have not been read recently\n")
            }
        }
        "/pprof/alloc" => pprof_response(shared, Which::Alloc),
        "/pprof/inuse" => pprof_response(shared, Which::Inuse),
        "/" => Response::new(200, "text/html; charset=utf-8", INDEX),
        _ => Response::text(404, "not found; see /\n"),
    }
}
