//! The chart's series labels, no two alike: two series whose names would
//! read the same (two call sites in `copy_process`, both `[kmalloc]`) get
//! what tells them apart, the first detail the report knows that does
//! (the caches they allocate from, then the call site itself), and a
//! number only when nothing else does.

use std::collections::HashMap;

/// A series' name, and what else is known of it, in the order worth
/// saying (e.g. `cache task_struct`, then `at copy_process+0x1f3`).
#[derive(Clone, Debug, Default)]
pub struct Candidate {
    pub name: String,
    pub details: Vec<String>,
}

/// One label per candidate, all different.
pub fn unique(candidates: &[Candidate]) -> Vec<String> {
    let mut labels: Vec<String> = candidates.iter().map(|c| c.name.clone()).collect();
    for group in clashes(&labels) {
        let detail = (0..)
            .take_while(|&k| group.iter().any(|&i| candidates[i].details.len() > k))
            .find(|&k| all_differ(group.iter().map(|&i| detail_of(&candidates[i], k))));
        if let Some(k) = detail {
            for &i in &group {
                let d = detail_of(&candidates[i], k);
                if !d.is_empty() {
                    labels[i] = format!("{} ({d})", candidates[i].name);
                }
            }
        }
    }
    // Nothing told them apart (or a label made above met another's name):
    // number them, as often as it takes.
    for _ in 0..candidates.len() {
        let groups = clashes(&labels);
        if groups.is_empty() {
            break;
        }
        for group in groups {
            for (n, &i) in group.iter().enumerate() {
                labels[i] = format!("{} #{}", labels[i], n + 1);
            }
        }
    }
    labels
}

fn detail_of(c: &Candidate, k: usize) -> &str {
    c.details.get(k).map_or("", String::as_str)
}

fn all_differ<'a>(mut values: impl Iterator<Item = &'a str>) -> bool {
    let mut seen = std::collections::HashSet::new();
    values.all(|v| seen.insert(v))
}

/// The indices of labels that occur more than once, grouped, in order.
fn clashes(labels: &[String]) -> Vec<Vec<usize>> {
    let mut by_label: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, l) in labels.iter().enumerate() {
        by_label.entry(l).or_default().push(i);
    }
    let mut groups: Vec<Vec<usize>> = by_label.into_values().filter(|g| g.len() > 1).collect();
    groups.sort();
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str, details: &[&str]) -> Candidate {
        Candidate {
            name: name.into(),
            details: details.iter().map(|d| d.to_string()).collect(),
        }
    }

    fn all_different(labels: &[String]) {
        let set: std::collections::HashSet<&String> = labels.iter().collect();
        assert_eq!(set.len(), labels.len(), "{labels:?}");
    }

    #[test]
    fn different_names_are_left_alone() {
        let l = unique(&[
            c("a [kmalloc]", &["cache x"]),
            c("b [kmalloc]", &["cache x"]),
        ]);
        assert_eq!(l, ["a [kmalloc]", "b [kmalloc]"]);
    }

    #[test]
    fn two_of_one_name_get_the_first_detail_that_differs() {
        let l = unique(&[
            c(
                "copy_process [kmalloc]",
                &["cache task_struct", "at copy_process+0x1f3"],
            ),
            c(
                "load_msg [kmalloc]",
                &["cache kmalloc-4k", "at load_msg+0x2a"],
            ),
            c(
                "copy_process [kmalloc]",
                &["cache signal_cache", "at copy_process+0x2b0"],
            ),
        ]);
        assert_eq!(
            l,
            [
                "copy_process [kmalloc] (cache task_struct)",
                "load_msg [kmalloc]",
                "copy_process [kmalloc] (cache signal_cache)",
            ]
        );
    }

    #[test]
    fn a_detail_shared_by_two_is_passed_over_for_one_that_tells_all_apart() {
        let l = unique(&[
            c("f [kmalloc]", &["cache kmalloc-64", "at f+0x10"]),
            c("f [kmalloc]", &["cache kmalloc-64", "at f+0x20"]),
            c("f [kmalloc]", &["cache kmalloc-128", "at f+0x30"]),
        ]);
        assert_eq!(
            l,
            [
                "f [kmalloc] (at f+0x10)",
                "f [kmalloc] (at f+0x20)",
                "f [kmalloc] (at f+0x30)"
            ]
        );
    }

    #[test]
    fn without_a_telling_detail_they_are_numbered() {
        let l = unique(&[c("f", &["x"]), c("f", &["x"]), c("g", &[])]);
        assert_eq!(l, ["f #1", "f #2", "g"]);
        // A label made from a detail that meets another series' name.
        let l = unique(&[c("f", &["x"]), c("f", &["y"]), c("f (x)", &[])]);
        all_different(&l);
        assert_eq!(l[1], "f (y)");
        // However many alike.
        let many: Vec<Candidate> = (0..50).map(|_| c("same", &[])).collect();
        all_different(&unique(&many));
    }
}
