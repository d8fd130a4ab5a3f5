//! Per-cgroup rows (accounted and unaccounted entries folded, with leaks'
//! retention) and the naming of every cgroup a report carries.

use std::collections::HashMap;

use super::rows::{Accounting, CgroupRow, OutstandingAccounting, Report};
use crate::cgroup::{CgroupNames, CgroupRef};
use crate::model::live::{Retained, RetainedIndex};
use crate::model::snapshot::{CgroupKey, CgroupSlot, Snapshot};
use crate::model::AllocStats;
use crate::report::identity::ProcessIdentity;
use crate::report::retention::Retention;

/// One row per cgroup slot, accounted and unaccounted entries folded; with
/// leaks, what each still holds.
pub(super) fn cgroup_rows(
    snap: &Snapshot,
    retained: Option<(&RetainedIndex, f64)>,
) -> Vec<CgroupRow> {
    let mut by_slot: HashMap<CgroupSlot, (AllocStats, Accounting)> = HashMap::new();
    for (k, s) in &snap.cgroups {
        let (all, acc) = by_slot.entry(k.slot).or_default();
        *all += *s;
        if k.accounted {
            acc.accounted_count += s.count;
            acc.accounted_bytes += s.bytes_alloc;
        } else {
            acc.unaccounted_count += s.count;
            acc.unaccounted_bytes += s.bytes_alloc;
        }
    }
    by_slot
        .into_iter()
        .map(|(slot, (s, accounting))| {
            let cgroup_id = match slot {
                CgroupSlot::Cgroup(id) => Some(id),
                CgroupSlot::Interrupt => None,
            };
            let (retention, outstanding_accounting) = match retained {
                Some((idx, duration_s)) => {
                    let (ret, split) = cgroup_retention(idx, slot);
                    (Some(Retention::new(&ret, duration_s)), Some(split))
                }
                None => (None, None),
            };
            CgroupRow {
                cgroup: cgroup_id.map(CgroupRef::unnamed),
                interrupt: cgroup_id.is_none(),
                counts: (&s).into(),
                accounting,
                retention,
                outstanding_accounting,
                cgroup_id,
            }
        })
        .collect()
}

/// What one cgroup slot holds, charged and uncharged entries folded.
fn cgroup_retention(idx: &RetainedIndex, slot: CgroupSlot) -> (Retained, OutstandingAccounting) {
    let mut all = Retained::default();
    let mut split = OutstandingAccounting::default();
    for accounted in [true, false] {
        let Some(r) = idx.cgroups.get(&CgroupKey { slot, accounted }) else {
            continue;
        };
        all += *r;
        if accounted {
            split.outstanding_accounted_count += r.count;
            split.outstanding_accounted_bytes += r.bytes_alloc;
        } else {
            split.outstanding_unaccounted_count += r.count;
            split.outstanding_unaccounted_bytes += r.bytes_alloc;
        }
    }
    (all, split)
}

impl Report {
    /// Fills in the path and container of every cgroup the rows carry.
    pub fn name_cgroups(&mut self, names: &mut CgroupNames) {
        let ids = self.cgroups.iter().filter_map(|r| r.cgroup_id);
        let ids: Vec<u64> = ids
            .chain(self.process_identities().filter_map(|p| p.cgroup_id))
            .collect();
        names.learn(ids);
        for r in &mut self.cgroups {
            r.cgroup = r.cgroup_id.map(|id| names.describe(id));
        }
        for p in self.process_identities_mut() {
            p.cgroup = p.cgroup_id.map(|id| names.describe(id));
        }
    }

    /// Every process row's identity: the processes', the leak summary's
    /// and the stack rows'.
    fn process_identities(&self) -> impl Iterator<Item = &ProcessIdentity> {
        let leak_procs = self.leaks.iter().flat_map(|l| &l.processes);
        let stack_procs = self.stacks.iter().flat_map(|s| &s.processes);
        (self.processes.iter().map(|r| &r.process))
            .chain(leak_procs.map(|r| &r.process))
            .chain(stack_procs.map(|r| &r.process))
    }

    fn process_identities_mut(&mut self) -> impl Iterator<Item = &mut ProcessIdentity> {
        let leak_procs = self.leaks.iter_mut().flat_map(|l| &mut l.processes);
        let stack_procs = self.stacks.iter_mut().flat_map(|s| &mut s.processes);
        (self.processes.iter_mut().map(|r| &mut r.process))
            .chain(leak_procs.map(|r| &mut r.process))
            .chain(stack_procs.map(|r| &mut r.process))
    }
}
