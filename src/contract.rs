//! The JSON contract: every JSON document kheap writes (and each line of
//! `top -b --format json` and `slab --watch --format json`) starts with
//! `"kind"` and `"schema_version"`, so a reader knows what it holds without
//! guessing from its fields. The fields that follow are described by
//! `schema/<kind>.schema.json` and docs/json.md. Pure.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// Bumped when a field is renamed or removed, or changes meaning; adding a
/// field is not a new version.
pub const SCHEMA_VERSION: u32 = 1;

/// What a JSON document is: the subcommand that wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Record,
    Leaks,
    Top,
    Slab,
    Malloc,
    Diff,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Record => "record",
            Kind::Leaks => "leaks",
            Kind::Top => "top",
            Kind::Slab => "slab",
            Kind::Malloc => "malloc",
            Kind::Diff => "diff",
        }
    }
}

/// A body with the contract's two leading fields.
#[derive(Serialize)]
struct Tagged<'a, T: Serialize> {
    kind: Kind,
    schema_version: u32,
    #[serde(flatten)]
    body: &'a T,
}

fn tagged<T: Serialize>(kind: Kind, body: &T) -> Tagged<'_, T> {
    Tagged {
        kind,
        schema_version: SCHEMA_VERSION,
        body,
    }
}

/// A whole report, indented, with a final newline.
pub fn pretty<T: Serialize>(kind: Kind, body: &T) -> String {
    serde_json::to_string_pretty(&tagged(kind, body)).expect("kheap's reports always serialize")
        + "\n"
}

/// One record of a stream (JSON Lines): one line, newline included.
pub fn line<T: Serialize>(kind: Kind, body: &T) -> String {
    serde_json::to_string(&tagged(kind, body)).expect("kheap's reports always serialize") + "\n"
}

/// The header of a kheap JSON document.
#[derive(Deserialize)]
struct Header {
    kind: Option<serde_json::Value>,
    schema_version: Option<serde_json::Value>,
}

/// Reads a kheap JSON document `what` (a file name, for messages): its kind
/// and its whole value. Says in one line what is wrong with anything else.
pub fn read(text: &str, what: &str) -> Result<(Kind, serde_json::Value)> {
    let value: serde_json::Value =
        serde_json::from_str(text).with_context(|| format!("{what} is not JSON"))?;
    let header: Header = serde_json::from_value(value.clone())
        .with_context(|| format!("{what} is not a kheap JSON report (not a JSON object)"))?;
    let Some(kind) = header.kind else {
        bail!(
            "{what} is not a kheap JSON report: it has no \"kind\" (write one with --format json)"
        );
    };
    let kind: Kind = serde_json::from_value(kind.clone())
        .map_err(|_| anyhow::anyhow!("{what}: unknown report kind {kind}"))?;
    match header.schema_version.as_ref().and_then(|v| v.as_u64()) {
        Some(v) if v == u64::from(SCHEMA_VERSION) => Ok((kind, value)),
        Some(v) => bail!(
            "{what} has schema_version {v}; this kheap reads version {SCHEMA_VERSION}: use the kheap that wrote it"
        ),
        None => bail!("{what} has no schema_version: it is not a kheap JSON report"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Body {
        duration_s: f64,
        rows: Vec<u32>,
    }

    #[test]
    fn kind_and_version_come_first() {
        let body = Body {
            duration_s: 1.5,
            rows: vec![1, 2],
        };
        let text = pretty(Kind::Leaks, &body);
        assert!(
            text.starts_with("{\n  \"kind\": \"leaks\",\n  \"schema_version\": 1,\n"),
            "{text}"
        );
        assert!(text.ends_with("}\n"));
        let l = line(Kind::Top, &body);
        assert!(
            l.starts_with("{\"kind\":\"top\",\"schema_version\":1,\"duration_s\":1.5"),
            "{l}"
        );
        assert_eq!(l.lines().count(), 1);
        let (kind, v) = read(&text, "a.json").unwrap();
        assert_eq!(kind, Kind::Leaks);
        assert_eq!(v["rows"][1], 2);
    }

    #[test]
    fn anything_else_is_refused_in_one_line() {
        let err = |t: &str| format!("{:#}", read(t, "x.json").unwrap_err());
        assert!(err("{\"sites\": []}").contains("has no \"kind\""));
        assert!(err("{\"kind\": \"nope\", \"schema_version\": 1}").contains("unknown report kind"));
        assert!(err("{\"kind\": \"record\", \"schema_version\": 7}").contains("schema_version 7"));
        assert!(err("{\"kind\": \"record\"}").contains("no schema_version"));
        assert!(err("[1]").contains("not a kheap JSON report"));
        assert!(err("nope").starts_with("x.json is not JSON"));
        for e in [err("{}"), err("[1]"), err("nope")] {
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
