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
use comfy_table::{Cell, CellAlignment, ColumnConstraint, ContentArrangement, Table, Width};

/// Fitted to a width, a naming column keeps at least this many characters
/// a line (or its content's, if narrower): a table that cannot fit that
/// way grows past the width rather than cutting names into slivers.
const MIN_TEXT: u16 = 12;

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
    render(t) + "\n"
}

/// The table as text. Fitted to a width, naming columns wrap no narrower
/// than `MIN_TEXT`; number columns never split a number (nor a word of
/// their header, though "live bytes" may take two lines).
pub fn render(mut t: Table) -> String {
    if !matches!(t.content_arrangement(), ContentArrangement::Dynamic) {
        return t.to_string();
    }
    let chars = |s: &str| s.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    let mut numbers = vec![0; t.column_count()];
    for row in t.row_iter() {
        for (w, cell) in numbers.iter_mut().zip(row.cell_iter()) {
            *w = (*w).max(chars(&cell.content()));
        }
    }
    if let Some(header) = t.header() {
        for (w, cell) in numbers.iter_mut().zip(header.cell_iter()) {
            let word = cell.content().split(' ').map(chars).max().unwrap_or(0);
            *w = (*w).max(word);
        }
    }
    let texts = t.column_max_content_widths();
    for ((c, number), text) in t.column_iter_mut().zip(numbers).zip(texts) {
        let least = match c.constraint() {
            // new_table marks number columns.
            Some(ColumnConstraint::ContentWidth) => number as u16,
            _ => text.min(MIN_TEXT),
        };
        // The boundary counts the cell's padding too.
        let least = least + c.padding_width();
        c.set_constraint(ColumnConstraint::LowerBoundary(Width::Fixed(least)));
    }
    t.to_string()
}

/// The line under a table whose rows were cut to `-r`.
pub fn hidden_note(hidden: usize) -> String {
    if hidden == 0 {
        String::new()
    } else {
        format!("({hidden} more rows not shown; use -r to see more)\n")
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
    fn names_do_not_shrink_to_slivers() {
        let headers: Vec<String> = (0..12).map(|i| format!("number{i}")).collect();
        let mut headers: Vec<&str> = headers.iter().map(String::as_str).collect();
        headers.insert(0, "site");
        let mut row = vec!["alloc_pipe_info+0x2d more"];
        row.extend(std::iter::repeat_n("123456", 12));
        let mut t = new_table(&headers, &[], Some(80));
        t.add_row(row);
        let text = render(t);
        let first = text.lines().nth(3).unwrap();
        assert!(
            first.contains("│ alloc_pipe_i ┆"),
            "12 characters a line: {text}"
        );
    }

    #[test]
    fn number_headers_wrap_at_spaces_numbers_never() {
        let mut t = new_table(&["cache", "live bytes", "alloc bytes"], &[], Some(30));
        t.add_row(vec!["dentry", "1.5M", "12.0M"]);
        let text = render(t);
        assert!(text.lines().all(|l| l.chars().count() <= 30), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[1].contains("live ┆") && lines[1].ends_with("alloc │"),
            "{text}"
        );
        assert!(
            lines[2].contains("bytes ┆") && lines[2].ends_with("bytes │"),
            "{text}"
        );
        assert!(
            lines[4].contains("1.5M ┆") && lines[4].ends_with("12.0M │"),
            "{text}"
        );
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
            "(3 more rows not shown; use -r to see more)\n"
        );
    }
}
