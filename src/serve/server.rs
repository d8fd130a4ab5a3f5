//! The HTTP server of `kheap serve`, built to survive any local client:
//!
//! - One thread polls every connection while its request head arrives
//!   (and, with TLS, while it shakes hands). A slow or silent client costs
//!   a buffer of at most `HEAD_LIMIT` bytes and a file descriptor, never a
//!   thread; it is closed after `IDLE_TIMEOUT` without a byte or
//!   `HEAD_TIMEOUT` without a complete head.
//! - At most `MAX_CONNECTIONS` connections are open: a new one closes the
//!   one that has been silent longest, so a flood of idle connections
//!   cannot lock out a real client.
//! - A fixed pool of `WORKERS` threads answers complete requests (and the
//!   errors: 414/431 for an oversized head, 405, 505, 400, 401), writes
//!   within `WRITE_DEADLINE`, and closes: one request per connection. A
//!   full queue closes the connection rather than waiting.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::sys::wake::WakePipe;

use rustls::ServerConnection;

use super::http::{head_end, oversized_status, parse_head, Method, Request, Response, HEAD_LIMIT};
use super::listen::{Listener, Stream};
use super::webconfig::WebConfig;

/// Threads answering requests.
pub const WORKERS: usize = 4;
/// Connections open at once (reading their heads or queued).
pub const MAX_CONNECTIONS: usize = 512;
/// Complete requests waiting for a worker.
const QUEUE: usize = 32;
/// No byte for this long while the head is read: closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// The whole head (and TLS handshake) must arrive within this.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// A response must be written within this (a client that does not read
/// holds a worker no longer).
const WRITE_DEADLINE: Duration = Duration::from_secs(10);

/// What a handler knows of who is asking.
#[derive(Clone, Copy, Debug)]
pub struct Access {
    /// The request proved who sent it: a password of the web config, or a
    /// client certificate its CA verified.
    pub authenticated: bool,
    /// It came over the unix socket (whose owner and mode say who may
    /// connect).
    pub unix_socket: bool,
}

pub type Handler = dyn Fn(&Request, Access) -> Response + Send + Sync;

/// The web config every new connection takes (replaced on SIGHUP).
pub type SharedWebConfig = Arc<RwLock<Arc<WebConfig>>>;

/// A running server: stops and joins its threads when told or dropped.
pub struct Server {
    stop: Arc<AtomicBool>,
    /// Wakes the poll thread to see `stop`.
    wake: Arc<WakePipe>,
    threads: Vec<JoinHandle<()>>,
}

impl Server {
    pub fn start(
        listener: Listener,
        web: SharedWebConfig,
        handler: Arc<Handler>,
    ) -> std::io::Result<Server> {
        listener.set_nonblocking()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = sync_channel::<Job>(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        let unix = listener.is_unix();
        let mut threads = Vec::new();
        for _ in 0..WORKERS {
            let (rx, handler) = (rx.clone(), handler.clone());
            threads.push(std::thread::spawn(move || worker(&rx, &*handler, unix)));
        }
        let wake = Arc::new(WakePipe::new()?);
        let (s, w) = (stop.clone(), wake.clone());
        threads.push(std::thread::spawn(move || {
            poll_loop(listener, &web, tx, &s, &w)
        }));
        Ok(Server {
            stop,
            wake,
            threads,
        })
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.wake();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A connection whose head is being read.
struct Conn {
    stream: Stream,
    tls: Option<ServerConnection>,
    web: Arc<WebConfig>,
    head: Vec<u8>,
    accepted: Instant,
    last_byte: Instant,
    /// Whether the first byte was looked at (TLS: a handshake, or a plain
    /// HTTP request sent to the TLS port by mistake).
    first_seen: bool,
}

/// What the head reading decided.
enum Outcome {
    /// A complete head.
    Head(Vec<u8>),
    /// An error status (oversized head).
    Status(u16),
    /// Plain HTTP on the TLS port: answered in plain text, as the Go
    /// exporters do, so the mistake is easy to see.
    PlainOnTls,
}

enum Progress {
    Pending,
    Ready(Outcome),
    Close,
}

struct Job {
    conn: Conn,
    outcome: Outcome,
}

/// Sleeps in poll(2) until a client sends or connects, a connection's
/// deadline, or a wake for the stop: an idle server does not wake.
fn poll_loop(
    listener: Listener,
    web: &SharedWebConfig,
    tx: SyncSender<Job>,
    stop: &AtomicBool,
    wake: &WakePipe,
) {
    let mut conns: Vec<Conn> = Vec::new();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        fds.clear();
        fds.push(libc::pollfd {
            fd: wake.read_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        fds.push(libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        for c in &conns {
            let wants_write = c.tls.as_ref().is_some_and(|t| t.wants_write());
            fds.push(libc::pollfd {
                fd: c.stream.as_raw_fd(),
                events: libc::POLLIN | if wants_write { libc::POLLOUT } else { 0 },
                revents: 0,
            });
        }
        let timeout = next_deadline(&conns).map_or(-1, |d| {
            let left = d.saturating_duration_since(Instant::now());
            // Rounded up, so that the deadline has passed on waking.
            left.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32
        });
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if n < 0 {
            continue; // EINTR
        }
        if fds[0].revents != 0 {
            wake.drain();
        }
        let now = Instant::now();
        let mut kept = Vec::with_capacity(conns.len());
        for (mut c, fd) in conns.drain(..).zip(&fds[2..]) {
            let progress = if fd.revents != 0 {
                progress(&mut c, now)
            } else {
                Progress::Pending
            };
            match progress {
                Progress::Pending => {
                    let timed_out = now.duration_since(c.last_byte) > IDLE_TIMEOUT
                        || now.duration_since(c.accepted) > HEAD_TIMEOUT;
                    if !timed_out {
                        kept.push(c);
                    }
                }
                Progress::Ready(outcome) => {
                    // A full queue: the connection is closed (dropped) now
                    // rather than kept waiting.
                    let _ = tx.try_send(Job { conn: c, outcome });
                }
                Progress::Close => {}
            }
        }
        conns = kept;
        if fds[1].revents != 0 {
            accept_all(&listener, web, &mut conns, now);
        }
    }
}

/// When the first open connection times out (`IDLE_TIMEOUT` without a
/// byte, `HEAD_TIMEOUT` without a whole head); `None` without one.
fn next_deadline(conns: &[Conn]) -> Option<Instant> {
    conns
        .iter()
        .map(|c| (c.last_byte + IDLE_TIMEOUT).min(c.accepted + HEAD_TIMEOUT))
        .min()
}

fn accept_all(listener: &Listener, web: &SharedWebConfig, conns: &mut Vec<Conn>, now: Instant) {
    // A bounded number per round: the open connections get their turn.
    for _ in 0..64 {
        let stream = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => {
                // Out of file descriptors: make room, and let the poll
                // wait a little rather than spin on a listener that stays
                // readable.
                close_most_idle(conns);
                std::thread::sleep(Duration::from_millis(10));
                return;
            }
        };
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        if conns.len() >= MAX_CONNECTIONS {
            close_most_idle(conns);
        }
        let web = web.read().unwrap().clone();
        let tls = match &web.tls {
            Some(config) => match ServerConnection::new(config.clone()) {
                Ok(t) => Some(t),
                Err(_) => continue,
            },
            None => None,
        };
        conns.push(Conn {
            stream,
            tls,
            web,
            head: Vec::new(),
            accepted: now,
            last_byte: now,
            first_seen: false,
        });
    }
}

fn close_most_idle(conns: &mut Vec<Conn>) {
    if let Some(i) = conns
        .iter()
        .enumerate()
        .min_by_key(|(_, c)| c.last_byte)
        .map(|(i, _)| i)
    {
        conns.swap_remove(i);
    }
}

/// Reads what a ready connection has; decides once the head is complete
/// or too large.
fn progress(c: &mut Conn, now: Instant) -> Progress {
    let mut buf = [0u8; 4096];
    // A bounded number of reads per round; the head limit bounds the rest.
    for _ in 0..4 {
        let n = match c.stream.read(&mut buf) {
            Ok(0) => return Progress::Close,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return Progress::Close,
        };
        c.last_byte = now;
        let data = &buf[..n];
        if c.tls.is_some() && !c.first_seen && data[0] != 0x16 {
            // 0x16 starts a TLS handshake record; a letter is HTTP.
            return Progress::Ready(Outcome::PlainOnTls);
        }
        c.first_seen = true;
        let fed = match &mut c.tls {
            Some(tls) => feed_tls(tls, data, &mut c.head),
            None => {
                c.head.extend_from_slice(data);
                true
            }
        };
        if !fed {
            flush_tls(c);
            return Progress::Close;
        }
        if let Some(end) = head_end(&c.head).filter(|&end| end <= HEAD_LIMIT) {
            c.head.truncate(end);
            return Progress::Ready(Outcome::Head(std::mem::take(&mut c.head)));
        }
        if c.head.len() > HEAD_LIMIT {
            return Progress::Ready(Outcome::Status(oversized_status(&c.head)));
        }
    }
    if !flush_tls(c) {
        return Progress::Close;
    }
    Progress::Pending
}

/// Hands `data` to the TLS session and appends the plaintext it yields
/// (up to just past the head limit). False when the session failed.
fn feed_tls(tls: &mut ServerConnection, mut data: &[u8], head: &mut Vec<u8>) -> bool {
    while !data.is_empty() {
        if tls.read_tls(&mut data).is_err() || tls.process_new_packets().is_err() {
            return false;
        }
        let mut plain = [0u8; 4096];
        loop {
            match tls.reader().read(&mut plain) {
                Ok(0) => return false,
                Ok(n) => {
                    head.extend_from_slice(&plain[..n]);
                    if head.len() > HEAD_LIMIT {
                        return true;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => return false,
            }
        }
    }
    true
}

/// Writes what the TLS session has to send (handshake, alerts) as far as
/// the socket takes it without blocking. False when the socket failed.
fn flush_tls(c: &mut Conn) -> bool {
    let Some(tls) = &mut c.tls else { return true };
    while tls.wants_write() {
        match tls.write_tls(&mut c.stream) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(_) => return false,
        }
    }
    true
}

fn worker(rx: &Mutex<Receiver<Job>>, handler: &Handler, unix: bool) {
    loop {
        // The lock is held only while waiting for the next job.
        let job = match rx.lock().unwrap().recv() {
            Ok(job) => job,
            Err(_) => return, // the poll thread stopped
        };
        answer(job, handler, unix);
    }
}

fn answer(job: Job, handler: &Handler, unix: bool) {
    let Job { mut conn, outcome } = job;
    let _ = conn.stream.set_nonblocking(false);
    let _ = conn
        .stream
        .set_timeouts(Duration::from_millis(500), Duration::from_secs(2));
    let (response, head_only) = match outcome {
        Outcome::PlainOnTls => {
            let r = Response::text(400, "Client sent an HTTP request to an HTTPS server.\n");
            write_deadline(&mut conn.stream, &[&r.head(), &r.body]);
            close(conn.stream);
            return;
        }
        Outcome::Status(status) => (Response::error(status), false),
        Outcome::Head(head) => match parse_head(&head) {
            Err(status) => (Response::error(status), false),
            Ok(req) => {
                let head_only = req.method == Method::Head;
                let cert = conn
                    .tls
                    .as_ref()
                    .is_some_and(|t| t.peer_certificates().is_some_and(|c| !c.is_empty()));
                let web = &conn.web;
                if !web.password_ok(req.header("Authorization")) {
                    let r = Response::text(401, "Unauthorized\n")
                        .with_header("WWW-Authenticate", "Basic realm=\"kheap\"");
                    (r, head_only)
                } else {
                    let access = Access {
                        authenticated: web.wants_password() || cert,
                        unix_socket: unix,
                    };
                    (handler(&req, access), head_only)
                }
            }
        },
    };
    let head = response.head();
    let parts: &[&[u8]] = if head_only {
        &[&head]
    } else {
        &[&head, &response.body]
    };
    match conn.tls.take() {
        Some(tls) => {
            let mut s = rustls::StreamOwned::new(tls, conn.stream);
            if write_deadline(&mut s, parts) {
                s.conn.send_close_notify();
                let _ = s.flush();
            }
            close(s.sock);
        }
        None => {
            write_deadline(&mut conn.stream, parts);
            close(conn.stream);
        }
    }
}

/// Writes `parts` in pieces until done or `WRITE_DEADLINE` passes.
fn write_deadline(w: &mut impl Write, parts: &[&[u8]]) -> bool {
    let deadline = Instant::now() + WRITE_DEADLINE;
    for chunk in parts.iter().flat_map(|p| p.chunks(64 * 1024)) {
        if Instant::now() > deadline || w.write_all(chunk).is_err() {
            return false;
        }
    }
    w.flush().is_ok()
}

/// Ends the connection so the client reads the whole response: our side
/// is shut first, then what the client still sends is read and dropped
/// (briefly, and only so much: a worker is not held by a client that
/// keeps sending) before the socket closes.
fn close(mut stream: Stream) {
    stream.shutdown_write();
    let _ = stream.set_timeouts(Duration::from_millis(100), Duration::from_millis(100));
    let deadline = Instant::now() + Duration::from_millis(200);
    let mut sink = [0u8; 4096];
    let mut drained = 0;
    while drained < 64 * 1024 && Instant::now() < deadline {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}
