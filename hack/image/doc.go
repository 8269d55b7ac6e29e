// Command image builds the tiergate container image without a container
// daemon. It compiles a static (CGO_ENABLED=0) linux binary of the root
// module, puts it in a single layer on an empty base together with the few
// files a scratch image needs (passwd/group entries for the non-root user
// 65532, an optional CA bundle, /tmp), and writes one tar archive that is
// both an OCI image layout (oci-layout, index.json, blobs/) and a
// `docker save` archive (manifest.json). `docker load`, `podman load`,
// `skopeo copy oci-archive:` and go-containerregistry can all read it.
//
// The output is reproducible: file times and the image's creation time come
// from SOURCE_DATE_EPOCH (0 when unset), so the same commit and Go version
// give the same digests.
//
// Concurrency: none; it is a sequential command-line program.
package main
