//! kubectl's look: tables with upper-case headers and columns three spaces
//! apart, ages as `kubectl get` prints them, windows as the status writes
//! them (`5m`).

/// A table being filled, row by row.
#[derive(Debug)]
pub(super) struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(super) fn new(headers: Vec<&'static str>) -> Self {
        Table {
            headers,
            rows: Vec::new(),
        }
    }

    /// Adds a row; each cell is shown escaped ([`crate::untrusted`]): a
    /// cell may hold what a pod wrote, and a line break or a terminal
    /// sequence in it would forge rows or drive the terminal.
    pub(super) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(
            cells
                .into_iter()
                .map(|c| crate::untrusted::escaped(&c, false))
                .collect(),
        );
    }

    /// The header line, then one line per row, each without trailing blanks.
    pub(super) fn lines(&self) -> Vec<String> {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                if let Some(w) = widths.get_mut(i) {
                    *w = (*w).max(cell.chars().count());
                }
            }
        }
        let header: Vec<String> = self.headers.iter().map(|h| h.to_string()).collect();
        std::iter::once(&header)
            .chain(&self.rows)
            .map(|cells| {
                let mut line = String::new();
                for (cell, width) in cells.iter().zip(&widths) {
                    line.push_str(cell);
                    let pad = width.saturating_sub(cell.chars().count()) + 3;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
                line.trim_end().to_string()
            })
            .collect()
    }

    pub(super) fn render(&self) -> String {
        let mut out = self.lines().join("\n");
        out.push('\n');
        out
    }
}

/// `seconds` as kubectl prints an age (apimachinery's `HumanDuration`):
/// `45s`, `3m20s`, `95m`, `5h10m`, `30h`, `3d4h`, `400d`, `2y30d`.
pub(super) fn age(seconds: i64) -> String {
    let s = seconds.max(0);
    let (m, h) = (s / 60, s / 3600);
    match () {
        () if s < 120 => format!("{s}s"),
        () if m < 10 => with_rest(m, "m", s % 60, "s"),
        () if m < 180 => format!("{m}m"),
        () if h < 8 => with_rest(h, "h", m % 60, "m"),
        () if h < 48 => format!("{h}h"),
        () if h < 24 * 8 => with_rest(h / 24, "d", h % 24, "h"),
        () if h < 24 * 365 * 2 => format!("{}d", h / 24),
        () if h < 24 * 365 * 8 => with_rest(h / 24 / 365, "y", (h / 24) % 365, "d"),
        () => format!("{}y", h / 24 / 365),
    }
}

fn with_rest(big: i64, big_unit: &str, rest: i64, rest_unit: &str) -> String {
    if rest == 0 {
        format!("{big}{big_unit}")
    } else {
        format!("{big}{big_unit}{rest}{rest_unit}")
    }
}

/// A window as the status writes it (`5m`, `30s`, `1h30m`, `90s`) in
/// seconds; `None` for anything else.
pub(super) fn window_seconds(window: &str) -> Option<f64> {
    let mut total = 0.0;
    let mut rest = window.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += number * scale;
        rest = &rest[unit_len..];
    }
    (total > 0.0).then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell_plus_three() {
        let mut t = Table::new(vec!["NAME", "TARGET"]);
        t.row(vec!["reads".into(), "api:80".into()]);
        t.row(vec!["a-much-longer-name".into(), "-".into()]);
        assert_eq!(
            t.render(),
            "NAME                 TARGET\nreads                api:80\na-much-longer-name   -\n"
        );
    }

    #[test]
    fn a_cell_cannot_break_its_row_or_drive_the_terminal() {
        let mut t = Table::new(vec!["KEY"]);
        t.row(vec!["a\nFAKE   ROW\u{1b}[2J".into()]);
        assert_eq!(t.render(), "KEY\na\\u{a}FAKE   ROW\\u{1b}[2J\n");
    }

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        for (seconds, shown) in [
            (-5, "0s"),
            (45, "45s"),
            (119, "119s"),
            (200, "3m20s"),
            (540, "9m"),
            (95 * 60, "95m"),
            (5 * 3600 + 600, "5h10m"),
            (30 * 3600, "30h"),
            (76 * 3600, "3d4h"),
            (400 * 86400, "400d"),
            ((2 * 365 + 30) * 86400, "2y30d"),
            (9 * 365 * 86400, "9y"),
        ] {
            assert_eq!(age(seconds), shown, "{seconds}s");
        }
    }

    #[test]
    fn windows_parse_as_the_status_writes_them() {
        assert_eq!(window_seconds("5m"), Some(300.0));
        assert_eq!(window_seconds("30s"), Some(30.0));
        assert_eq!(window_seconds("1h30m"), Some(5400.0));
        assert_eq!(window_seconds("1.5m"), Some(90.0));
        assert_eq!(window_seconds("500ms"), Some(0.5));
        for bad in ["", "5", "m", "5 minutes", "0s", "-5m"] {
            assert_eq!(window_seconds(bad), None, "{bad:?}");
        }
    }
}
