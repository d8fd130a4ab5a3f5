//! The pprof profile of a `malloc` report, beside the report it is made
//! from (the profile format itself is `crate::render::pprof`).

use crate::render::pprof::{
    heap_profile, process_label, user_frame, Builder, Frame, Label, Sample,
};

use super::report::MallocReport;

/// The profile of a `malloc` report: one sample per stack, the allocator
/// function as the leaf frame, `inuse_*` values with --outstanding.
pub fn profile(r: &MallocReport) -> Builder {
    let inuse = r.totals.outstanding.is_some();
    let mut b = heap_profile(inuse, r.duration_s);
    b.comment(&format!(
        "kheap malloc: user-space allocations, {:.2} s; space is bytes requested",
        r.duration_s
    ));
    for s in &r.stacks {
        let mut frames = vec![Frame {
            function: s.allocator.clone(),
            mapping: r
                .probes
                .first()
                .map(|p| p.split(':').next().unwrap_or(p).to_string())
                .unwrap_or_else(|| "[allocator]".into()),
            ..Default::default()
        }];
        frames.extend(s.user_frames.iter().map(user_frame));
        let mut values = vec![s.counts.count as i64, s.counts.bytes_req as i64];
        if inuse {
            let o = s.outstanding.clone().unwrap_or_default();
            values.extend([o.count as i64, o.bytes as i64]);
        }
        let mut labels = vec![Label::Str("allocator".into(), s.allocator.clone())];
        labels.extend(
            s.processes
                .iter()
                .map(|p| Label::Str("process".into(), process_label(&p.comm, p.pid))),
        );
        b.add(&Sample {
            frames,
            values,
            labels,
        });
    }
    b
}
