//! The user guide's generated reference pages (`docs/src/reference/`).
//!
//! A page generated from code (flags from clap, RetryPolicy fields from the
//! CRD schema, Helm values from the values schema) is rendered by a test and
//! compared with the committed file, as the CRD itself is: a renamed flag or a
//! new field fails the test until the page is regenerated, so the guide cannot
//! drift from the binaries. `REPRISE_BLESS=1` writes the rendered page instead
//! of failing.

use std::fmt::Write as _;
use std::path::PathBuf;

/// The workspace root (the test kit is one of its members).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The first line of every generated page: what generates it and how to
/// regenerate it.
pub fn header(source: &str, test: &str) -> String {
    format!(
        "<!-- Generated from {source} by {test}. Do not edit: run it with REPRISE_BLESS=1 to regenerate. -->\n\n"
    )
}

/// Compares `rendered` with the committed page at `relative` (from the
/// workspace root), or writes it when `REPRISE_BLESS=1`. Panics, naming the
/// first differing line and the fix, when they differ.
pub fn check_generated(relative: &str, rendered: &str, test: &str) {
    let path = workspace_root().join(relative);
    if std::env::var("REPRISE_BLESS").as_deref() == Ok("1") {
        std::fs::write(&path, rendered).unwrap_or_else(|e| panic!("{relative}: {e}"));
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed == rendered {
        return;
    }
    let line = committed
        .lines()
        .zip(rendered.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| committed.lines().count().min(rendered.lines().count()));
    panic!(
        "{relative} is stale (first difference at line {}):\n  committed: {:?}\n  generated: {:?}\nregenerate it: REPRISE_BLESS=1 {test}",
        line + 1,
        committed.lines().nth(line).unwrap_or("<end of file>"),
        rendered.lines().nth(line).unwrap_or("<end of file>"),
    );
}

/// One markdown table cell: lines joined, pipes escaped, and brackets
/// outside code spans escaped (a `[0, cap]` in a description would read as
/// a link reference, which the link checker rightly refuses).
pub fn cell(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = String::with_capacity(joined.len());
    let mut code = false;
    for c in joined.chars() {
        match c {
            '`' => code = !code,
            '|' => out.push('\\'),
            '[' | ']' if !code => out.push('\\'),
            _ => {}
        }
        out.push(c);
    }
    out
}

/// The flags of `cmd` and of each of its subcommands (recursively, `help`
/// left out), one section per command with a table: flag, value, default,
/// environment variable, description. `name` is how a user types the command.
/// Global flags are listed once, under the command that declares them.
pub fn clap_reference(name: &str, cmd: &clap::Command, level: usize) -> String {
    let mut cmd = cmd.clone();
    // Built, so that every argument's action and value count are resolved.
    cmd.build();
    render_command(name, &cmd, level, true)
}

fn render_command(name: &str, cmd: &clap::Command, level: usize, top: bool) -> String {
    let mut out = String::new();
    let hashes = "#".repeat(level);
    let _ = writeln!(out, "{hashes} `{name}`\n");
    let about = cmd
        .get_long_about()
        .or(cmd.get_about())
        .map(ToString::to_string)
        .unwrap_or_default();
    if !about.is_empty() {
        let _ = writeln!(out, "{}\n", about.trim());
    }
    let args: Vec<&clap::Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && a.get_id() != "help" && a.get_id() != "version")
        .filter(|a| top || !a.is_global_set())
        .collect();
    let positionals: Vec<&&clap::Arg> = args.iter().filter(|a| a.is_positional()).collect();
    if !positionals.is_empty() {
        let _ = writeln!(out, "| Argument | Description |\n|---|---|");
        for a in positionals {
            let value = a
                .get_value_names()
                .map(|v| {
                    v.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_else(|| a.get_id().to_string().to_uppercase());
            let _ = writeln!(out, "| `{value}` | {} |", cell(&help(a)));
        }
        out.push('\n');
    }
    let options: Vec<&&clap::Arg> = args.iter().filter(|a| !a.is_positional()).collect();
    if !options.is_empty() {
        let _ = writeln!(
            out,
            "| Flag | Default | Environment | Description |\n|---|---|---|---|"
        );
        for a in options {
            let mut flag = String::new();
            if let Some(long) = a.get_long() {
                flag.push_str(&format!("`--{long}`"));
            }
            if let Some(short) = a.get_short() {
                if !flag.is_empty() {
                    flag.push_str(", ");
                }
                flag.push_str(&format!("`-{short}`"));
            }
            let takes_value = a.get_num_args().is_some_and(|n| n.takes_values())
                && !matches!(
                    a.get_action(),
                    clap::ArgAction::SetTrue | clap::ArgAction::SetFalse | clap::ArgAction::Count
                );
            if takes_value {
                let value = a
                    .get_value_names()
                    .map(|v| {
                        v.iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .unwrap_or_else(|| a.get_id().to_string().to_uppercase().replace('-', "_"));
                flag.push_str(&format!(" `{value}`"));
            }
            let defaults: Vec<String> = a
                .get_default_values()
                .iter()
                .map(|v| format!("`{}`", v.to_string_lossy()))
                .collect();
            let default = if defaults.is_empty() || !takes_value {
                String::new()
            } else {
                defaults.join(", ")
            };
            let env = a
                .get_env()
                .map(|e| format!("`{}`", e.to_string_lossy()))
                .unwrap_or_default();
            let mut description = help(a);
            // clap's help has no final period; the extras below are sentences.
            if !description.is_empty() && !description.ends_with('.') {
                description.push('.');
            }
            let possible: Vec<String> = a
                .get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| format!("`{}`", v.get_name()))
                .collect();
            if takes_value && !possible.is_empty() {
                description.push_str(&format!(" One of {}.", possible.join(", ")));
            }
            if matches!(a.get_action(), clap::ArgAction::Append)
                && !description.to_lowercase().contains("repeatable")
            {
                description.push_str(" Repeatable.");
            }
            let _ = writeln!(
                out,
                "| {flag} | {default} | {env} | {} |",
                cell(&description)
            );
        }
        out.push('\n');
    }
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" || sub.is_hide_set() {
            continue;
        }
        out.push_str(&render_command(
            &format!("{name} {}", sub.get_name()),
            sub,
            level + 1,
            false,
        ));
    }
    out
}

fn help(a: &clap::Arg) -> String {
    a.get_long_help()
        .or(a.get_help())
        .map(ToString::to_string)
        .unwrap_or_default()
}
