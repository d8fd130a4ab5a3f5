//! The Prometheus text format (0.0.4) and OpenMetrics 1.0, written by hand:
//! the families are built once per interval by the reading thread, and a
//! scrape only formats them (10,000 series in a few milliseconds). Pure.

use std::fmt::Write;

/// What a family measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One sample's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(u64),
    Float(f64),
    /// Cumulative bucket counts by upper bound (`le`), then +Inf implied by
    /// `count`.
    Histogram {
        buckets: Vec<(u64, u64)>,
        sum: u64,
        count: u64,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Values of the family's labels, in the same order.
    pub labels: Vec<String>,
    pub value: Value,
}

/// One metric family. `name` is the OpenMetrics family name: counters get
/// `_total` on their samples (and, in the Prometheus format, their TYPE).
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    pub name: String,
    pub help: &'static str,
    pub kind: Kind,
    /// "bytes" or "seconds" when the name ends with it (OpenMetrics UNIT).
    pub unit: Option<&'static str>,
    pub label_names: Vec<&'static str>,
    pub samples: Vec<Sample>,
}

impl Family {
    pub fn new(name: &str, kind: Kind, help: &'static str, label_names: &[&'static str]) -> Family {
        let unit = ["bytes", "seconds"]
            .into_iter()
            .find(|u| name.ends_with(&format!("_{u}")));
        Family {
            name: name.to_string(),
            help,
            kind,
            unit,
            label_names: label_names.to_vec(),
            samples: Vec::new(),
        }
    }

    pub fn push(&mut self, labels: Vec<String>, value: Value) {
        debug_assert_eq!(labels.len(), self.label_names.len());
        self.samples.push(Sample { labels, value });
    }

    /// A family with one unlabelled sample.
    pub fn single(name: &str, kind: Kind, help: &'static str, value: Value) -> Family {
        let mut f = Family::new(name, kind, help, &[]);
        f.push(Vec::new(), value);
        f
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `text/plain; version=0.0.4`
    Prometheus,
    /// `application/openmetrics-text; version=1.0.0`
    OpenMetrics,
}

impl Format {
    /// The format an `Accept` header asks for: OpenMetrics when it is
    /// accepted with a non-zero quality, else the Prometheus text format.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::Prometheus;
        };
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            if parts.next() != Some("application/openmetrics-text") {
                continue;
            }
            let q = parts
                .find_map(|p| p.strip_prefix("q="))
                .and_then(|q| q.parse::<f64>().ok())
                .unwrap_or(1.0);
            if q > 0.0 {
                return Format::OpenMetrics;
            }
        }
        Format::Prometheus
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// Escapes a label value (both formats): backslash, double quote, newline.
fn escape_into(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// HELP text escaping: backslash and newline (OpenMetrics also escapes
/// quotes there; help texts here have none).
fn escape_help(h: &str) -> String {
    h.replace('\\', "\\\\").replace('\n', "\\n")
}

fn labels_into(out: &mut String, names: &[&str], values: &[String], extra: Option<(&str, &str)>) {
    if names.is_empty() && extra.is_none() {
        return;
    }
    out.push('{');
    let mut first = true;
    for (n, v) in names.iter().zip(values) {
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str(n);
        out.push_str("=\"");
        escape_into(out, v);
        out.push('"');
    }
    if let Some((n, v)) = extra {
        if !first {
            out.push(',');
        }
        let _ = write!(out, "{n}=\"{v}\"");
    }
    out.push('}');
}

fn value_into(out: &mut String, v: &Value) {
    match v {
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::Float(f) if f.is_finite() => {
            let _ = write!(out, "{f}");
        }
        Value::Float(f) if f.is_nan() => out.push_str("NaN"),
        Value::Float(f) => out.push_str(if *f > 0.0 { "+Inf" } else { "-Inf" }),
        Value::Histogram { .. } => unreachable!("histograms are written bucket by bucket"),
    }
}

/// Writes every family in `format`.
pub fn encode(families: &[Family], format: Format) -> String {
    encode_groups(&[families], format)
}

/// Writes the families of several groups, in order, as one exposition (the
/// per-interval families, then those a scrape adds itself).
pub fn encode_groups(groups: &[&[Family]], format: Format) -> String {
    let samples: usize = groups
        .iter()
        .flat_map(|g| g.iter())
        .map(|f| f.samples.len())
        .sum();
    let mut out = String::with_capacity(samples * 96 + 4096);
    for f in groups.iter().flat_map(|g| g.iter()) {
        let typed_name = match (f.kind, format) {
            (Kind::Counter, Format::Prometheus) => format!("{}_total", f.name),
            _ => f.name.clone(),
        };
        let kind = match f.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(out, "# HELP {typed_name} {}", escape_help(f.help));
        let _ = writeln!(out, "# TYPE {typed_name} {kind}");
        if let (Some(unit), Format::OpenMetrics) = (f.unit, format) {
            let _ = writeln!(out, "# UNIT {typed_name} {unit}");
        }
        for s in &f.samples {
            match &s.value {
                Value::Histogram {
                    buckets,
                    sum,
                    count,
                } => {
                    for (le, c) in buckets {
                        out.push_str(&f.name);
                        out.push_str("_bucket");
                        labels_into(
                            &mut out,
                            &f.label_names,
                            &s.labels,
                            Some(("le", &le.to_string())),
                        );
                        let _ = writeln!(out, " {c}");
                    }
                    out.push_str(&f.name);
                    out.push_str("_bucket");
                    labels_into(&mut out, &f.label_names, &s.labels, Some(("le", "+Inf")));
                    let _ = writeln!(out, " {count}");
                    for (suffix, v) in [("_sum", sum), ("_count", count)] {
                        out.push_str(&f.name);
                        out.push_str(suffix);
                        labels_into(&mut out, &f.label_names, &s.labels, None);
                        let _ = writeln!(out, " {v}");
                    }
                }
                v => {
                    out.push_str(&f.name);
                    if f.kind == Kind::Counter {
                        out.push_str("_total");
                    }
                    labels_into(&mut out, &f.label_names, &s.labels, None);
                    out.push(' ');
                    value_into(&mut out, v);
                    out.push('\n');
                }
            }
        }
    }
    if format == Format::OpenMetrics {
        out.push_str("# EOF\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_families() -> Vec<Family> {
        let mut c = Family::new(
            "kheap_cache_allocated_bytes",
            Kind::Counter,
            "Bytes allocated",
            &["cache"],
        );
        c.push(vec!["kmalloc-64".into()], Value::Int(640));
        c.push(vec!["we\"ird\\na\nme".into()], Value::Int(1));
        let mut h = Family::new(
            "kheap_cache_request_size_bytes",
            Kind::Histogram,
            "Requested sizes",
            &["cache"],
        );
        h.push(
            vec!["kmalloc-64".into()],
            Value::Histogram {
                buckets: vec![(31, 2), (63, 10)],
                sum: 400,
                count: 10,
            },
        );
        vec![
            c,
            h,
            Family::single("kheap_up", Kind::Gauge, "1", Value::Float(0.5)),
        ]
    }

    #[test]
    fn prometheus_text() {
        let text = encode(&sample_families(), Format::Prometheus);
        let expected = "\
# HELP kheap_cache_allocated_bytes_total Bytes allocated
# TYPE kheap_cache_allocated_bytes_total counter
kheap_cache_allocated_bytes_total{cache=\"kmalloc-64\"} 640
kheap_cache_allocated_bytes_total{cache=\"we\\\"ird\\\\na\\nme\"} 1
# HELP kheap_cache_request_size_bytes Requested sizes
# TYPE kheap_cache_request_size_bytes histogram
kheap_cache_request_size_bytes_bucket{cache=\"kmalloc-64\",le=\"31\"} 2
kheap_cache_request_size_bytes_bucket{cache=\"kmalloc-64\",le=\"63\"} 10
kheap_cache_request_size_bytes_bucket{cache=\"kmalloc-64\",le=\"+Inf\"} 10
kheap_cache_request_size_bytes_sum{cache=\"kmalloc-64\"} 400
kheap_cache_request_size_bytes_count{cache=\"kmalloc-64\"} 10
# HELP kheap_up 1
# TYPE kheap_up gauge
kheap_up 0.5
";
        assert_eq!(text, expected);
    }

    #[test]
    fn openmetrics_names_counter_families_without_total_and_ends_with_eof() {
        let text = encode(&sample_families(), Format::OpenMetrics);
        assert!(text.contains("# TYPE kheap_cache_allocated_bytes counter\n"));
        assert!(text.contains("# UNIT kheap_cache_allocated_bytes bytes\n"));
        assert!(text.contains("\nkheap_cache_allocated_bytes_total{cache=\"kmalloc-64\"} 640\n"));
        assert!(text.contains("# UNIT kheap_cache_request_size_bytes bytes\n"));
        assert!(!text.contains("# UNIT kheap_up"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn accept_header_negotiation() {
        assert_eq!(Format::negotiate(None), Format::Prometheus);
        assert_eq!(Format::negotiate(Some("*/*")), Format::Prometheus);
        // What Prometheus 2.x sends.
        let prom = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prom)), Format::OpenMetrics);
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text; q=0, text/plain")),
            Format::Prometheus
        );
    }
}
