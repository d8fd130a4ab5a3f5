//! pprof export: a gzip-compressed `profile.proto` that `go tool pprof`
//! and every other pprof reader opens. Pure: no kernel access.
//!
//! Conventions follow Go's heap profiles, so readers label the views as
//! they do for Go: sample types `alloc_objects/count`, `alloc_space/bytes`
//! and, where outstanding memory is known, `inuse_objects/count`,
//! `inuse_space/bytes`. One sample per stack (kernel stacks: per stack and
//! process, labelled `process`, `pid` and `cgroup`); every location has a mapping
//! (`[kernel.kallsyms]` for kernel frames, the binary for user frames)
//! marked as already symbolized, so readers never try to symbolize.
//!
//! API: [`Builder::new`] with the sample types, [`Builder::add`] one
//! [`Sample`] per stack, [`Builder::comment`], then [`Builder::encode_gzip`].
//! [`from_report`] builds the profile of a `record`/`leaks` report.

pub mod proto;

use std::collections::HashMap;
use std::io::Write as _;

use flate2::write::GzEncoder;
use flate2::Compression;
use prost::Message as _;

use crate::model::Source;
use crate::render::SourceColumn;
use crate::report::{Report, StackProcess};
use crate::symbolize::user::UserFrame;

/// The mapping kernel frames belong to, named as `perf` names it.
pub const KERNEL_MAPPING: &str = "[kernel.kallsyms]";

/// A sample type: `alloc_objects/count` and so on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleType {
    AllocObjects,
    AllocSpace,
    InuseObjects,
    InuseSpace,
}

impl SampleType {
    pub fn name(self) -> &'static str {
        match self {
            SampleType::AllocObjects => "alloc_objects",
            SampleType::AllocSpace => "alloc_space",
            SampleType::InuseObjects => "inuse_objects",
            SampleType::InuseSpace => "inuse_space",
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            SampleType::AllocObjects | SampleType::InuseObjects => "count",
            SampleType::AllocSpace | SampleType::InuseSpace => "bytes",
        }
    }
}

/// One frame of a stack.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Frame {
    pub function: String,
    /// The mapping's file name: [`KERNEL_MAPPING`] or a binary's path.
    pub mapping: String,
    /// Address (or file offset) of the instruction; 0 when unknown.
    pub address: u64,
    pub file: Option<String>,
    pub line: Option<i64>,
}

impl Frame {
    /// A kernel frame from its `name+0xoff` form (an optional ` [module]`
    /// suffix is kept out of the function name).
    pub fn kernel(symbolized: &str) -> Frame {
        let head = symbolized.split(' ').next().unwrap_or(symbolized);
        let (name, off) = head.split_once("+0x").unwrap_or((head, "0"));
        Frame {
            function: name.to_string(),
            mapping: KERNEL_MAPPING.to_string(),
            address: u64::from_str_radix(off, 16).unwrap_or(0),
            file: None,
            line: None,
        }
    }
}

/// A label of a sample: a string (`cache=kmalloc-64`) or a number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Label {
    Str(String, String),
    Num(String, i64, Option<String>),
}

/// One stack and its values, in the order of the builder's sample types.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// Innermost frame first.
    pub frames: Vec<Frame>,
    pub values: Vec<i64>,
    pub labels: Vec<Label>,
}

/// Builds a profile: interns strings, functions, mappings and locations.
pub struct Builder {
    profile: proto::Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(String, Option<String>), u64>,
    mappings: HashMap<String, u64>,
    locations: HashMap<Frame, u64>,
    types: usize,
}

impl Builder {
    /// A profile with these sample types, `default` shown first by readers.
    /// The period type is `space/bytes`, as in Go's heap profiles.
    pub fn new(types: &[SampleType], default: SampleType, duration_ns: i64) -> Builder {
        let mut b = Builder {
            profile: proto::Profile::default(),
            strings: HashMap::new(),
            functions: HashMap::new(),
            mappings: HashMap::new(),
            locations: HashMap::new(),
            types: types.len(),
        };
        b.string("");
        for t in types {
            let vt = b.value_type(t.name(), t.unit());
            b.profile.sample_type.push(vt);
        }
        b.profile.period_type = Some(b.value_type("space", "bytes"));
        b.profile.period = 1;
        b.profile.default_sample_type = b.string(default.name());
        b.profile.duration_nanos = duration_ns;
        b.profile.time_nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        b
    }

    fn value_type(&mut self, ty: &str, unit: &str) -> proto::ValueType {
        proto::ValueType {
            r#type: self.string(ty),
            unit: self.string(unit),
        }
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    /// A line for the profile's comments (readers show them with the
    /// profile's header).
    pub fn comment(&mut self, text: &str) {
        let i = self.string(text);
        self.profile.comment.push(i);
    }

    fn mapping(&mut self, file: &str, has_lines: bool) -> u64 {
        if let Some(&id) = self.mappings.get(file) {
            if has_lines {
                let m = &mut self.profile.mapping[id as usize - 1];
                m.has_filenames = true;
                m.has_line_numbers = true;
            }
            return id;
        }
        let id = self.profile.mapping.len() as u64 + 1;
        let filename = self.string(file);
        self.profile.mapping.push(proto::Mapping {
            id,
            // Addresses are offsets (kernel: into the function; user: into
            // the file), so the mapping spans the whole address space.
            memory_start: 0,
            memory_limit: u64::MAX,
            filename,
            has_functions: true,
            has_filenames: has_lines,
            has_line_numbers: has_lines,
            ..Default::default()
        });
        self.mappings.insert(file.to_string(), id);
        id
    }

    fn function(&mut self, name: &str, file: Option<&str>) -> u64 {
        let key = (name.to_string(), file.map(str::to_string));
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        let (name_i, file_i) = (self.string(name), self.string(file.unwrap_or("")));
        self.profile.function.push(proto::Function {
            id,
            name: name_i,
            system_name: name_i,
            filename: file_i,
            start_line: 0,
        });
        self.functions.insert(key, id);
        id
    }

    fn location(&mut self, f: &Frame) -> u64 {
        if let Some(&id) = self.locations.get(f) {
            return id;
        }
        let mapping_id = self.mapping(&f.mapping, f.line.is_some());
        let function_id = self.function(&f.function, f.file.as_deref());
        let id = self.profile.location.len() as u64 + 1;
        self.profile.location.push(proto::Location {
            id,
            mapping_id,
            address: f.address,
            line: vec![proto::Line {
                function_id,
                line: f.line.unwrap_or(0),
            }],
            is_folded: false,
        });
        self.locations.insert(f.clone(), id);
        id
    }

    /// Adds one stack. Panics if `values` does not match the sample types
    /// (a programming error: readers reject such profiles).
    pub fn add(&mut self, s: &Sample) {
        assert_eq!(s.values.len(), self.types, "one value per sample type");
        let location_id = s.frames.iter().map(|f| self.location(f)).collect();
        let label = s
            .labels
            .iter()
            .map(|l| match l {
                Label::Str(k, v) => proto::Label {
                    key: self.string(k),
                    str: self.string(v),
                    ..Default::default()
                },
                Label::Num(k, n, unit) => proto::Label {
                    key: self.string(k),
                    num: *n,
                    num_unit: unit.as_deref().map_or(0, |u| self.string(u)),
                    ..Default::default()
                },
            })
            .collect();
        self.profile.sample.push(proto::Sample {
            location_id,
            value: s.values.clone(),
            label,
        });
    }

    pub fn profile(&self) -> &proto::Profile {
        &self.profile
    }

    /// The profile, protobuf-encoded then gzip-compressed (what pprof reads).
    pub fn encode_gzip(&self) -> Vec<u8> {
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(&self.profile.encode_to_vec())
            .expect("writing to a Vec cannot fail");
        gz.finish().expect("writing to a Vec cannot fail")
    }
}

/// An empty profile with Go's heap-profile sample types: `alloc_*`, and
/// `inuse_*` (the default view) when outstanding memory is known.
pub fn heap_profile(inuse: bool, duration_s: f64) -> Builder {
    const ALLOC: &[SampleType] = &[SampleType::AllocObjects, SampleType::AllocSpace];
    const ALLOC_AND_INUSE: &[SampleType] = &[
        SampleType::AllocObjects,
        SampleType::AllocSpace,
        SampleType::InuseObjects,
        SampleType::InuseSpace,
    ];
    let (types, default) = if inuse {
        (ALLOC_AND_INUSE, SampleType::InuseSpace)
    } else {
        (ALLOC, SampleType::AllocSpace)
    };
    Builder::new(types, default, (duration_s * 1e9) as i64)
}

/// The profile of a `record` or `leaks` report: one sample per stack (per
/// site, as a one-frame stack, when no stacks were captured), with
/// `inuse_*` values when the report knows what is outstanding.
pub fn from_report(r: &Report) -> Builder {
    let inuse = r.leaks.is_some();
    let sources = SourceColumn::of(r);
    let mut b = heap_profile(inuse, r.duration_s);
    b.comment(&format!("kheap: kernel heap, {:.2} s", r.duration_s));
    if r.sampling.stacks_estimated {
        b.comment(&format!(
            "stacks sampled 1 in {}: per-stack values are estimates, scaled within their site",
            r.sampling.stack_sample_every
        ));
    }
    for line in &r.sampling.incomplete {
        b.comment(&format!("incomplete: {line}"));
    }
    let values = |c: &crate::model::Counts, ret: Option<&crate::report::Retention>| {
        let mut v = vec![c.count as i64, c.bytes_alloc as i64];
        if inuse {
            let ret = ret.cloned().unwrap_or_default();
            v.push(ret.outstanding_count as i64);
            v.push(ret.outstanding_bytes as i64);
        }
        v
    };
    // The stacks' samples, each with its site's identity (call site,
    // source), known only for a report built in this run.
    let placed_known = r.stacks.iter().all(|s| s.site_call_site.is_some());
    let mut samples: Vec<(Option<(&str, Source)>, Sample)> = Vec::new();
    for s in &r.stacks {
        let site = s.site_call_site.as_deref().map(|cs| (cs, s.source));
        let mut labels = vec![Label::Str("cache".into(), s.cache.clone())];
        labels.extend(source_label(sources, s.source));
        if s.estimated {
            labels.push(Label::Str("estimated".into(), "true".into()));
        }
        let frames: Vec<Frame> = s.frames.iter().map(|f| Frame::kernel(f)).collect();
        if s.processes.is_empty() {
            let sample = Sample {
                frames,
                values: values(&s.counts, s.retention.as_ref()),
                labels,
            };
            samples.push((site, sample));
            continue;
        }
        // One sample per process (and cgroup) that made the stack.
        for p in &s.processes {
            let mut v = vec![p.count as i64, p.bytes_alloc as i64];
            if inuse {
                v.push(p.outstanding_count.unwrap_or(0) as i64);
                v.push(p.outstanding_bytes.unwrap_or(0) as i64);
            }
            let mut labels = labels.clone();
            labels.extend(owner_labels(p));
            let sample = Sample {
                frames: frames.clone(),
                values: v,
                labels,
            };
            samples.push((site, sample));
        }
    }
    // Every site is in the profile: what its sampled stacks leave out (all
    // of it when none was sampled) is one sample of the site's own frame,
    // so that each site, and the profile, adds up to the exact totals of
    // the report's site rows.
    if r.stacks.is_empty() && !r.sites.is_empty() {
        b.comment("no stacks captured: one single-frame sample per call site");
    } else if placed_known && !r.sites.is_empty() {
        b.comment("what no sampled stack stands for is a single-frame sample of its call site, labelled unsampled=true: each site adds up to its exact totals");
    }
    let mut rests = Vec::new();
    // Read back from JSON, which site a stack belongs to is not known: the
    // stacks alone.
    for s in r.sites.iter().filter(|_| placed_known) {
        let id = Some((s.call_site.as_str(), s.source));
        let mut rest = values(&s.counts, s.retention.as_ref());
        for (_, smp) in samples.iter().filter(|(site, _)| *site == id) {
            rest.iter_mut().zip(&smp.values).for_each(|(v, p)| *v -= p);
        }
        // Scaled stacks rounded up beyond the site's total: taken off the
        // site's largest sample of that value, not shown as a negative one
        // (pprof's totals add absolute values).
        for (i, v) in rest.iter_mut().enumerate().filter(|(_, v)| **v < 0) {
            if let Some((_, smp)) = samples
                .iter_mut()
                .filter(|(site, _)| *site == id)
                .max_by_key(|(_, smp)| smp.values[i])
                .filter(|(_, smp)| smp.values[i] + *v >= 0)
            {
                smp.values[i] += *v;
                *v = 0;
            }
        }
        if rest.iter().all(|&v| v == 0) {
            continue;
        }
        let mut labels: Vec<Label> = s
            .caches
            .iter()
            .map(|c| Label::Str("cache".into(), c.clone()))
            .collect();
        labels.extend(source_label(sources, s.source));
        if !r.stacks.is_empty() {
            labels.push(Label::Str("unsampled".into(), "true".into()));
        }
        rests.push(Sample {
            frames: vec![Frame::kernel(&s.location)],
            values: rest,
            labels,
        });
    }
    for (_, smp) in &samples {
        b.add(smp);
    }
    for smp in &rests {
        b.add(smp);
    }
    b
}

/// The `source` label of a sample (`-tagfocus source=page`), when the
/// report traces more than the slab.
pub fn source_label(shown: SourceColumn, source: Source) -> Option<Label> {
    shown
        .0
        .then(|| Label::Str("source".into(), source.name().into()))
}

/// `process` as `comm [pid]` (as malloc profiles have it), the same as a
/// number in `pid` (for `-tagfocus=pid=N`), and `cgroup`, the cgroup v2
/// path (its id when the path is not known). Interrupt context is
/// `process=interrupt`, with no pid and no cgroup.
fn owner_labels(p: &StackProcess) -> Vec<Label> {
    let mut labels = process_labels(p.process.pid, p.process.comm.as_deref().unwrap_or_default());
    if p.process.pid.is_none() {
        return labels;
    }
    if let Some(c) = &p.process.cgroup {
        let path = c
            .path
            .clone()
            .unwrap_or_else(|| format!("cgroup id {}", c.id));
        labels.push(Label::Str("cgroup".into(), path));
    }
    labels
}

/// `process` as `comm [pid]` and `pid` as a number, or
/// `process=interrupt` (no pid) for interrupt context: the process labels
/// of every kernel profile.
pub fn process_labels(pid: Option<u32>, comm: &str) -> Vec<Label> {
    match pid {
        None => vec![Label::Str("process".into(), "interrupt".into())],
        Some(pid) => vec![
            Label::Str("process".into(), process_label(comm, pid)),
            Label::Num("pid".into(), pid.into(), None),
        ],
    }
}

/// The `process` label of a sample.
pub fn process_label(comm: &str, pid: u32) -> String {
    format!("{comm} [{pid}]")
}

/// A user frame: its binary as the mapping, `file:line` where known.
pub fn user_frame(f: &UserFrame) -> Frame {
    let (file, line) = match f.source.as_deref().and_then(|s| s.rsplit_once(':')) {
        Some((file, line)) => (Some(file.to_string()), line.parse().ok()),
        None => (f.source.clone(), None),
    };
    Frame {
        function: f.name(),
        mapping: f.module.clone().unwrap_or_else(|| "[anon]".into()),
        address: if f.module.is_some() {
            f.file_offset
        } else {
            f.addr
        },
        file,
        line,
    }
}

/// An i128 (a diff's change) as pprof's int64, capped at its ends.
pub fn clamp_i64(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

/// Reading profiles back, for the tests of every profile writer.
#[cfg(test)]
pub mod test_support {
    use super::proto;
    use prost::Message as _;

    pub fn decode_gzip(gz: &[u8]) -> proto::Profile {
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(gz), &mut raw).unwrap();
        proto::Profile::decode(&raw[..]).unwrap()
    }

    /// Each sample's string label `key` (None without one) and first value.
    pub fn label_values(p: &proto::Profile, key: &str) -> Vec<(Option<String>, i64)> {
        let s = |i: i64| p.string_table[i as usize].clone();
        p.sample
            .iter()
            .map(|smp| {
                let label = smp.label.iter().find(|l| s(l.key) == key);
                (label.map(|l| s(l.str)), smp.value[0])
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
