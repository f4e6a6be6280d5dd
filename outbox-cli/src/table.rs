//! A small column-aligned table for human output.

/// How a column's cells line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text: padded on the right.
    Left,
    /// Numbers: padded on the left.
    Right,
}

/// Rows of cells under a header, rendered with two spaces between columns and no trailing
/// whitespace.
#[derive(Debug)]
pub struct Table {
    headers: Vec<&'static str>,
    aligns: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns.
    pub fn new(columns: &[(&'static str, Align)]) -> Self {
        Table {
            headers: columns.iter().map(|(name, _)| *name).collect(),
            aligns: columns.iter().map(|(_, align)| *align).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; control characters (newlines, tabs) become spaces so rows stay one line.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows
            .push(cells.into_iter().map(|c| one_line(&c)).collect());
    }

    /// The table as text, one line per row, each ending in a newline.
    pub fn render(&self) -> String {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(width(cell));
            }
        }
        let header: Vec<String> = self.headers.iter().map(|h| (*h).to_owned()).collect();
        let mut out = String::new();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, w) in widths.iter().enumerate() {
                let cell = row.get(i).map(String::as_str).unwrap_or("");
                let pad = " ".repeat(w - width(cell));
                if i > 0 {
                    line.push_str("  ");
                }
                match self.aligns[i] {
                    Align::Left => {
                        line.push_str(cell);
                        line.push_str(&pad);
                    }
                    Align::Right => {
                        line.push_str(&pad);
                        line.push_str(cell);
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// The display width of a cell, counted in characters.
fn width(text: &str) -> usize {
    text.chars().count()
}

/// `text` with every run of control characters and whitespace replaced by one space.
pub fn one_line(text: &str) -> String {
    let joined = text
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    // What is left to escape: the bidirectional overrides.
    visible(&joined)
}

/// `text` safe to print on a terminal: control characters other than newlines and tabs (the
/// escape that starts a terminal control sequence, a carriage return that overwrites the line,
/// a bell) and the bidirectional overrides that reorder what is shown are written as visible
/// `\u{..}` escapes.
pub fn visible(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        let bidi_control = matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if (c.is_control() && c != '\n' && c != '\t') || bidi_control {
            shown.extend(c.escape_unicode());
        } else {
            shown.push(c);
        }
    }
    shown
}

/// `text` on one line, cut to at most `max` characters with an ellipsis.
pub fn truncate(text: &str, max: usize) -> String {
    let text = one_line(text);
    if width(&text) <= max {
        return text;
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bidi_overrides_are_shown_escaped() {
        assert_eq!(visible("a\u{1b}[31mb"), "a\\u{1b}[31mb");
        assert_eq!(visible("x\r\ny\tz"), "x\\u{d}\ny\tz");
        assert_eq!(visible("\u{202e}cba"), "\\u{202e}cba");
        assert_eq!(visible("café ✓"), "café ✓");
        assert_eq!(one_line("a\u{1b}b\r\n\u{2066}c"), "a b \\u{2066}c");
    }

    #[test]
    fn columns_line_up() {
        let mut table = Table::new(&[
            ("TYPE", Align::Left),
            ("COUNT", Align::Right),
            ("NOTE", Align::Left),
        ]);
        table.row(vec!["a".into(), "1234567".into(), "x".into()]);
        table.row(vec!["longer.type".into(), "5".into(), String::new()]);
        assert_eq!(
            table.render(),
            "TYPE           COUNT  NOTE\n\
             a            1234567  x\n\
             longer.type        5\n"
        );
    }

    #[test]
    fn cells_are_kept_on_one_line() {
        let mut table = Table::new(&[("A", Align::Left), ("B", Align::Left)]);
        table.row(vec!["x\ny".into(), "z".into()]);
        assert_eq!(table.render(), "A    B\nx y  z\n");
    }

    #[test]
    fn long_text_is_truncated_with_an_ellipsis() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("0123456789abc", 10), "012345678…");
        assert_eq!(truncate("line one\n\tline two", 100), "line one line two");
    }
}
