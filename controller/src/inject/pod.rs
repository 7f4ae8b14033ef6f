//! What injection does to a Pod: skip it (opted out, already injected, host
//! network), refuse it (an invalid override annotation), or add the sidecar,
//! its volumes and either the app containers' proxy variables or, in
//! transparent pods, `reprise-init` and its capture rules.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, Pod, PodSpec, ProjectedVolumeSource,
    ServiceAccountTokenProjection, Volume, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::config::InjectionConfig;
use super::container::{
    env, init_container, otlp_volumes, sidecar_container, token_file, STATE_VOLUME, TOKEN_VOLUME,
    XTABLES_VOLUME,
};
use super::overrides::{deadline_switches, Capture, Overrides};
use super::{INIT_NAME, INJECT, INJECTED, PROXY_ENV, SIDECAR_NAME, TRANSPARENT};
use reprise_crds::sidecar_env;

/// How long a projected push token is valid; the kubelet refreshes it before.
const TOKEN_EXPIRATION_SECS: i64 = 3600;

/// What to do with a Pod.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Leave it as it is, for this reason.
    Skip(&'static str),
    /// Admit this mutated Pod.
    Inject(Box<Pod>),
    /// Refuse the Pod: an override annotation is invalid.
    Refuse(String),
}

/// What the webhook knows besides the Pod and the injection config.
#[derive(Debug, Default, Clone)]
pub(crate) struct Context {
    /// The API server runs native sidecars (Kubernetes 1.29+).
    pub(crate) native: bool,
    /// The Pod's namespace opted into transparent mode (the request came
    /// through the webhook entry for namespaces labelled
    /// `reprise.dev/transparent=enabled`).
    pub(crate) transparent_by_default: bool,
    /// The API server's ClusterIPs, never captured.
    pub(crate) api_server: Vec<IpAddr>,
    /// The name of the Pod's namespace, and its `reprise.dev/deadline-*`
    /// annotations (the Pod's own win).
    pub(crate) namespace: (String, BTreeMap<String, String>),
}

/// Decides what to do with `pod`. `ctx.native` adds the sidecar as an init
/// container with `restartPolicy: Always` (Kubernetes 1.29+), so it starts
/// before and stops after the app; otherwise as the first regular container.
/// A transparent pod also gets `reprise-init` as its very first init
/// container, so the rules exist before anything else in the pod runs.
/// `ca_pem` is the CA the sidecar trusts for the push stream.
pub(crate) fn decide(pod: &Pod, config: &InjectionConfig, ca_pem: &str, ctx: &Context) -> Decision {
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    if annotations.get(INJECT).map(String::as_str) == Some("false") {
        return Decision::Skip("opted out by annotation");
    }
    let spec = match &pod.spec {
        Some(spec) => spec,
        None => return Decision::Skip("pod has no spec"),
    };
    let already = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| c.name == SIDECAR_NAME || c.name == INIT_NAME);
    if already || annotations.contains_key(INJECTED) {
        return Decision::Skip("already injected");
    }
    if spec.host_network == Some(true) {
        // The sidecar's ports would collide across pods on the node.
        return Decision::Skip("host network pod");
    }
    let overrides = match Overrides::from_annotations(&annotations, config) {
        Ok(o) => o,
        Err(e) => return Decision::Refuse(e),
    };
    let capture = match Capture::from_annotations(
        &annotations,
        config,
        ctx.transparent_by_default,
        &ctx.api_server,
    ) {
        Ok(c) => c,
        Err(e) => return Decision::Refuse(e),
    };
    if capture.is_some() {
        if let Some(why) = shares_proxy_uid(spec, config.proxy_uid) {
            return Decision::Refuse(why);
        }
    }
    let (ns, ns_annotations) = &ctx.namespace;
    let deadlines = match deadline_switches(&annotations, ns_annotations, ns) {
        Ok(d) => d,
        Err(e) => return Decision::Refuse(e),
    };

    let mut pod = pod.clone();
    let mut spec = pod.spec.take().unwrap_or_default();
    let mut sidecar = sidecar_container(config, &overrides, ca_pem, capture.is_some());
    // Only a switch turned off is written: on is the sidecar's default.
    for (on, variable) in [
        (deadlines.propagate, sidecar_env::DEADLINE_PROPAGATE),
        (
            deadlines.accept_incoming,
            sidecar_env::DEADLINE_ACCEPT_INCOMING,
        ),
    ] {
        if !on {
            sidecar
                .env
                .get_or_insert_with(Vec::new)
                .push(env(variable, "false"));
        }
    }
    if ctx.native {
        sidecar.restart_policy = Some("Always".into());
        spec.init_containers
            .get_or_insert_with(Vec::new)
            .insert(0, sidecar);
    } else {
        spec.containers.insert(0, sidecar);
    }
    if let Some(c) = &capture {
        spec.init_containers
            .get_or_insert_with(Vec::new)
            .insert(0, init_container(config, &overrides, c));
    }
    // A transparent pod's traffic reaches the sidecar without a proxy setting.
    if capture.is_none() && annotations.get(PROXY_ENV).map(String::as_str) != Some("false") {
        let proxy = format!("http://127.0.0.1:{}", config.proxy_port);
        for c in spec
            .containers
            .iter_mut()
            .filter(|c| c.name != SIDECAR_NAME)
        {
            add_proxy_env(c, &proxy);
        }
    }
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    volumes.push(Volume {
        name: TOKEN_VOLUME.into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![VolumeProjection {
                service_account_token: Some(ServiceAccountTokenProjection {
                    // The audience the controller's TokenReview asks for.
                    audience: Some(reprise_crds::protocol::AUDIENCE.into()),
                    expiration_seconds: Some(TOKEN_EXPIRATION_SECS),
                    path: token_file().into(),
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    });
    volumes.push(Volume {
        name: STATE_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    });
    volumes.extend(otlp_volumes(config).into_iter().map(|(volume, _)| volume));
    if capture.is_some() {
        volumes.push(Volume {
            name: XTABLES_VOLUME.into(),
            // Holds one empty lock file.
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(Quantity("1Mi".into())),
            }),
            ..Default::default()
        });
    }
    pod.spec = Some(spec);
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(
            INJECTED.into(),
            if ctx.native { "native" } else { "container" }.into(),
        );
    Decision::Inject(Box::new(pod))
}

/// Why a transparent pod cannot be captured when one of its containers runs
/// as the sidecar's UID: the rules let that UID's connections out
/// untouched, so its traffic would bypass the sidecar without a word. Only
/// an explicit `runAsUser` can be seen here, not an image's `USER`.
fn shares_proxy_uid(spec: &PodSpec, uid: i64) -> Option<String> {
    let pod_uid = spec.security_context.as_ref().and_then(|s| s.run_as_user);
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .find(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.run_as_user)
                .or(pod_uid)
                == Some(uid)
        })
        .map(|c| {
            format!(
                "annotation {TRANSPARENT}: container {:?} runs as UID {uid}, the sidecar's (proxyUid), whose connections transparent capture lets through; run it as another UID or set {TRANSPARENT}: \"false\"",
                c.name
            )
        })
}

/// Sends the app's plain-HTTP traffic through the sidecar, unless the app
/// already chose a proxy. Loopback stays direct.
fn add_proxy_env(c: &mut Container, proxy: &str) {
    let env = c.env.get_or_insert_with(Vec::new);
    let has = |env: &Vec<EnvVar>, n: &str| env.iter().any(|e| e.name.eq_ignore_ascii_case(n));
    if has(env, "HTTP_PROXY") {
        return;
    }
    for name in ["HTTP_PROXY", "http_proxy"] {
        env.push(self::env(name, proxy));
    }
    if !has(env, "NO_PROXY") {
        for name in ["NO_PROXY", "no_proxy"] {
            env.push(self::env(name, "localhost,127.0.0.1,::1"));
        }
    }
}

#[cfg(test)]
mod tests;
