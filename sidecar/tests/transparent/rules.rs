//! `reprise-sidecar iptables` against the real nat table of a lab's app
//! namespace: what a dry run prints is what an install leaves, a second
//! install changes nothing, changed options leave exactly the new rules,
//! `--clean` restores the table byte for byte, with either backend.

use std::process::Command;

use crate::lab::Lab;

const BIN: &str = env!("CARGO_BIN_EXE_reprise-sidecar");

/// The interface's example flags.
const ARGS: &[&str] = &[
    "--redirect-port",
    "15006",
    "--proxy-uid",
    "65532",
    "--exclude-ports",
    "53",
    "--exclude-cidrs",
    "10.96.0.1/32,fd00:10:96::1",
];

/// What `--dry-run` prints for [`ARGS`] in a namespace with IPv6.
const DRY_RUN: &str = "\
iptables -t nat -N REPRISE_OUTPUT
iptables -t nat -A REPRISE_OUTPUT -m owner --uid-owner 65532 -j RETURN
iptables -t nat -A REPRISE_OUTPUT -o lo -j RETURN
iptables -t nat -A REPRISE_OUTPUT -d 127.0.0.0/8 -j RETURN
iptables -t nat -A REPRISE_OUTPUT -d 10.96.0.1/32 -j RETURN
iptables -t nat -A REPRISE_OUTPUT -p tcp -m tcp --dport 53 -j RETURN
iptables -t nat -A REPRISE_OUTPUT -p tcp -j REDIRECT --to-ports 15006
iptables -t nat -A OUTPUT -p tcp -j REPRISE_OUTPUT
ip6tables -t nat -N REPRISE_OUTPUT
ip6tables -t nat -A REPRISE_OUTPUT -m owner --uid-owner 65532 -j RETURN
ip6tables -t nat -A REPRISE_OUTPUT -o lo -j RETURN
ip6tables -t nat -A REPRISE_OUTPUT -d ::1/128 -j RETURN
ip6tables -t nat -A REPRISE_OUTPUT -d fd00:10:96::1/128 -j RETURN
ip6tables -t nat -A REPRISE_OUTPUT -p tcp -m tcp --dport 53 -j RETURN
ip6tables -t nat -A REPRISE_OUTPUT -p tcp -j REDIRECT --to-ports 15006
ip6tables -t nat -A OUTPUT -p tcp -j REPRISE_OUTPUT
";

/// The `-A` lines of `table` (an `iptables-save` listing), in order.
fn appends(table: &str) -> Vec<&str> {
    table.lines().filter(|l| l.starts_with("-A ")).collect()
}

/// The `-A` lines a dry run prints for `binary`, as `iptables-save` would
/// list them (chain rules, then the jump: `iptables-save` lists OUTPUT
/// first, so the two are compared per chain).
fn dry_appends<'a>(dry: &'a str, binary: &str, chain: &str) -> Vec<&'a str> {
    let prefix = format!("{binary} -t nat ");
    let want = format!("-A {chain} ");
    dry.lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .filter(|l| l.starts_with(&want))
        .collect()
}

fn both(lab: &Lab) -> (String, String) {
    (lab.nat_table(false), lab.nat_table(true))
}

#[test]
fn install_twice_is_identical_clean_restores_and_dry_run_changes_nothing() {
    let Some(lab) = Lab::new() else { return };
    let pristine = both(&lab);

    let dry = lab.capture(&[ARGS, &["--dry-run"]].concat());
    assert_eq!(dry, DRY_RUN);
    assert_eq!(both(&lab), pristine, "--dry-run changed nothing");

    let first_run = lab.capture(ARGS);
    assert!(first_run.contains("nf_tables backend") || first_run.contains("legacy backend"));
    let installed = both(&lab);
    for (table, binary) in [(&installed.0, "iptables"), (&installed.1, "ip6tables")] {
        for chain in ["REPRISE_OUTPUT", "OUTPUT"] {
            let listed: Vec<&str> = appends(table)
                .into_iter()
                .filter(|l| l.starts_with(&format!("-A {chain} ")))
                .collect();
            assert_eq!(
                listed,
                dry_appends(&dry, binary, chain),
                "{binary}: the dry run printed what the install left in {chain}"
            );
        }
    }

    let second_run = lab.capture(ARGS);
    assert!(
        !second_run.lines().any(|l| l.starts_with("+ ")),
        "a second run runs no changing command:\n{second_run}"
    );
    assert_eq!(
        second_run
            .matches("already in place, nothing changed")
            .count(),
        2,
        "{second_run}"
    );
    assert_eq!(both(&lab), installed, "a second run changed nothing");

    // Other options: the chain holds exactly the new rules, not a mix.
    lab.capture(&[
        "--redirect-port",
        "15007",
        "--proxy-uid",
        "1000",
        "--include-ports",
        "80,443",
    ]);
    let (v4, _) = both(&lab);
    assert_eq!(
        appends(&v4),
        [
            "-A OUTPUT -p tcp -j REPRISE_OUTPUT",
            "-A REPRISE_OUTPUT -m owner --uid-owner 1000 -j RETURN",
            "-A REPRISE_OUTPUT -o lo -j RETURN",
            "-A REPRISE_OUTPUT -d 127.0.0.0/8 -j RETURN",
            "-A REPRISE_OUTPUT -p tcp -m multiport --dports 80,443 -j REDIRECT --to-ports 15007",
        ]
    );
    lab.capture(ARGS);
    assert_eq!(both(&lab), installed, "back to the first options");

    lab.capture(&[ARGS, &["--dry-run"]].concat());
    assert_eq!(both(&lab), installed, "--dry-run changed nothing");

    let cleaned = lab.capture(&[ARGS, &["--clean"]].concat());
    assert_eq!(
        cleaned.matches("removed the jump and the chain").count(),
        2,
        "{cleaned}"
    );
    assert_eq!(both(&lab), pristine, "--clean restored the table exactly");
    let again = lab.capture(&[ARGS, &["--clean"]].concat());
    assert_eq!(
        again
            .matches("nothing installed, nothing to remove")
            .count(),
        2,
        "{again}"
    );
    assert_eq!(both(&lab), pristine);
}

#[test]
fn the_legacy_backend_gets_the_same_rules() {
    let Some(lab) = Lab::new() else { return };
    let legacy = [
        "--iptables",
        "iptables-legacy",
        "--ip6tables",
        "ip6tables-legacy",
    ];
    if Command::new("iptables-legacy")
        .arg("--version")
        .output()
        .map_or(true, |o| !o.status.success())
    {
        eprintln!("skipped: no iptables-legacy here");
        return;
    }
    let save = |binary: &str| -> String {
        let out = crate::lab::run(lab.app(binary).args(["-t", "nat"]));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    let pristine = save("iptables-legacy-save");
    let args = [ARGS, &legacy].concat();
    let first = lab.capture(&args);
    assert!(
        first.contains("(iptables v1.8") && first.contains("legacy backend"),
        "{first}"
    );
    let installed = save("iptables-legacy-save");
    let dry = lab.capture(&[&args[..], &["--dry-run"]].concat());
    assert_eq!(
        dry_appends(&dry, "iptables-legacy", "REPRISE_OUTPUT"),
        appends(&installed)
            .into_iter()
            .filter(|l| l.starts_with("-A REPRISE_OUTPUT "))
            .collect::<Vec<_>>(),
        "legacy lists the rules back as written"
    );
    assert!(
        !lab.capture(&args).lines().any(|l| l.starts_with("+ ")),
        "a second run changes nothing"
    );
    assert_eq!(save("iptables-legacy-save"), installed);
    assert!(!save("ip6tables-legacy-save").is_empty(), "IPv6 rules too");
    lab.capture(&[&args[..], &["--clean"]].concat());
    assert_eq!(save("iptables-legacy-save"), pristine);
}

#[test]
fn clean_leaves_other_rules_and_fails_loudly_when_the_chain_is_in_use() {
    let Some(lab) = Lab::new() else { return };
    lab.capture(ARGS);
    // Somebody else's chain jumping to ours: not ours to remove.
    for args in [
        &["-t", "nat", "-N", "OTHER"][..],
        &["-t", "nat", "-A", "OTHER", "-j", "REPRISE_OUTPUT"][..],
    ] {
        crate::lab::run(lab.app("iptables").args(args));
    }
    let out = lab.iptables(&[ARGS, &["--clean"]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("`iptables -w 5 -t nat -X REPRISE_OUTPUT` failed (exit status: ")
            && (stderr.contains("busy") || stderr.contains("Too many links")),
        "the failing command and its stderr: {stderr}"
    );
    let v4 = lab.nat_table(false);
    assert!(v4.contains("-A OTHER -j REPRISE_OUTPUT"), "{v4}");
    assert!(
        !v4.contains("-A OUTPUT -p tcp -j REPRISE_OUTPUT"),
        "the jump from OUTPUT went first: {v4}"
    );
}

/// Binaries that do not exist: these runs happen in this process's own
/// network namespace (they need no lab), so nothing may ever reach a real
/// iptables there.
const NO_BINARIES: &[&str] = &[
    "--iptables",
    "/nonexistent/iptables",
    "--ip6tables",
    "/nonexistent/ip6tables",
];

#[test]
fn bad_flags_exit_2_naming_the_flag_and_a_missing_binary_exits_1() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["--redirect-port", "0", "--proxy-uid", "65532"],
            "--redirect-port: must be in 1..=65535 (got 0)",
        ),
        (
            &[
                "--redirect-port",
                "15006",
                "--proxy-uid",
                "65532",
                "--exclude-ports",
                "53,x",
            ],
            "--exclude-ports: \"x\" is not a port: must be a number in 1..=65535",
        ),
        (
            &[
                "--redirect-port",
                "15006",
                "--proxy-uid",
                "65532",
                "--exclude-cidrs",
                "10.0.0.0/40",
            ],
            "--exclude-cidrs: \"10.0.0.0/40\": the prefix must be a number in 0..=32",
        ),
        (
            &["--redirect-port", "70000", "--proxy-uid", "65532"],
            "invalid value '70000' for '--redirect-port <PORT>'",
        ),
    ];
    for (args, want) in cases {
        let out = Command::new(BIN)
            .arg("iptables")
            .args(args)
            .args(NO_BINARIES)
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
    let out = Command::new(BIN)
        .args([
            "iptables",
            "--redirect-port",
            "15006",
            "--proxy-uid",
            "65532",
        ])
        .args(NO_BINARIES)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("`/nonexistent/iptables --version` failed (could not start)"),
        "{stderr}"
    );
}
