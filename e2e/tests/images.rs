//! The images `e2e/images.sh` builds agree with the Dockerfiles' runtime
//! stages: same binary path, user, entrypoint, command, ports and Debian
//! packages (the sidecar's iptables, for transparent pods' `reprise-init`).
//! (The node test checks the built archives carry exactly `--spec`.)

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// What a Dockerfile's last stage says about the image.
#[derive(Debug, Default, PartialEq)]
struct Runtime {
    binary: String,
    user: String,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    ports: Vec<u64>,
    /// What `apt-get install` adds (images.sh adds their closure too).
    packages: Vec<String>,
}

fn runtime_stage(dockerfile: &Path) -> Runtime {
    let text = std::fs::read_to_string(dockerfile).expect("Dockerfile");
    // One instruction per line: continuations joined.
    let text = text.replace("\\\n", " ");
    let lines: Vec<&str> = text.lines().collect();
    let last_from = lines
        .iter()
        .rposition(|l| l.trim_start().starts_with("FROM "))
        .expect("a FROM line");
    let mut r = Runtime::default();
    let json_list = |rest: &str| -> Vec<String> {
        serde_json::from_str(rest.trim()).unwrap_or_else(|e| {
            panic!(
                "{}: exec form expected, got {rest:?}: {e}",
                dockerfile.display()
            )
        })
    };
    let mut copied = Vec::new();
    for line in lines.iter().skip(last_from + 1) {
        let line = line.trim();
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word {
            "COPY" => {
                let dest = rest.split_whitespace().last().unwrap_or_default();
                copied.push(dest.to_string());
            }
            "RUN" => {
                for command in rest.split("&&") {
                    let words: Vec<&str> = command.split_whitespace().collect();
                    if let Some(at) = words.windows(2).position(|w| w == ["apt-get", "install"]) {
                        r.packages.extend(
                            words[at + 2..]
                                .iter()
                                .filter(|w| !w.starts_with('-'))
                                .map(|w| w.to_string()),
                        );
                    }
                }
            }
            "USER" => r.user = rest.trim().to_string(),
            "ENTRYPOINT" => r.entrypoint = json_list(rest),
            "CMD" => r.cmd = json_list(rest),
            "EXPOSE" => r.ports.extend(
                rest.split_whitespace()
                    .filter_map(|p| p.parse::<u64>().ok()),
            ),
            _ => {}
        }
    }
    // The binary is what the entrypoint runs, among what was copied in.
    r.binary = copied
        .iter()
        .find(|d| r.entrypoint.first() == Some(*d))
        .or(copied.last())
        .cloned()
        .unwrap_or_default();
    r
}

#[test]
fn images_sh_builds_what_the_dockerfiles_runtime_stages_describe() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("bash")
        .arg(root.join("e2e/images.sh"))
        .arg("--spec")
        .output()
        .expect("bash e2e/images.sh --spec");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spec: Vec<Value> = serde_json::from_slice(&out.stdout).expect("--spec is JSON");
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(String::from))
            .collect()
    };
    for (name, dockerfile) in [
        ("reprise-controller", "controller/Dockerfile"),
        ("reprise-sidecar", "sidecar/Dockerfile"),
    ] {
        let image = spec
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("{name} in --spec"));
        let want = runtime_stage(&root.join(dockerfile));
        let got = Runtime {
            binary: image["binary"].as_str().unwrap_or_default().to_string(),
            user: image["user"].as_str().unwrap_or_default().to_string(),
            entrypoint: strings(&image["entrypoint"]),
            cmd: strings(&image["cmd"]),
            ports: image["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_u64)
                .collect(),
            packages: strings(&image["packages"]),
        };
        assert_eq!(got, want, "e2e/images.sh vs {dockerfile}");
        assert_eq!(want.user, "65532:65532", "{dockerfile}: non-root");
        if name == "reprise-sidecar" {
            assert_eq!(
                want.packages,
                ["iptables"],
                "{dockerfile}: reprise-init drives iptables from this image"
            );
        }
        assert!(
            image["reference"]
                .as_str()
                .is_some_and(|r| r.starts_with(&format!("ghcr.io/reprise-dev/{name}:"))),
            "tagged as the chart's default repository: {image}"
        );
    }
    // The chart's default repositories are the ones images.sh tags.
    let values =
        std::fs::read_to_string(root.join("charts/reprise/values.yaml")).expect("values.yaml");
    for repo in [
        "ghcr.io/reprise-dev/reprise-controller",
        "ghcr.io/reprise-dev/reprise-sidecar",
    ] {
        assert!(
            values.contains(&format!("repository: {repo}\n")),
            "{repo} in values.yaml"
        );
    }
}
