//! Cutting sorted rows to `-r`: the one place that decides how many rows a
//! report keeps and how many it says it hid (record, leaks, malloc, slab,
//! top; diff counts what its table leaves out).

/// Keeps the first `n` rows (all of them when `n` is None); returns how
/// many were cut.
pub fn keep<T>(rows: &mut Vec<T>, n: Option<usize>) -> usize {
    match n {
        Some(n) if rows.len() > n => {
            let hidden = rows.len() - n;
            rows.truncate(n);
            hidden
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_n_and_counts_the_rest() {
        let mut v = vec![5, 4, 3];
        assert_eq!(keep(&mut v, Some(1)), 2);
        assert_eq!(v, [5]);
        assert_eq!(keep(&mut v, Some(4)), 0);
        assert_eq!(keep(&mut v, None), 0);
        assert_eq!(v, [5]);
    }
}
