# syntax=docker/dockerfile:1
#
# The tiergate image for people with a container daemon:
#   docker build -t ghcr.io/tiergate/tiergate:dev .
# Without a daemon, `make image` (go run ./hack/image) writes the same shape of
# image (static binary at /tiergate, user 65532, no shell) as an OCI archive.
# One image serves both roles: `tiergate controller` and `tiergate dispatcher`.

# The same patched release as the Makefile's GOTOOLCHAIN.
ARG GO_VERSION=1.26.10

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src
# Dependencies first, so source edits reuse the module cache layer.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags="-s -w -X main.version=${VERSION}" -o /out/tiergate .

# distroless/static: CA certificates, /etc/passwd with nonroot (65532), no shell.
FROM gcr.io/distroless/static-debian12:nonroot
LABEL org.opencontainers.image.title="tiergate" \
      org.opencontainers.image.description="Tiered, ageing, bounded priority queue in front of a model-serving Deployment (controller and dispatcher)" \
      org.opencontainers.image.source="https://github.com/tiergate/tiergate"
COPY --from=build /out/tiergate /tiergate
USER 65532:65532
EXPOSE 8080 9090 8081
ENTRYPOINT ["/tiergate"]
