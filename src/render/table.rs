//! The one table style of kheap: plain UTF-8 borders, no colours (so no
//! escape codes in logs), the first column and any other naming column
//! left-aligned, numbers right-aligned and never wrapped.
//!
//! Width: on a terminal, tables fit its width, long names and frames
//! wrapping inside their cells. Written to a file or a pipe, tables are as
//! wide as their content (lines stay whole for grep, diff and logs), as
//! they always were.

use std::io::IsTerminal;
use std::path::Path;

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{Cell, CellAlignment, ColumnConstraint, ContentArrangement, Table};

/// The columns tables may take: `Some` on a terminal, `None` (no limit)
/// for files and pipes.
pub fn output_width(output: Option<&Path>) -> Option<u16> {
    if output.is_some() || !std::io::stdout().is_terminal() {
        return None;
    }
    crossterm::terminal::size()
        .ok()
        .map(|(w, _)| w)
        .filter(|&w| w > 0)
}

/// A table with these headers. Column 0 and the columns in `text` hold
/// names (left-aligned, wrapped to fit `width`); the others hold numbers.
pub fn new_table(headers: &[&str], text: &[usize], width: Option<u16>) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_header(headers.iter().map(Cell::new));
    match width {
        Some(w) => {
            t.set_content_arrangement(ContentArrangement::Dynamic)
                .set_width(w);
        }
        None => {
            t.set_content_arrangement(ContentArrangement::Disabled);
        }
    }
    for i in 1..headers.len() {
        if text.contains(&i) {
            continue;
        }
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
            c.set_constraint(ColumnConstraint::ContentWidth);
        }
    }
    t
}

/// A whole table as text (with its newline): `rows` under the headers of
/// their naming columns, then of their value columns, laid out as
/// `new_table` says.
pub fn table_text(
    (names, values): (&[&str], &[&str]),
    text: &[usize],
    rows: impl IntoIterator<Item = Vec<Cell>>,
    width: Option<u16>,
) -> String {
    let headers: Vec<&str> = names.iter().chain(values).copied().collect();
    let mut t = new_table(&headers, text, width);
    for r in rows {
        t.add_row(r);
    }
    format!("{t}\n")
}

/// The line under a table whose rows were cut to `-n`.
pub fn hidden_note(hidden: usize) -> String {
    if hidden == 0 {
        String::new()
    } else {
        format!("({hidden} more rows not shown; use -n to see more)\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(width: Option<u16>) -> String {
        let mut t = new_table(&["site", "cache", "count", "bytes"], &[1], width);
        t.add_row(vec![
            "a_rather_long_function_name_with_more+0x1234 and_a_second_word_to_wrap_at",
            "kmalloc-cg-4k,kmalloc-8k +3",
            "1234567",
            "12.5M",
        ]);
        t.add_row(vec!["f", "x", "1", "0"]);
        t.to_string()
    }

    #[test]
    fn tables_fit_the_width_they_are_given() {
        let narrow = sample(Some(60));
        assert!(narrow.lines().all(|l| l.chars().count() <= 60), "{narrow}");
        // Numbers are never split across lines.
        assert!(
            narrow.contains("1234567") && narrow.contains("12.5M"),
            "{narrow}"
        );
        assert!(narrow.lines().count() > 5, "long names wrap: {narrow}");
    }

    #[test]
    fn without_a_width_lines_stay_whole() {
        let wide = sample(None);
        assert_eq!(wide.lines().count(), 6, "{wide}");
        assert!(wide.contains("a_rather_long_function_name_with_more+0x1234 and_a_second"));
        let row = wide.lines().nth(3).unwrap();
        assert!(row.contains("┆ kmalloc-cg-4k,kmalloc-8k +3 ┆"), "{row}");
        assert!(row.ends_with("┆ 12.5M │"), "{row}");
        let short = wide.lines().nth(4).unwrap();
        assert!(short.starts_with("│ f "), "names to the left: {short}");
        assert!(short.contains("┆ x "), "names to the left: {short}");
        assert!(
            short.ends_with("┆       1 ┆     0 │"),
            "numbers to the right: {short}"
        );
    }

    #[test]
    fn files_and_pipes_get_no_width() {
        assert_eq!(output_width(Some(Path::new("report.txt"))), None);
    }

    #[test]
    fn the_note_counts_hidden_rows() {
        assert_eq!(hidden_note(0), "");
        assert_eq!(
            hidden_note(3),
            "(3 more rows not shown; use -n to see more)\n"
        );
    }
}
