package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's fixed shape. The chart, the Dockerfile and test/image rely on
// these values.
const (
	binaryPath = "/tiergate"
	imageUser  = "65532:65532"
	sourceURL  = "https://github.com/tiergate/tiergate"
	caBundleIn = "etc/ssl/certs/ca-certificates.crt"
)

// errUsage marks bad flags or environment; run exits 2 for it.
var errUsage = errors.New("invalid usage")

// config is what one run builds. Defaults come first, then flags and
// SOURCE_DATE_EPOCH, then validate.
type config struct {
	output   string
	tag      string
	arch     string
	version  string
	revision string
	caBundle string
	created  time.Time
}

func defaults() config {
	return config{
		output:   filepath.Join("dist", "tiergate-image.tar"),
		tag:      "ghcr.io/tiergate/tiergate:dev",
		arch:     runtime.GOARCH,
		version:  "dev",
		caBundle: "/etc/ssl/certs/ca-certificates.crt",
		created:  time.Unix(0, 0).UTC(),
	}
}

var supportedArch = map[string]bool{"amd64": true, "arm64": true}

func (c config) validate() error {
	if c.output == "" {
		return fmt.Errorf("%w: --output must not be empty", errUsage)
	}
	if !supportedArch[c.arch] {
		return fmt.Errorf("%w: --arch %q is not supported (want amd64 or arm64)", errUsage, c.arch)
	}
	if _, err := name.NewTag(c.tag, name.StrictValidation); err != nil {
		return fmt.Errorf("%w: --tag %q is not a valid tagged image reference (want registry/repository:tag): %v", errUsage, c.tag, err)
	}
	if c.version == "" {
		return fmt.Errorf("%w: --version must not be empty", errUsage)
	}
	return nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

func run(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	cfg, err := parse(args, stderr, getenv)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "image: %v\n", err)
		return 2
	}
	digest, err := build(cfg, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "image: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s: %s linux/%s %s\n", cfg.output, cfg.tag, cfg.arch, digest)
	return 0
}

func parse(args []string, stderr io.Writer, getenv func(string) string) (config, error) {
	cfg := defaults()
	cfg.revision = gitRevision()
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.output, "output", cfg.output, "where to write the image archive")
	fs.StringVar(&cfg.tag, "tag", cfg.tag, "image reference recorded in the archive")
	fs.StringVar(&cfg.arch, "arch", cfg.arch, "target architecture: amd64 or arm64")
	fs.StringVar(&cfg.version, "version", cfg.version, "value of the org.opencontainers.image.version label")
	fs.StringVar(&cfg.revision, "revision", cfg.revision, "value of the org.opencontainers.image.revision label (default: git HEAD)")
	fs.StringVar(&cfg.caBundle, "ca-bundle", cfg.caBundle, "CA certificates copied to /"+caBundleIn+"; empty to leave them out")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, err
		}
		// The flag package already printed the problem and the usage.
		return cfg, fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	if s := getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil || sec < 0 {
			return cfg, fmt.Errorf("%w: SOURCE_DATE_EPOCH %q is not a non-negative number of seconds", errUsage, s)
		}
		cfg.created = time.Unix(sec, 0).UTC()
	}
	return cfg, cfg.validate()
}

// gitRevision is best effort: an archive built outside a git checkout simply
// carries no revision label.
func gitRevision() string {
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// build compiles the binary, assembles the image and writes the archive. It
// returns the manifest digest.
func build(cfg config, progress io.Writer) (v1.Hash, error) {
	var caBundle []byte
	var err error
	if cfg.caBundle != "" {
		if caBundle, err = os.ReadFile(cfg.caBundle); err != nil {
			return v1.Hash{}, fmt.Errorf("reading --ca-bundle: %w", err)
		}
	}
	root, err := moduleRoot()
	if err != nil {
		return v1.Hash{}, err
	}
	tmp, err := os.MkdirTemp("", "tiergate-image-")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.RemoveAll(tmp)

	bin := filepath.Join(tmp, "tiergate")
	// The same flags as make build, so the image ships that binary.
	gobuild := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w -X main.version="+cfg.version, "-o", bin, ".")
	gobuild.Dir = root
	gobuild.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+cfg.arch)
	gobuild.Stdout, gobuild.Stderr = progress, progress
	if err := gobuild.Run(); err != nil {
		return v1.Hash{}, fmt.Errorf("go build of the tiergate binary: %w", err)
	}

	binary, err := os.ReadFile(bin)
	if err != nil {
		return v1.Hash{}, err
	}
	img, err := assemble(cfg, binary, caBundle)
	if err != nil {
		return v1.Hash{}, err
	}
	tag, err := name.NewTag(cfg.tag, name.StrictValidation)
	if err != nil {
		return v1.Hash{}, err // validate already checked it
	}
	if err := os.MkdirAll(filepath.Dir(cfg.output), 0o755); err != nil {
		return v1.Hash{}, err
	}
	if err := writeArchive(cfg.output, img, tag, cfg.created); err != nil {
		return v1.Hash{}, err
	}
	return img.Digest()
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside the tiergate module: run from the repository (go env GOMOD is empty)")
	}
	return filepath.Dir(gomod), nil
}

// assemble puts the binary on an empty base with an OCI config.
func assemble(cfg config, binary, caBundle []byte) (v1.Image, error) {
	layerTar, err := rootfs(binary, caBundle, cfg.created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: cfg.created},
			CreatedBy: "hack/image: static tiergate binary on an empty base",
			Comment:   "built without a container daemon",
		},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	labels := map[string]string{
		"org.opencontainers.image.title":       "tiergate",
		"org.opencontainers.image.description": "Tiered, ageing, bounded priority queue in front of a model-serving Deployment (controller and dispatcher)",
		"org.opencontainers.image.source":      sourceURL,
		"org.opencontainers.image.version":     cfg.version,
		"org.opencontainers.image.created":     cfg.created.Format(time.RFC3339),
	}
	if cfg.revision != "" {
		labels["org.opencontainers.image.revision"] = cfg.revision
	}
	cf.Created = v1.Time{Time: cfg.created}
	cf.OS = "linux"
	cf.Architecture = cfg.arch
	cf.Config.Entrypoint = []string{binaryPath}
	cf.Config.Cmd = nil
	cf.Config.User = imageUser
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = labels
	// Documentation only: the dispatcher's data and admin ports, the
	// controller's metrics and health ports.
	cf.Config.ExposedPorts = map[string]struct{}{"8080/tcp": {}, "9090/tcp": {}, "8081/tcp": {}}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, err
	}
	annotated, ok := mutate.Annotations(img, labels).(v1.Image)
	if !ok {
		return nil, errors.New("annotating the manifest did not return an image")
	}
	return annotated, nil
}

// rootfs is the single layer: the binary, user entries for 65532, the CA
// bundle and /tmp. Everything is owned by root so the non-root user cannot
// change it.
func rootfs(binary, caBundle []byte, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	type entry struct {
		name string
		mode int64
		dir  bool
		data []byte
	}
	entries := []entry{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
	}
	if caBundle != nil {
		entries = append(entries,
			entry{name: "etc/ssl/", mode: 0o755, dir: true},
			entry{name: "etc/ssl/certs/", mode: 0o755, dir: true},
			entry{name: caBundleIn, mode: 0o644, data: caBundle},
		)
	}
	entries = append(entries,
		entry{name: "tiergate", mode: 0o755, data: binary},
		entry{name: "tmp/", mode: 0o1777, dir: true},
	)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: e.mode, ModTime: mtime, Format: tar.FormatPAX}
		if e.dir {
			hdr.Typeflag = tar.TypeDir
		} else {
			hdr.Typeflag = tar.TypeReg
			hdr.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// dockerManifest is one entry of a `docker save` manifest.json.
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// writeArchive writes an OCI image layout as a tar, plus the manifest.json
// that `docker load` and go-containerregistry's tarball package read. Both
// views share the blobs.
func writeArchive(path string, img v1.Image, tag name.Tag, mtime time.Time) (err error) {
	manifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	manifestDigest, err := img.Digest()
	if err != nil {
		return err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	configDigest, err := img.ConfigName()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}

	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }
	docker := dockerManifest{Config: blob(configDigest), RepoTags: []string{tag.String()}}
	index := v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType: types.OCIManifestSchema1,
			Digest:    manifestDigest,
			Size:      int64(len(manifest)),
			Annotations: map[string]string{
				"org.opencontainers.image.ref.name": tag.TagStr(),
				"io.containerd.image.name":          tag.Name(),
			},
		}},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return err
	}

	tmp := path + ".partial"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	tw := tar.NewWriter(f)
	file := func(name string, r io.Reader, size int64) error {
		hdr := &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size, ModTime: mtime, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		n, err := io.Copy(tw, r)
		if err == nil && n != size {
			err = fmt.Errorf("%s: wrote %d bytes, want %d", name, n, size)
		}
		return err
	}
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX})
	}
	layout := []byte(`{"imageLayoutVersion":"1.0.0"}`)
	if err = file("oci-layout", bytes.NewReader(layout), int64(len(layout))); err != nil {
		return err
	}
	if err = dir("blobs/"); err != nil {
		return err
	}
	if err = dir("blobs/sha256/"); err != nil {
		return err
	}
	if err = file(blob(configDigest), bytes.NewReader(config), int64(len(config))); err != nil {
		return err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		size, err := l.Size()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		err = file(blob(d), rc, size)
		rc.Close()
		if err != nil {
			return err
		}
		docker.Layers = append(docker.Layers, blob(d))
	}
	if err = file(blob(manifestDigest), bytes.NewReader(manifest), int64(len(manifest))); err != nil {
		return err
	}
	if err = file("index.json", bytes.NewReader(indexJSON), int64(len(indexJSON))); err != nil {
		return err
	}
	dockerJSON, err := json.Marshal([]dockerManifest{docker})
	if err != nil {
		return err
	}
	if err = file("manifest.json", bytes.NewReader(dockerJSON), int64(len(dockerJSON))); err != nil {
		return err
	}
	if err = tw.Close(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
