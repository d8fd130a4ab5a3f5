//! Who made a stack row's allocations: its split by process (and the
//! cgroup the process ran in then) or interrupt context, for the JSON's
//! `processes` of stack rows and the labels of pprof samples. Pure.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::model::live::Retained;
use crate::model::{apportion, AllocStats, Owner};
use crate::report::identity::ProcessIdentity;
use crate::report::retention::Retention;

/// One process's share of a stack row (in the cgroup it ran in then), or
/// interrupt context's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StackProcess {
    /// The cgroup is the one the allocations were made in.
    #[serde(flatten)]
    pub process: ProcessIdentity,
    pub count: u64,
    pub bytes_req: u64,
    pub bytes_alloc: u64,
    /// kheap leaks: what of it is still outstanding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outstanding_count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outstanding_bytes: Option<u64>,
}

/// Who made one stack's allocations, and (leaks) who made what it still
/// holds, as traced (before any scaling).
pub struct Owners<'a> {
    pub allocated: Option<&'a HashMap<Owner, AllocStats>>,
    pub held: Option<&'a HashMap<Owner, Retained>>,
}

impl Owners<'_> {
    /// The stack row's numbers (scaled estimates, when sampled) split
    /// among its owners in proportion to what each was traced with, so
    /// that the shares add up to the row exactly. Largest first; empty
    /// when the run did not key stacks by owner (no allocation split).
    pub fn split(
        &self,
        row: &AllocStats,
        row_held: Option<&Retention>,
        comm_of: &dyn Fn(u32) -> String,
    ) -> Vec<StackProcess> {
        let Some(allocated_by) = self.allocated else {
            return Vec::new();
        };
        let allocated = |o: &Owner| allocated_by.get(o).copied().unwrap_or_default();
        let held = |o: &Owner| {
            self.held
                .and_then(|m| m.get(o))
                .copied()
                .unwrap_or_default()
        };
        let mut owners: Vec<Owner> = allocated_by.keys().copied().collect();
        owners.extend(self.held.iter().flat_map(|m| m.keys()));
        owners.sort_unstable();
        owners.dedup();
        let split = |total: u64, weight: &dyn Fn(&Owner) -> u64| {
            apportion(total, &owners.iter().map(weight).collect::<Vec<_>>())
        };
        let count = split(row.count, &|o| allocated(o).count);
        let bytes_req = split(row.bytes_req, &|o| allocated(o).bytes_req);
        let bytes_alloc = split(row.bytes_alloc, &|o| allocated(o).bytes_alloc);
        let held_count = row_held.map(|r| split(r.outstanding_count, &|o| held(o).count));
        let held_bytes = row_held.map(|r| split(r.outstanding_bytes, &|o| held(o).bytes_alloc));
        let mut rows: Vec<StackProcess> = owners
            .iter()
            .enumerate()
            .map(|(i, owner)| {
                let (pid, cgroup_id) = match *owner {
                    Owner::Process { tgid, cgroup } => {
                        (Some(tgid), (cgroup != 0).then_some(cgroup))
                    }
                    Owner::Interrupt => (None, None),
                };
                StackProcess {
                    process: ProcessIdentity::new(pid, comm_of, cgroup_id),
                    count: count[i],
                    bytes_req: bytes_req[i],
                    bytes_alloc: bytes_alloc[i],
                    outstanding_count: held_count.as_ref().map(|v| v[i]),
                    outstanding_bytes: held_bytes.as_ref().map(|v| v[i]),
                }
            })
            .collect();
        rows.sort_by(|a, b| {
            (b.outstanding_bytes, b.bytes_alloc)
                .cmp(&(a.outstanding_bytes, a.bytes_alloc))
                .then(a.process.pid.cmp(&b.process.pid))
        });
        rows
    }
}
