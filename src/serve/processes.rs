//! The label values of the per-process series (`kheap serve --by-process`):
//! the process id and its name, and which of them are gone. A process is
//! named once, by what `/proc/PID/comm` says when the daemon first sees
//! it (after its exec, usually: the kernel's own record is the name at
//! its first allocation, often its parent's before the exec), or by the
//! kernel's record if it has already exited. A process is told from a
//! later one that reuses its pid by its start time (not its name: a
//! kworker's name changes with the work it runs). Pure: the lookups of a
//! running process are passed in.

use std::collections::HashMap;

use crate::model::live::Outstanding;
use crate::model::AllocStats;
use crate::serve::series::{LabelValues, Ranked, OTHER};

/// The labels of the process series, in order.
pub const LABELS: [&str; 2] = ["pid", "comm"];

/// The `comm` label of allocations made in interrupt context (not the
/// interrupted task's); its `pid` is empty.
pub const INTERRUPT: &str = "[interrupt]";

/// The label values of a process's series (`None`: interrupt context).
fn label_values(pid: Option<u32>, name: impl FnOnce(u32) -> String) -> LabelValues {
    match pid {
        None => vec![String::new(), INTERRUPT.to_string()],
        Some(p) => vec![p.to_string(), name(p)],
    }
}

/// A running process as `/proc` shows it: its name and its start time.
pub type Running = (String, u64);

/// A process seen: the name its series bears, and its start time (None if
/// it had exited when first seen).
#[derive(Clone, Debug)]
struct Seen {
    name: String,
    start: Option<u64>,
}

/// The names given to the processes seen so far, by pid.
#[derive(Clone, Debug, Default)]
pub struct ProcessNames {
    names: HashMap<u32, Seen>,
}

impl ProcessNames {
    pub fn new() -> ProcessNames {
        ProcessNames::default()
    }

    /// One interval's per-process deltas (the kernel's rows: `None` is
    /// interrupt context; the name it recorded beside the counts) by label
    /// values. `running` is a process's name and start time, `None` once
    /// it has exited.
    pub fn by_values(
        &mut self,
        delta: &HashMap<Option<u32>, (String, AllocStats)>,
        running: &dyn Fn(u32) -> Option<Running>,
    ) -> HashMap<LabelValues, AllocStats> {
        let mut out: HashMap<LabelValues, AllocStats> = HashMap::new();
        for (pid, (recorded, s)) in delta {
            let values = label_values(*pid, |pid| {
                let seen = self.names.entry(pid).or_insert_with(|| match running(pid) {
                    Some((name, start)) => Seen {
                        name,
                        start: Some(start),
                    },
                    None => Seen {
                        name: recorded.clone(),
                        start: None,
                    },
                });
                seen.name.clone()
            });
            *out.entry(values).or_default() += *s;
        }
        out
    }

    /// Ends the series of the processes that are gone: no process has
    /// their pid now, or the one that has it started at another time (the
    /// pid was reused), or they had exited when first seen. Their label
    /// sets are forgotten (their series are no longer exported, and
    /// nothing they counted moves to `other`). `started` is the start
    /// time of the process that has a pid now. Returns how many were
    /// ended.
    pub fn retire_exited(
        &mut self,
        series: &mut Ranked,
        started: &dyn Fn(u32) -> Option<u64>,
    ) -> usize {
        let mut gone: Vec<u32> = Vec::new();
        for (pid, seen) in &self.names {
            if seen.start.is_none() || started(*pid) != seen.start {
                gone.push(*pid);
            }
        }
        for pid in &gone {
            self.names.remove(pid);
        }
        let gone: std::collections::HashSet<String> =
            gone.into_iter().map(|p| p.to_string()).collect();
        series.retire(&|v: &LabelValues| v.first().is_some_and(|pid| gone.contains(pid)))
    }

    /// The name of a process: the one given to its series if it has one,
    /// else its name now, else empty (it has exited).
    pub fn name_of(&self, pid: u32, name_now: &dyn Fn(u32) -> Option<String>) -> String {
        self.names
            .get(&pid)
            .map(|s| s.name.clone())
            .or_else(|| name_now(pid))
            .unwrap_or_default()
    }

    /// Processes named so far and not yet gone.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// The outstanding objects of the `max` processes that hold the most
/// bytes (`--track-outstanding`: read from the live objects, which outlive
/// the process that allocated them), sorted by label values, then the
/// rest summed into the `other` row (always there). Gauges: a process
/// that falls out of the top N, or whose objects are all freed, simply
/// has no series at the next read.
pub fn outstanding_rows(
    by: &HashMap<Option<u32>, Outstanding>,
    max: usize,
    name: &dyn Fn(u32) -> String,
) -> Vec<(LabelValues, Outstanding)> {
    let mut all: Vec<(&Option<u32>, &Outstanding)> = by.iter().collect();
    all.sort_by(|a, b| b.1.bytes_alloc.cmp(&a.1.bytes_alloc).then(a.0.cmp(b.0)));
    let mut rows: Vec<(LabelValues, Outstanding)> = Vec::new();
    let mut other = Outstanding::default();
    for (i, (pid, o)) in all.into_iter().enumerate() {
        if i < max {
            rows.push((label_values(*pid, name), *o));
        } else {
            other += *o;
        }
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    rows.push((vec![OTHER.to_string(); LABELS.len()], other));
    rows
}

#[cfg(test)]
mod tests;
