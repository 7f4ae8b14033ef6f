use std::path::PathBuf;

use super::*;

/// A fresh folder for one test's files.
fn dir(label: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("reprise-crds-tls-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("a folder");
    d
}

/// A self-signed certificate for `name` and its key, as PEM.
fn self_signed(name: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("a key");
    let cert = rcgen::CertificateParams::new(vec![name.to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("a certificate");
    (cert.pem(), key.serialize_pem())
}

#[test]
fn a_bundle_must_hold_a_pem_certificate() {
    let d = dir("bundle");
    let (cert, _) = self_signed("ca.example");
    let good = d.join("ca.pem");
    std::fs::write(&good, format!("{cert}{cert}")).expect("written");
    assert_eq!(read_bundle(&good).expect("a bundle").certs.len(), 2);

    let empty = d.join("empty.pem");
    std::fs::write(&empty, "").expect("written");
    let rule = read_bundle(&empty).expect_err("empty");
    assert!(
        rule.starts_with("must hold at least one PEM certificate"),
        "{rule}"
    );

    let missing = d.join("missing.pem");
    let rule = read_bundle(&missing).expect_err("missing");
    assert!(rule.starts_with("cannot be read"), "{rule}");

    let rule = read_bundle(&d).expect_err("a directory");
    assert!(rule.starts_with("must be a regular file"), "{rule}");
}

#[test]
fn a_client_key_must_match_its_certificate() {
    let d = dir("identity");
    let (cert, key) = self_signed("client.example");
    let (_, other_key) = self_signed("other.example");
    let (cert_file, key_file, other_file) = (d.join("c.pem"), d.join("k.pem"), d.join("o.pem"));
    std::fs::write(&cert_file, &cert).expect("written");
    std::fs::write(&key_file, &key).expect("written");
    std::fs::write(&other_file, &other_key).expect("written");

    let identity = read_identity(&cert_file, &key_file).expect("a matching pair");
    assert_eq!(identity.key.cert.len(), 1);
    let shown = format!("{identity:?}");
    assert!(!shown.contains("PRIVATE"), "the key never prints: {shown}");

    let (field, rule) = read_identity(&cert_file, &other_file).expect_err("mismatch");
    assert_eq!(field, IdentityField::Key);
    assert!(
        rule.starts_with("does not match the certificate in"),
        "{rule}"
    );

    let (field, rule) = read_identity(&cert_file, &cert_file).expect_err("no key");
    assert_eq!(field, IdentityField::Key);
    assert!(rule.starts_with("must hold a PEM private key"), "{rule}");

    let (field, _) = read_identity(&key_file, &key_file).expect_err("no certificate");
    assert_eq!(field, IdentityField::Cert);
}
