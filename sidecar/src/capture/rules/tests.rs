use super::*;

fn opts(include: &[&str], exclude: &[&str], cidrs: &[&str]) -> Result<Options, String> {
    let s = |v: &[&str]| v.iter().map(|s| (*s).to_string()).collect::<Vec<_>>();
    let (include, exclude, cidrs) = (s(include), s(exclude), s(cidrs));
    Options::new(&Raw {
        redirect_port: 15006,
        proxy_uid: 65532,
        include_ports: &include,
        exclude_ports: &exclude,
        exclude_cidrs: &cidrs,
    })
    .map_err(|e| e.to_string())
}

fn lines(rules: &[Rule]) -> Vec<String> {
    rules.iter().map(|r| r.join(" ")).collect()
}

#[test]
fn chain_rules_for_each_family() {
    let o = opts(&[], &["53"], &["10.96.0.1/32", "2001:db8::/32"]).expect("valid");
    let cases: [(Family, &[&str]); 2] = [
        (
            Family::V4,
            &[
                "-m owner --uid-owner 65532 -j RETURN",
                "-o lo -j RETURN",
                "-d 127.0.0.0/8 -j RETURN",
                "-d 10.96.0.1/32 -j RETURN",
                "-p tcp -m tcp --dport 53 -j RETURN",
                "-p tcp -j REDIRECT --to-ports 15006",
            ],
        ),
        (
            Family::V6,
            &[
                "-m owner --uid-owner 65532 -j RETURN",
                "-o lo -j RETURN",
                "-d ::1/128 -j RETURN",
                "-d 2001:db8::/32 -j RETURN",
                "-p tcp -m tcp --dport 53 -j RETURN",
                "-p tcp -j REDIRECT --to-ports 15006",
            ],
        ),
    ];
    for (family, want) in cases {
        assert_eq!(lines(&chain(&o, family)), want, "{family}");
    }
}

#[test]
fn included_ports_go_in_multiport_chunks_of_fifteen() {
    let ports: Vec<String> = (1..=31).map(|p| (p * 10).to_string()).collect();
    let ports: Vec<&str> = ports.iter().map(String::as_str).collect();
    let o = opts(&ports, &[], &[]).expect("valid");
    let rules = lines(&chain(&o, Family::V4));
    let redirects: Vec<&String> = rules.iter().filter(|r| r.contains("REDIRECT")).collect();
    assert_eq!(redirects.len(), 3, "{rules:?}");
    assert_eq!(
        redirects[0],
        "-p tcp -m multiport --dports 10,20,30,40,50,60,70,80,90,100,110,120,130,140,150 -j REDIRECT --to-ports 15006"
    );
    assert!(redirects[2].contains("--dports 310 -j"), "{}", redirects[2]);
    assert!(
        !rules
            .iter()
            .any(|r| r == "-p tcp -j REDIRECT --to-ports 15006"),
        "no catch-all redirect with an include list"
    );
}

#[test]
fn ports_and_cidrs_are_sorted_deduplicated_and_canonical() {
    let o = opts(
        &[],
        &["443", " 53", "443", ""],
        &["10.0.0.7/8", "192.0.2.1", "fd00::1:2/64"],
    )
    .expect("valid");
    assert_eq!(o.exclude_ports, [53, 443]);
    let cidrs: Vec<String> = o.exclude_cidrs.iter().map(Cidr::to_string).collect();
    assert_eq!(cidrs, ["10.0.0.0/8", "192.0.2.1/32", "fd00::/64"]);
    let all = opts(&[], &[], &["0.0.0.0/0", "::/0"]).expect("valid");
    let all: Vec<String> = all.exclude_cidrs.iter().map(Cidr::to_string).collect();
    assert_eq!(all, ["0.0.0.0/0", "::/0"]);
}

/// Include ports, exclude ports, exclude CIDRs, the error.
type Case = (
    &'static [&'static str],
    &'static [&'static str],
    &'static [&'static str],
    &'static str,
);

#[test]
fn invalid_flags_name_the_flag_and_the_rule() {
    let cases: [Case; 8] = [
        (&["0"], &[], &[], "--include-ports: \"0\" is not a port: must be a number in 1..=65535"),
        (&["65536"], &[], &[], "--include-ports: \"65536\" is not a port: must be a number in 1..=65535"),
        (&[], &["http"], &[], "--exclude-ports: \"http\" is not a port: must be a number in 1..=65535"),
        (&[], &["15006"], &[], "--exclude-ports: 15006 is the --redirect-port; loopback (where the listener is) is never captured"),
        (&["80", "443"], &["443"], &[], "--exclude-ports: 443 is also in --include-ports; a port is either included or excluded"),
        (&[], &[], &["10.0.0/8"], "--exclude-cidrs: \"10.0.0/8\" is not an IPv4 or IPv6 CIDR (ADDRESS/PREFIX)"),
        (&[], &[], &["10.0.0.0/33"], "--exclude-cidrs: \"10.0.0.0/33\": the prefix must be a number in 0..=32"),
        (&[], &[], &["::/129"], "--exclude-cidrs: \"::/129\": the prefix must be a number in 0..=128"),
    ];
    for (include, exclude, cidrs, want) in cases {
        assert_eq!(opts(include, exclude, cidrs).expect_err(want), want);
    }
    let raw = |redirect_port, proxy_uid| Raw {
        redirect_port,
        proxy_uid,
        ..Raw::default()
    };
    assert_eq!(
        Options::new(&raw(0, 65532))
            .expect_err("port 0")
            .to_string(),
        "--redirect-port: must be in 1..=65535 (got 0)"
    );
    assert_eq!(
        Options::new(&raw(15006, 0)).expect_err("uid 0").to_string(),
        "--proxy-uid: must not be 0: every process running as root would bypass the capture"
    );
}

fn cmds(c: &[Command]) -> Vec<String> {
    c.iter().map(|c| c.join(" ")).collect()
}

const LISTING: &str = "-P PREROUTING ACCEPT\n-P OUTPUT ACCEPT\n-N REPRISE_OUTPUT\n-A OUTPUT -d 10.0.0.0/8 -j ACCEPT\n-A OUTPUT -p tcp -j REPRISE_OUTPUT\n-A REPRISE_OUTPUT -o lo -j RETURN\n-A REPRISE_OUTPUT -p tcp -j REDIRECT --to-ports 15006\n";

#[test]
fn the_listing_keeps_only_our_chain_and_jumps() {
    let got = Installed::parse(LISTING);
    assert!(got.chain_exists);
    assert_eq!(
        lines(&got.chain),
        ["-o lo -j RETURN", "-p tcp -j REDIRECT --to-ports 15006"]
    );
    assert_eq!(lines(&got.jumps), ["-p tcp -j REPRISE_OUTPUT"]);
    assert_eq!(Installed::parse("-P OUTPUT ACCEPT\n"), Installed::default());
}

#[test]
fn install_adds_only_what_is_missing() {
    let o = opts(&[], &[], &[]).expect("valid");
    let wanted = chain(&o, Family::V4);
    let fresh = install(&Installed::default(), &wanted);
    assert_eq!(
        cmds(&fresh),
        [
            "-t nat -N REPRISE_OUTPUT",
            "-t nat -A REPRISE_OUTPUT -m owner --uid-owner 65532 -j RETURN",
            "-t nat -A REPRISE_OUTPUT -o lo -j RETURN",
            "-t nat -A REPRISE_OUTPUT -d 127.0.0.0/8 -j RETURN",
            "-t nat -A REPRISE_OUTPUT -p tcp -j REDIRECT --to-ports 15006",
            "-t nat -A OUTPUT -p tcp -j REPRISE_OUTPUT",
        ]
    );
    let done = Installed {
        chain_exists: true,
        chain: wanted.clone(),
        jumps: vec![jump()],
    };
    assert!(
        install(&done, &wanted).is_empty(),
        "a second run changes nothing"
    );
    // The chain exists but its jump was removed by hand.
    let no_jump = Installed {
        jumps: Vec::new(),
        ..done.clone()
    };
    assert_eq!(
        cmds(&install(&no_jump, &wanted)),
        ["-t nat -A OUTPUT -p tcp -j REPRISE_OUTPUT"]
    );
}

#[test]
fn changed_options_rebuild_the_chain_and_leave_one_jump() {
    let before = chain(&opts(&[], &["53"], &[]).expect("valid"), Family::V4);
    let after = chain(&opts(&["80"], &[], &[]).expect("valid"), Family::V4);
    let installed = Installed {
        chain_exists: true,
        chain: before,
        jumps: vec![jump(), rule(&["-j", CHAIN]), jump()],
    };
    let got = cmds(&install(&installed, &after));
    assert_eq!(got[0], "-t nat -F REPRISE_OUTPUT");
    assert_eq!(
        &got[1..after.len() + 1],
        cmds(
            &after
                .iter()
                .map(|r| command("-A", CHAIN, r))
                .collect::<Vec<_>>()
        )
        .as_slice()
    );
    assert_eq!(
        &got[after.len() + 1..],
        [
            "-t nat -D OUTPUT -j REPRISE_OUTPUT",
            "-t nat -D OUTPUT -p tcp -j REPRISE_OUTPUT"
        ]
    );
}

#[test]
fn clean_removes_jumps_then_the_chain_and_nothing_when_absent() {
    assert_eq!(
        cmds(&clean(&Installed::parse(LISTING))),
        [
            "-t nat -D OUTPUT -p tcp -j REPRISE_OUTPUT",
            "-t nat -F REPRISE_OUTPUT",
            "-t nat -X REPRISE_OUTPUT",
        ]
    );
    assert!(clean(&Installed::default()).is_empty());
}
