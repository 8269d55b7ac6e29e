// Package image tests the container image that hack/image writes without a
// daemon: it builds the archive, opens it with go-containerregistry through
// both of its views (the OCI layout and the `docker save` manifest.json),
// checks the config (entrypoint, user, labels), the layer's exact file list,
// that the binary inside is static and answers --help once extracted, and
// that two builds of the same tree are identical. It also keeps the
// Dockerfile in line with the same contract.
//
// Concurrency: the tests run sequentially; the archive is built once per
// test binary and shared read-only.
package image
