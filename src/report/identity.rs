//! Who a per-process row is about: the identity every per-process row of
//! a report starts with.

use serde::{Deserialize, Serialize};

use crate::cgroup::CgroupRef;

/// Who made a row's allocations: a process, with the cgroup v2 it made
/// them in, or interrupt context, which is no process's. Every per-process
/// row (`processes`, `leaks.processes` and the stack rows' `processes`)
/// starts with these fields; each row's doc says which allocation its
/// cgroup is from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessIdentity {
    /// null in interrupt context.
    pub pid: Option<u32>,
    /// null in interrupt context; empty when the name is not known (or the
    /// process had exited by the time of the snapshot).
    pub comm: Option<String>,
    /// The cgroup v2; null when unknown and in interrupt context.
    #[serde(default)]
    pub cgroup: Option<CgroupRef>,
    /// Allocated in hard/soft interrupt or NMI context.
    pub interrupt: bool,
    /// The cgroup's id, until `Report::name_cgroups` resolves it.
    #[serde(skip)]
    pub cgroup_id: Option<u64>,
}

impl ProcessIdentity {
    /// A process (`pid` Some, named by `comm_of`) or interrupt context
    /// (`pid` None), with the id of its cgroup, if known.
    pub fn new(
        pid: Option<u32>,
        comm_of: impl FnOnce(u32) -> String,
        cgroup_id: Option<u64>,
    ) -> Self {
        ProcessIdentity {
            pid,
            comm: pid.map(comm_of),
            cgroup: cgroup_id.map(CgroupRef::unnamed),
            interrupt: pid.is_none(),
            cgroup_id,
        }
    }

    /// How views name it: `comm [pid]` (`?` for a name not known), or
    /// `interrupt`.
    pub fn name(&self) -> String {
        match self.pid {
            None => "interrupt".to_string(),
            Some(pid) => {
                let comm = self.comm.as_deref().filter(|c| !c.is_empty());
                format!("{} [{pid}]", comm.unwrap_or("?"))
            }
        }
    }
}
