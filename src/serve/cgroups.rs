//! The label values of the per-cgroup series (`kheap serve --by-cgroup`):
//! the cgroup's path, the container its path names, and whether the bytes
//! are charged to its memory cgroup. Pure.

use std::collections::HashMap;

use crate::cgroup::CgroupNames;
use crate::model::{AllocStats, CgroupKey, CgroupSlot};
use crate::serve::series::LabelValues;

/// The labels of the cgroup series, in order.
pub const LABELS: [&str; 3] = ["cgroup", "container", "accounted"];

/// The `cgroup` label of allocations made in interrupt context (not the
/// interrupted task's).
pub const INTERRUPT: &str = "[interrupt]";

fn values(key: &CgroupKey, names: &CgroupNames) -> LabelValues {
    let (cgroup, container) = match key.slot {
        CgroupSlot::Interrupt => (INTERRUPT.to_string(), String::new()),
        CgroupSlot::Cgroup(id) => {
            let r = names.describe(id);
            let container = r.container.map(|c| c.name).unwrap_or_default();
            // A cgroup created and removed between two walks has no path.
            (r.path.unwrap_or_else(|| format!("[id {id}]")), container)
        }
    };
    vec![cgroup, container, key.accounted.to_string()]
}

/// One interval's per-cgroup deltas by label values (ids of one path, if
/// any, summed).
pub fn by_values(
    delta: &HashMap<CgroupKey, AllocStats>,
    names: &CgroupNames,
) -> HashMap<LabelValues, AllocStats> {
    let mut out: HashMap<LabelValues, AllocStats> = HashMap::new();
    for (k, s) in delta {
        *out.entry(values(k, names)).or_default() += *s;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(count: u64) -> AllocStats {
        AllocStats {
            count,
            bytes_req: count * 100,
            bytes_alloc: count * 128,
            ..AllocStats::default()
        }
    }

    #[test]
    fn paths_containers_and_interrupts_label_the_rows() {
        let mut names = CgroupNames::new(None);
        names.insert(
            7,
            "/system.slice/docker-0123456789abcdef0123456789abcdef.scope".into(),
        );
        let key = |slot, accounted| CgroupKey { slot, accounted };
        let delta = HashMap::from([
            (key(CgroupSlot::Cgroup(7), true), stats(3)),
            (key(CgroupSlot::Cgroup(9), false), stats(2)),
            (key(CgroupSlot::Interrupt, false), stats(1)),
        ]);
        let got = by_values(&delta, &names);
        let v = |a: &str, b: &str, c: &str| vec![a.to_string(), b.to_string(), c.to_string()];
        assert_eq!(
            got[&v(
                "/system.slice/docker-0123456789abcdef0123456789abcdef.scope",
                "docker:0123456789ab",
                "true"
            )]
                .count,
            3
        );
        assert_eq!(got[&v("[id 9]", "", "false")].count, 2);
        assert_eq!(got[&v(INTERRUPT, "", "false")].count, 1);
    }
}
