//! `--fail-if BUDGET` (kheap leaks, kheap malloc): a limit on what a run
//! leaves behind or allocates, checked against the end-of-run rows, so a
//! CI job fails when a command exceeds it.
//!
//! Grammar: `MEASURE[SOURCE]{site=PATTERN} > N`, the `[…]` and `{…}` parts
//! optional, spaces anywhere:
//! - MEASURE: `outstanding` (bytes still allocated at the end of what was
//!   allocated while tracing) or `allocated` (bytes allocated in all);
//! - SOURCE (leaks): `kmalloc`, `page`, `vmalloc` or `percpu`;
//! - PATTERN: the site's function, `*` matching any run of characters;
//! - N: bytes, with K, M or G (powers of 1024).

use crate::model::Source;

/// The status kheap exits with when a budget is exceeded (the command
/// itself having succeeded): distinct from kheap's own failures (1) and
/// usage errors (2).
pub const OVER_BUDGET_STATUS: i32 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    Outstanding,
    Allocated,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    /// As given, for the message.
    pub text: String,
    pub measure: Measure,
    pub source: Option<Source>,
    pub site: Option<String>,
    pub limit: u64,
}

/// A row as budgets see it (a site of the report).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetRow {
    pub function: String,
    pub source: Option<Source>,
    pub outstanding_bytes: u64,
    pub allocated_bytes: u64,
}

/// One budget exceeded, with the rows that count towards it (largest
/// first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exceeded<'a> {
    pub budget: &'a Budget,
    pub total: u64,
    pub rows: Vec<&'a BudgetRow>,
}

/// Bytes with an optional K, M or G (KiB, MiB, GiB) suffix.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, shift) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], 10),
        Some((i, 'M' | 'm')) => (&s[..i], 20),
        Some((i, 'G' | 'g')) => (&s[..i], 30),
        _ => (s, 0),
    };
    let v: u64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number of bytes (K, M, G allowed)"))?;
    v.checked_mul(1 << shift)
        .ok_or_else(|| format!("'{s}' is too large"))
}

/// `*` matches any run of characters; everything else itself.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    // The classic backtracking over the last star: linear in practice.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

pub fn parse(s: &str, sources_allowed: bool) -> Result<Budget, String> {
    let usage = || {
        format!(
            "--fail-if '{s}': expected MEASURE{} > N, MEASURE outstanding or allocated, N in bytes (K/M/G allowed), e.g. 'outstanding{{site=load_msg*}} > 1M'",
            if sources_allowed { "[SOURCE]{site=PATTERN}" } else { "{site=PATTERN}" }
        )
    };
    let (lhs, n) = s.split_once('>').ok_or_else(usage)?;
    let limit = parse_bytes(n).map_err(|e| format!("--fail-if '{s}': {e}"))?;
    let mut rest = lhs.trim();
    let measure = if let Some(r) = rest.strip_prefix("outstanding") {
        rest = r;
        Measure::Outstanding
    } else if let Some(r) = rest.strip_prefix("allocated") {
        rest = r;
        Measure::Allocated
    } else {
        return Err(usage());
    };
    let mut source = None;
    if let Some(r) = rest.trim_start().strip_prefix('[') {
        let (name, r) = r.split_once(']').ok_or_else(usage)?;
        if !sources_allowed {
            return Err(format!("--fail-if '{s}': this command has no sources"));
        }
        let found = Source::ALL.into_iter().find(|x| x.name() == name.trim());
        source = Some(found.ok_or_else(|| {
            format!("--fail-if '{s}': unknown source '{name}' (kmalloc, page, vmalloc, percpu)")
        })?);
        rest = r;
    }
    let mut site = None;
    if let Some(r) = rest.trim_start().strip_prefix('{') {
        let (inner, r) = r.split_once('}').ok_or_else(usage)?;
        let pattern = inner
            .trim()
            .strip_prefix("site")
            .and_then(|p| p.trim_start().strip_prefix('='))
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .ok_or_else(usage)?;
        site = Some(pattern.to_string());
        rest = r;
    }
    if !rest.trim().is_empty() {
        return Err(usage());
    }
    Ok(Budget {
        text: s.trim().to_string(),
        measure,
        source,
        site,
        limit,
    })
}

impl Budget {
    fn counts(&self, r: &BudgetRow) -> bool {
        self.source.is_none_or(|s| r.source == Some(s))
            && self
                .site
                .as_deref()
                .is_none_or(|p| glob_match(p, &r.function))
    }

    fn value(&self, r: &BudgetRow) -> u64 {
        match self.measure {
            Measure::Outstanding => r.outstanding_bytes,
            Measure::Allocated => r.allocated_bytes,
        }
    }

    /// The rows over this budget, if their sum is.
    pub fn check<'a>(&'a self, rows: &'a [BudgetRow]) -> Option<Exceeded<'a>> {
        let mut counted: Vec<&BudgetRow> = rows
            .iter()
            .filter(|r| self.counts(r) && self.value(r) > 0)
            .collect();
        let total: u64 = counted.iter().map(|r| self.value(r)).sum();
        if total <= self.limit {
            return None;
        }
        counted.sort_by_key(|r| std::cmp::Reverse(self.value(r)));
        Some(Exceeded {
            budget: self,
            total,
            rows: counted,
        })
    }
}

/// The lines saying what is over budget: per budget, its total, then the
/// largest rows counted (at most `max_rows`).
pub fn describe(over: &[Exceeded], max_rows: usize) -> String {
    let mut out = String::new();
    for e in over {
        let b = e.budget;
        out.push_str(&format!(
            "kheap: over budget: {} ({} bytes > {} bytes)\n",
            b.text, e.total, b.limit
        ));
        for r in e.rows.iter().take(max_rows) {
            let source = r.source.map(|s| format!(" [{s}]")).unwrap_or_default();
            let v = match b.measure {
                Measure::Outstanding => r.outstanding_bytes,
                Measure::Allocated => r.allocated_bytes,
            };
            out.push_str(&format!("  {}{source}: {v} bytes\n", r.function));
        }
        if e.rows.len() > max_rows {
            out.push_str(&format!("  … and {} more\n", e.rows.len() - max_rows));
        }
    }
    out
}

/// The run's status with budgets applied, and what to say on stderr: a
/// command that failed keeps its status; one that succeeded but left more
/// than a budget allows makes it [`OVER_BUDGET_STATUS`].
pub fn verdict(budgets: &[Budget], rows: &[BudgetRow], exit_code: i32) -> (i32, String) {
    let over: Vec<Exceeded> = budgets.iter().filter_map(|b| b.check(rows)).collect();
    if over.is_empty() {
        return (exit_code, String::new());
    }
    let code = if exit_code == 0 {
        OVER_BUDGET_STATUS
    } else {
        exit_code
    };
    (code, describe(&over, 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(function: &str, source: Source, outstanding: u64, allocated: u64) -> BudgetRow {
        BudgetRow {
            function: function.into(),
            source: Some(source),
            outstanding_bytes: outstanding,
            allocated_bytes: allocated,
        }
    }

    #[test]
    fn the_grammar() {
        let b = parse("outstanding > 1M", true).unwrap();
        assert_eq!(
            (b.measure, b.source, b.site.as_deref(), b.limit),
            (Measure::Outstanding, None, None, 1 << 20)
        );
        let b = parse(" allocated[page]{site = load_msg*} > 4096 ", true).unwrap();
        assert_eq!(
            (b.measure, b.source, b.site.as_deref(), b.limit),
            (
                Measure::Allocated,
                Some(Source::Page),
                Some("load_msg*"),
                4096
            )
        );
        for bad in [
            "outstanding",
            "outstanding > x",
            "leaked > 1",
            "outstanding[slab] > 1",
            "outstanding{func=x} > 1",
            "outstanding{site=} > 1",
            "outstanding junk > 1",
            "outstanding > 99999999999G",
        ] {
            let e = parse(bad, true).unwrap_err();
            assert!(e.starts_with("--fail-if"), "{bad}: {e}");
        }
        assert!(parse("outstanding[page] > 1", false)
            .unwrap_err()
            .contains("no sources"));
    }

    #[test]
    fn globs() {
        assert!(glob_match("load_msg*", "load_msg"));
        assert!(glob_match("*msg*", "load_msg.isra.0"));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(!glob_match("a*b*c", "axxbyy"));
        assert!(!glob_match("load_msg", "load_msg2"));
        assert!(glob_match("*", ""));
    }

    #[test]
    fn budgets_sum_the_rows_they_select_and_name_them() {
        let rows = [
            row("load_msg", Source::Kmalloc, 4096, 8192),
            row("newque", Source::Kmalloc, 256, 256),
            row("[page]", Source::Page, 0, 1 << 20),
        ];
        let b = parse("outstanding > 4352", true).unwrap();
        assert!(b.check(&rows).is_none(), "at the limit is within it");
        let b = parse("outstanding > 4351", true).unwrap();
        let e = b.check(&rows).unwrap();
        assert_eq!(e.total, 4352);
        assert_eq!(e.rows.len(), 2);
        assert_eq!(e.rows[0].function, "load_msg");
        let b = parse("allocated[page] > 1023K", true).unwrap();
        assert_eq!(b.check(&rows).unwrap().rows.len(), 1);
        let b = parse("outstanding{site=new*} > 255", true).unwrap();
        let over = [b.check(&rows).unwrap()];
        let text = describe(&over, 5);
        assert_eq!(
            text,
            "kheap: over budget: outstanding{site=new*} > 255 (256 bytes > 255 bytes)\n  newque [kmalloc]: 256 bytes\n"
        );
    }
}
