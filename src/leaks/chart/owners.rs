//! Who allocated each series' memory, as far as the report knows: the
//! processes of the site's sampled stack rows (`processes` of each stack
//! row whose site is the series'; in the series' cgroup, or interrupt
//! context, with `--by cgroup`), largest first.

use std::collections::HashMap;

use crate::report::timeline::Series;
use crate::report::{Report, StackProcess};

/// One process (or interrupt context) and the bytes it allocated at the
/// series' site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// `comm[pid]`, or `interrupt`.
    pub name: String,
    pub bytes_alloc: u64,
}

/// For each series, its owners, largest first (empty where no stack row
/// of its site was sampled, or the run kept no owners).
pub fn of_series(report: &Report, series: &[Series]) -> Vec<Vec<Owner>> {
    series
        .iter()
        .map(|s| {
            let mut by_name: HashMap<String, u64> = HashMap::new();
            for row in report.stacks.iter().filter(|r| {
                r.source == s.source && r.site_call_site.as_deref() == Some(s.call_site.as_str())
            }) {
                for p in row.processes.iter().filter(|p| belongs(p, s)) {
                    *by_name.entry(p.process.name()).or_default() += p.bytes_alloc;
                }
            }
            let mut owners: Vec<Owner> = by_name
                .into_iter()
                .map(|(name, bytes_alloc)| Owner { name, bytes_alloc })
                .collect();
            owners.sort_by(|a, b| b.bytes_alloc.cmp(&a.bytes_alloc).then(a.name.cmp(&b.name)));
            owners
        })
        .collect()
}

/// Whether a stack row's process is in the series (a series of one
/// cgroup, or of interrupt context, has only those).
fn belongs(p: &StackProcess, s: &Series) -> bool {
    if s.interrupt {
        p.process.interrupt
    } else if let Some(c) = &s.cgroup {
        !p.process.interrupt && p.process.cgroup.as_ref().is_some_and(|g| g.id == c.id)
    } else {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::CgroupRef;
    use crate::model::Source;
    use crate::report::rows::StackRow;
    use crate::report::ProcessIdentity;

    fn proc(pid: u32, comm: &str, bytes: u64) -> StackProcess {
        StackProcess {
            process: ProcessIdentity {
                pid: Some(pid),
                comm: Some(comm.into()),
                ..ProcessIdentity::default()
            },
            bytes_alloc: bytes,
            ..StackProcess::default()
        }
    }

    fn stack(call_site: &str, source: Source, processes: Vec<StackProcess>) -> StackRow {
        StackRow {
            source,
            site_call_site: Some(call_site.into()),
            processes,
            ..StackRow::default()
        }
    }

    fn series(call_site: &str, source: Source) -> Series {
        Series {
            function: "f".into(),
            call_site: call_site.into(),
            source,
            cgroup: None,
            interrupt: false,
        }
    }

    #[test]
    fn a_series_is_owned_by_its_sites_stack_processes_summed_largest_first() {
        let report = Report {
            stacks: vec![
                stack(
                    "f+0x10",
                    Source::Kmalloc,
                    vec![proc(7, "<b>", 100), proc(9, "sh", 50)],
                ),
                stack("f+0x10", Source::Kmalloc, vec![proc(9, "sh", 200)]),
                // Another call site of f, and f+0x10 of another source.
                stack("f+0x20", Source::Kmalloc, vec![proc(1, "init", 1000)]),
                stack("f+0x10", Source::Vmalloc, vec![proc(2, "kthreadd", 1000)]),
            ],
            ..Report::default()
        };
        let owners = of_series(
            &report,
            &[
                series("f+0x10", Source::Kmalloc),
                series("g+0x1", Source::Kmalloc),
            ],
        );
        let names: Vec<(&str, u64)> = owners[0]
            .iter()
            .map(|o| (o.name.as_str(), o.bytes_alloc))
            .collect();
        assert_eq!(names, [("sh [9]", 250), ("<b> [7]", 100)]);
        assert!(
            owners[1].is_empty(),
            "no stack of its site: no owner guessed"
        );
    }

    #[test]
    fn a_cgroups_series_has_its_cgroups_processes_and_interrupts_their_own() {
        let in_cg = |id| Some(CgroupRef::unnamed(id));
        let mut a = proc(7, "a", 10);
        a.process.cgroup = in_cg(5);
        let mut b = proc(8, "b", 20);
        b.process.cgroup = in_cg(6);
        let irq = StackProcess {
            process: ProcessIdentity {
                interrupt: true,
                ..ProcessIdentity::default()
            },
            bytes_alloc: 30,
            ..StackProcess::default()
        };
        let report = Report {
            stacks: vec![stack("f+0x10", Source::Kmalloc, vec![a, b, irq])],
            ..Report::default()
        };
        let mut of5 = series("f+0x10", Source::Kmalloc);
        of5.cgroup = in_cg(5);
        let mut of_irq = series("f+0x10", Source::Kmalloc);
        of_irq.interrupt = true;
        let owners = of_series(&report, &[of5, of_irq]);
        assert_eq!(
            owners[0],
            [Owner {
                name: "a [7]".into(),
                bytes_alloc: 10
            }]
        );
        assert_eq!(
            owners[1],
            [Owner {
                name: "interrupt".into(),
                bytes_alloc: 30
            }]
        );
    }
}
