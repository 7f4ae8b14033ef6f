//! End-to-end tests against a real kube-apiserver, etcd and
//! kube-controller-manager (started by `e2e/cluster.sh up`), with the real
//! `reprise-controller` and `reprise-sidecar` binaries.
//!
//! `node` runs everything in real pods on the cluster's node (kubelet,
//! containerd, CNI, kube-proxy, CoreDNS; images from `e2e/images.sh`).
//! The others need no containers: pods are API objects on Node `local` whose
//! status the test sets, and whose "containers" are processes on 127.1.x.y.
//! The API server refuses loopback addresses in EndpointSlices, so those pods
//! get 10.244.x.y (x >= 20, outside the node's pod range) and the sidecars
//! map that prefix to 127.1.x.y (REPRISE_ENDPOINT_ADDRESS_MAP); nothing is
//! ever sent to those addresses.
//!
//! Ignored by default; `e2e/test.sh` runs them with `--ignored` once the
//! cluster is up and `REPRISE_E2E_KUBECONFIG` is set.

mod chart;
mod docs;
mod flows;
mod node;
mod security;
