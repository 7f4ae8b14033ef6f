module reprise.local/e2e/tools/gateway-api

go 1.27.0

// Not built: e2e/build-tools.sh only downloads the module (go mod download)
// for its CRD manifests (config/crd/standard/*.yaml), which the e2e tests
// apply. No package imports it, so `go mod tidy` would drop this line: bump
// with `go get sigs.k8s.io/gateway-api@vX.Y.Z` only.
require sigs.k8s.io/gateway-api v1.7.0
