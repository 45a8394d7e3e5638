//! How results are printed: aligned tables for people, JSON (one document per command) for
//! scripts.

use serde::Serialize;

/// Where a command prints its result, and how.
pub(crate) struct Output {
    json: bool,
}

impl Output {
    pub(crate) fn new(json: bool) -> Output {
        Output { json }
    }

    pub(crate) fn json(&self) -> bool {
        self.json
    }

    /// `value` as pretty JSON on stdout.
    pub(crate) fn print_json<T: Serialize>(&self, value: &T) {
        println!(
            "{}",
            serde_json::to_string_pretty(value).expect("serializable output")
        );
    }

    /// A table on stdout: the header, then the rows, columns padded to their widest cell.
    pub(crate) fn print_table(&self, header: &[&str], rows: &[Vec<String>]) {
        print!("{}", table(header, rows));
    }
}

/// The text of a table with `header` and `rows`, each line ending in a newline; trailing
/// spaces trimmed.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (cell, width) in cells.zip(&widths) {
            text.push_str(cell);
            text.extend(std::iter::repeat_n(' ', width + 2 - cell.chars().count()));
        }
        text.trim_end().to_owned() + "\n"
    };
    let mut out = line(&mut header.iter().copied());
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::table;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let rows = vec![
            vec!["1".to_owned(), "tables".to_owned()],
            vec!["24".to_owned(), "server_status".to_owned()],
        ];
        assert_eq!(
            table(&["version", "name"], &rows),
            "version  name\n1        tables\n24       server_status\n"
        );
    }
}
