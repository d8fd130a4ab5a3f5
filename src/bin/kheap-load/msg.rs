//! SysV messages: one kmalloc each (load_msg), in private queues removed
//! on every exit path.

use std::time::{Duration, Instant};

use crate::{catch_stop_early, fail, stopping_early, usage};

/// A private SysV message queue, removed when dropped.
struct MsgQueue(i32);

/// Every queue this process created and has not removed: removed on a
/// failure exit and on SIGINT/SIGTERM/SIGHUP too, so an interrupted run
/// leaves no SysV queue behind (they outlive processes, and a host runs out
/// of them: msgget then fails with ENOSPC).
static QUEUES: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

impl MsgQueue {
    fn new() -> MsgQueue {
        // Created under the lock: the interrupt handler, which takes it
        // before removing the queues, cannot miss one being created.
        let mut queues = QUEUES.lock().unwrap_or_else(|e| e.into_inner());
        let id = unsafe { libc::msgget(libc::IPC_PRIVATE, libc::IPC_CREAT | 0o600) };
        if id < 0 {
            drop(queues);
            fail("msgget");
        }
        queues.push(id);
        MsgQueue(id)
    }
}

impl Drop for MsgQueue {
    fn drop(&mut self) {
        QUEUES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|&q| q != self.0);
        unsafe { libc::msgctl(self.0, libc::IPC_RMID, std::ptr::null_mut()) };
    }
}

pub fn remove_all_queues() {
    let mut queues = QUEUES.lock().unwrap_or_else(|e| e.into_inner());
    for id in queues.drain(..) {
        unsafe { libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
    }
    // Still held while the process exits: no queue is created after this.
    std::mem::forget(queues);
}

/// A queue holds at most msgmnb bytes (raising that needs CAP_SYS_RESOURCE),
/// so messages are spread over as many queues as needed.
fn queue_bytes() -> usize {
    std::fs::read_to_string("/proc/sys/kernel/msgmnb")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(16384)
}

pub fn msg(count: usize, size: usize, hold_secs: Option<f64>) {
    let mut held = HeldMessages::new(count, size);
    held.send(count);
    if let Some(secs) = hold_secs {
        catch_stop_early();
        eprintln!("holding {count} messages of {size} bytes for {secs}s");
        let end = Instant::now() + Duration::from_secs_f64(secs);
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            if stopping_early() {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(10)));
        }
    }
    held.receive_all();
    eprintln!("sent and received {count} messages of {size} bytes");
}

/// COUNT, 2*COUNT, then 3*COUNT messages held, STEP_SECS each: a timeline
/// shows three steps of known sizes.
pub fn msg_steps(count: usize, size: usize, step_secs: f64) {
    if !(step_secs.is_finite() && step_secs > 0.0) {
        usage();
    }
    let mut held = HeldMessages::new(3 * count, size);
    for step in 1..=3 {
        held.send(count);
        eprintln!(
            "step {step}: holding {} messages of {size} bytes for {step_secs}s",
            step * count
        );
        std::thread::sleep(Duration::from_secs_f64(step_secs));
    }
    held.receive_all();
    eprintln!("sent and received {} messages of {size} bytes", 3 * count);
}

/// Messages of one size sent into as many private queues as `capacity`
/// of them need; the queues go when this is dropped.
struct HeldMessages {
    queues: Vec<MsgQueue>,
    per_queue: usize,
    size: usize,
    sent: usize,
    buf: Vec<u8>,
}

impl HeldMessages {
    fn new(capacity: usize, size: usize) -> HeldMessages {
        if size == 0 || size > 4000 {
            eprintln!("kheap-load: msg SIZE must be 1..=4000 (one allocation per message)");
            std::process::exit(2);
        }
        let per_queue = (queue_bytes() / size).max(1);
        let queues = (0..capacity.div_ceil(per_queue))
            .map(|_| MsgQueue::new())
            .collect();
        // struct msgbuf: a long type, then the text.
        let mut buf = vec![0u8; 8 + size];
        buf[..8].copy_from_slice(&1i64.to_ne_bytes());
        HeldMessages {
            queues,
            per_queue,
            size,
            sent: 0,
            buf,
        }
    }

    fn send(&mut self, count: usize) {
        for _ in 0..count {
            let q = &self.queues[self.sent / self.per_queue];
            if unsafe { libc::msgsnd(q.0, self.buf.as_ptr().cast(), self.size, 0) } != 0 {
                fail("msgsnd");
            }
            self.sent += 1;
        }
    }

    fn receive_all(&mut self) {
        for i in 0..self.sent {
            let q = &self.queues[i / self.per_queue];
            let buf = self.buf.as_mut_ptr().cast();
            if unsafe { libc::msgrcv(q.0, buf, self.size, 0, 0) } < 0 {
                fail("msgrcv");
            }
        }
        self.sent = 0;
    }
}
