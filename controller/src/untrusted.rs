//! Text that came from a pod (a report key, a NACK's message, a header,
//! what a sidecar's admin port answered) or from a status a pod's reports
//! shaped, as the controller's logs and the kubectl plugin show it: control
//! characters escaped, so it cannot move a terminal's cursor, clear a
//! screen or write an administrator's clipboard (OSC 52), and, for logs,
//! cut to a length.

/// `text` with its control characters escaped (`\u{1b}` for ESC; line
/// breaks and tabs too unless `keep_lines`), as a terminal may show it.
/// C0 and C1 controls, DEL, and the Unicode format characters that reorder
/// or hide text (bidirectional overrides and isolates, zero-width ones)
/// are escaped.
pub fn escaped(text: &str, keep_lines: bool) -> String {
    if !text.chars().any(|c| needs_escape(c, keep_lines)) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if needs_escape(c, keep_lines) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// `text` as a log line may carry it: escaped, and cut to `max` bytes
/// (at a character boundary) with how much was left out.
pub fn logged(text: &str, max: usize) -> String {
    let shown = escaped(text, false);
    if shown.len() <= max {
        return shown;
    }
    let mut end = max;
    while !shown.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes in all)", &shown[..end], text.len())
}

fn needs_escape(c: char, keep_lines: bool) -> bool {
    if keep_lines && (c == '\n' || c == '\t') {
        return false;
    }
    c.is_control()
        || matches!(
            c,
            '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_sequences_are_shown_not_run() {
        // Clear the screen, then write the clipboard (OSC 52).
        let hostile = "shop/\u{1b}[2J\u{1b}]52;c;cm0gLXJmIC8=\u{7}reads";
        assert_eq!(
            escaped(hostile, false),
            "shop/\\u{1b}[2J\\u{1b}]52;c;cm0gLXJmIC8=\\u{7}reads"
        );
        assert_eq!(escaped("a\u{9b}b\u{7f}", false), "a\\u{9b}b\\u{7f}");
        assert_eq!(escaped("abc\u{202e}fed", false), "abc\\u{202e}fed");
        assert_eq!(escaped("two\nlines\tand tab", true), "two\nlines\tand tab");
        assert_eq!(escaped("two\nlines", false), "two\\u{a}lines");
        assert_eq!(escaped("plain ünïcode ✓", false), "plain ünïcode ✓");
    }

    #[test]
    fn logged_text_is_cut_at_a_character() {
        assert_eq!(logged("short", 10), "short");
        let long = "é".repeat(100);
        let cut = logged(&long, 11);
        assert!(cut.starts_with("ééééé... (200 bytes in all)"), "{cut}");
    }
}
