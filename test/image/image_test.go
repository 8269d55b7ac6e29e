package image

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/tiergate/tiergate/internal/testutil"
)

// The build every test inspects: fixed inputs so the labels and times are
// known.
const (
	testTag      = "example.test/tiergate/tiergate:t1"
	testVersion  = "v9.9.9-test"
	testRevision = "0123456789abcdef0123456789abcdef01234567"
	testEpoch    = "1700000000"
)

var (
	repoRoot  string
	toolPath  string // hack/image built once
	workDir   string
	buildOnce sync.Once
	built     struct {
		archive string
		stdout  string
		err     error
	}
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	root, err := testutil.ModuleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	repoRoot = root
	workDir, err = os.MkdirTemp("", "tiergate-image-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(workDir)
	toolPath = filepath.Join(workDir, "image-tool")
	if err := testutil.BuildBinary(repoRoot, toolPath, "./hack/image", testutil.BuildOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, "building hack/image:", err)
		return 1
	}
	return m.Run()
}

// runTool runs hack/image from the repository root, as `make image` does.
func runTool(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	r := testutil.Tool{Bin: toolPath, Dir: repoRoot, Env: env, Timeout: 10 * time.Minute}.Run(args...)
	code, ok := testutil.ExitCode(r.Err)
	if !ok {
		t.Fatalf("running hack/image: %v", r.Err)
	}
	return r.Stdout, r.Stderr, code
}

func buildArchive(t *testing.T, out string) (stdout string) {
	t.Helper()
	stdout, stderr, code := runTool(t, []string{"SOURCE_DATE_EPOCH=" + testEpoch},
		"--output", out, "--tag", testTag, "--version", testVersion, "--revision", testRevision)
	if code != 0 {
		t.Fatalf("hack/image exited %d\nstderr:\n%s", code, stderr)
	}
	return stdout
}

// sharedArchive is the archive most tests inspect, built once.
func sharedArchive(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		built.archive = filepath.Join(workDir, "tiergate-image.tar")
		built.stdout = buildArchive(t, built.archive)
	})
	if built.stdout == "" {
		t.Fatal("the shared archive was not built (see the first test's failure)")
	}
	return built.archive
}

// dockerView opens the archive through manifest.json, as `docker load` does.
func dockerView(t *testing.T, archive string) v1.Image {
	t.Helper()
	tag, err := name.NewTag(testTag)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(archive, &tag)
	if err != nil {
		t.Fatalf("opening %s as a docker archive: %v", archive, err)
	}
	return img
}

// ociView unpacks the archive and opens it as an OCI image layout.
func ociView(t *testing.T, archive string) (v1.Image, v1.Descriptor) {
	t.Helper()
	dir := t.TempDir()
	untar(t, archive, dir)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("opening the OCI layout: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index.json has %d manifests, want 1", len(im.Manifests))
	}
	desc := im.Manifests[0]
	img, err := idx.Image(desc.Digest)
	if err != nil {
		t.Fatalf("reading the image of index.json: %v", err)
	}
	return img, desc
}

func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(dir, filepath.FromSlash(hdr.Name))
		if !strings.HasPrefix(target, dir+string(filepath.Separator)) {
			t.Fatalf("archive entry %q escapes the directory", hdr.Name)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				t.Fatal(err)
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(target, data, 0o644); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("unexpected archive entry type %q for %s", hdr.Typeflag, hdr.Name)
		}
	}
}

func TestArchiveViewsAgree(t *testing.T) {
	archive := sharedArchive(t)
	oci, desc := ociView(t, archive)
	docker := dockerView(t, archive)
	for name, img := range map[string]v1.Image{"oci layout": oci, "docker archive": docker} {
		t.Run(name, func(t *testing.T) {
			if err := validate.Image(img); err != nil {
				t.Fatalf("validate.Image: %v", err)
			}
		})
	}

	wantDigest, err := oci.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest != wantDigest {
		t.Errorf("index.json names manifest %s, the blob hashes to %s", desc.Digest, wantDigest)
	}
	if want := fmt.Sprintf("wrote %s: %s linux/%s %s\n", archive, testTag, runtime.GOARCH, wantDigest); built.stdout != want {
		t.Errorf("stdout = %q, want %q", built.stdout, want)
	}
	wantAnnotations := map[string]string{
		"org.opencontainers.image.ref.name": "t1",
		"io.containerd.image.name":          testTag,
	}
	if diff := cmp.Diff(wantAnnotations, desc.Annotations); diff != "" {
		t.Errorf("index.json annotations (-want +got):\n%s", diff)
	}
	mt, err := oci.MediaType()
	if err != nil {
		t.Fatal(err)
	}
	if mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type = %s, want %s", mt, types.OCIManifestSchema1)
	}

	// Both views must carry the same config and layers.
	for what, get := range map[string]func(v1.Image) (any, error){
		"config digest": func(i v1.Image) (any, error) { return i.ConfigName() },
		"layer digests": func(i v1.Image) (any, error) {
			ls, err := i.Layers()
			if err != nil {
				return nil, err
			}
			var ds []v1.Hash
			for _, l := range ls {
				d, err := l.Digest()
				if err != nil {
					return nil, err
				}
				ds = append(ds, d)
			}
			return ds, nil
		},
	} {
		a, err := get(oci)
		if err != nil {
			t.Fatal(err)
		}
		b, err := get(docker)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(a, b); diff != "" {
			t.Errorf("%s differ between the OCI and docker views (-oci +docker):\n%s", what, diff)
		}
	}
}

func TestConfig(t *testing.T) {
	img, _ := ociView(t, sharedArchive(t))
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	created := time.Unix(1700000000, 0).UTC()
	type shape struct {
		OS, Architecture string
		Created          time.Time
		Entrypoint, Cmd  []string
		User, WorkingDir string
		Labels           map[string]string
		Env              []string
	}
	want := shape{
		OS: "linux", Architecture: runtime.GOARCH, Created: created,
		Entrypoint: []string{"/tiergate"},
		User:       "65532:65532",
		WorkingDir: "/",
		Labels: map[string]string{
			"org.opencontainers.image.title":       "tiergate",
			"org.opencontainers.image.description": "Tiered, ageing, bounded priority queue in front of a model-serving Deployment (controller and dispatcher)",
			"org.opencontainers.image.source":      "https://github.com/tiergate/tiergate",
			"org.opencontainers.image.version":     testVersion,
			"org.opencontainers.image.revision":    testRevision,
			"org.opencontainers.image.created":     "2023-11-14T22:13:20Z",
		},
	}
	got := shape{
		OS: cf.OS, Architecture: cf.Architecture, Created: cf.Created.UTC(),
		Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd,
		User: cf.Config.User, WorkingDir: cf.Config.WorkingDir,
		Labels: cf.Config.Labels, Env: cf.Config.Env,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("image config (-want +got):\n%s", diff)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want.Labels, m.Annotations); diff != "" {
		t.Errorf("manifest annotations (-want +got):\n%s", diff)
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != types.OCILayer {
		t.Errorf("layers = %+v, want one %s", m.Layers, types.OCILayer)
	}
}

// layerFile is what the test checks of every entry of the root filesystem.
type layerFile struct {
	Type     byte
	Mode     int64
	UID, GID int
}

func TestLayerContents(t *testing.T) {
	img, _ := ociView(t, sharedArchive(t))
	rc := mutate.Extract(img)
	defer rc.Close()
	got := map[string]layerFile{}
	var passwd string
	mtimes := map[time.Time]bool{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[hdr.Name] = layerFile{Type: hdr.Typeflag, Mode: hdr.Mode, UID: hdr.Uid, GID: hdr.Gid}
		mtimes[hdr.ModTime.UTC()] = true
		if hdr.Name == "etc/passwd" {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			passwd = string(b)
		}
	}
	want := map[string]layerFile{
		"etc":                               {Type: tar.TypeDir, Mode: 0o755},
		"etc/group":                         {Type: tar.TypeReg, Mode: 0o644},
		"etc/passwd":                        {Type: tar.TypeReg, Mode: 0o644},
		"tiergate":                          {Type: tar.TypeReg, Mode: 0o755},
		"tmp":                               {Type: tar.TypeDir, Mode: 0o1777},
		"etc/ssl":                           {Type: tar.TypeDir, Mode: 0o755},
		"etc/ssl/certs":                     {Type: tar.TypeDir, Mode: 0o755},
		"etc/ssl/certs/ca-certificates.crt": {Type: tar.TypeReg, Mode: 0o644},
	}
	if _, err := os.Stat("/etc/ssl/certs/ca-certificates.crt"); errors.Is(err, os.ErrNotExist) {
		// The default --ca-bundle is the build host's; without one the image
		// carries none.
		delete(want, "etc/ssl")
		delete(want, "etc/ssl/certs")
		delete(want, "etc/ssl/certs/ca-certificates.crt")
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layer contents (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[time.Time]bool{time.Unix(1700000000, 0).UTC(): true}, mtimes); diff != "" {
		t.Errorf("file times must all be SOURCE_DATE_EPOCH (-want +got):\n%s", diff)
	}
	if !strings.Contains(passwd, "nonroot:x:65532:65532:") {
		t.Errorf("etc/passwd has no entry for 65532:\n%s", passwd)
	}
}

// extractBinary writes /tiergate from the image to a temporary file.
func extractBinary(t *testing.T, img v1.Image) string {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatal("the image has no /tiergate")
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Name != "tiergate" {
			continue
		}
		path := filepath.Join(t.TempDir(), "tiergate")
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, os.FileMode(hdr.Mode))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(f, tr); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		return path
	}
}

func TestBinaryIsStatic(t *testing.T) {
	bin := extractBinary(t, dockerView(t, sharedArchive(t)))
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatalf("the binary is not ELF: %v", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has a PT_INTERP program header: it is dynamically linked")
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	if len(libs) != 0 {
		t.Errorf("the binary needs shared libraries %v", libs)
	}
	wantMachine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[runtime.GOARCH]
	if f.Machine != wantMachine {
		t.Errorf("ELF machine = %v, want %v", f.Machine, wantMachine)
	}
}

func TestBinaryAnswers(t *testing.T) {
	bin := extractBinary(t, ociView1(t))
	tests := map[string]struct {
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		"--help prints usage on stdout": {args: []string{"--help"}, wantCode: 0, wantStdout: "Usage: tiergate <command> [flags]"},
		"no command is a usage error":   {args: nil, wantCode: 2, wantStderr: "Usage: tiergate <command> [flags]"},
		"unknown command":               {args: []string{"no-such-command"}, wantCode: 2, wantStderr: `tiergate: unknown command "no-such-command"`},
		"version is the image's":        {args: []string{"version"}, wantCode: 0, wantStdout: "tiergate " + testVersion + " (go1.26.10 "},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(bin, tc.args...)
			var out, errOut bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errOut
			err := cmd.Run()
			code, ok := testutil.ExitCode(err)
			if !ok {
				t.Fatal(err)
			}
			if code != tc.wantCode {
				t.Errorf("exit code = %d, want %d (stderr %q)", code, tc.wantCode, errOut.String())
			}
			if tc.wantStdout != "" && !strings.Contains(out.String(), tc.wantStdout) {
				t.Errorf("stdout %q does not contain %q", out.String(), tc.wantStdout)
			}
			if tc.wantStdout == "" && out.Len() != 0 {
				t.Errorf("stdout = %q, want nothing", out.String())
			}
			if tc.wantStderr != "" && !strings.Contains(errOut.String(), tc.wantStderr) {
				t.Errorf("stderr %q does not contain %q", errOut.String(), tc.wantStderr)
			}
		})
	}
}

func ociView1(t *testing.T) v1.Image {
	img, _ := ociView(t, sharedArchive(t))
	return img
}

func TestReproducible(t *testing.T) {
	first, err := os.ReadFile(sharedArchive(t))
	if err != nil {
		t.Fatal(err)
	}
	again := filepath.Join(t.TempDir(), "again.tar")
	buildArchive(t, again)
	second, err := os.ReadFile(again)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first, second) {
		t.Errorf("two builds of the same tree differ (%d and %d bytes)", len(first), len(second))
	}
}

func TestBadInput(t *testing.T) {
	out := filepath.Join(t.TempDir(), "never.tar")
	tests := map[string]struct {
		env        []string
		args       []string
		wantCode   int
		wantStderr string // the whole of stderr, or its last line for flag errors
	}{
		"unsupported arch": {
			args: []string{"--output", out, "--arch", "s390x"}, wantCode: 2,
			wantStderr: "image: invalid usage: --arch \"s390x\" is not supported (want amd64 or arm64)\n",
		},
		"empty output": {
			args: []string{"--output", ""}, wantCode: 2,
			wantStderr: "image: invalid usage: --output must not be empty\n",
		},
		"empty version": {
			args: []string{"--output", out, "--version", ""}, wantCode: 2,
			wantStderr: "image: invalid usage: --version must not be empty\n",
		},
		"untagged reference": {
			args: []string{"--output", out, "--tag", "example.test/tiergate"}, wantCode: 2,
			wantStderr: "image: invalid usage: --tag \"example.test/tiergate\" is not a valid tagged image reference (want registry/repository:tag): tag must be between 1 and 128 characters in length: \n",
		},
		"stray argument": {
			args: []string{"--output", out, "extra"}, wantCode: 2,
			wantStderr: "image: invalid usage: unexpected arguments [\"extra\"]\n",
		},
		"unknown flag": {
			args: []string{"--frobnicate"}, wantCode: 2,
			wantStderr: "image: invalid usage: flag provided but not defined: -frobnicate\n",
		},
		"bad SOURCE_DATE_EPOCH": {
			env: []string{"SOURCE_DATE_EPOCH=yesterday"}, args: []string{"--output", out}, wantCode: 2,
			wantStderr: "image: invalid usage: SOURCE_DATE_EPOCH \"yesterday\" is not a non-negative number of seconds\n",
		},
		"negative SOURCE_DATE_EPOCH": {
			env: []string{"SOURCE_DATE_EPOCH=-5"}, args: []string{"--output", out}, wantCode: 2,
			wantStderr: "image: invalid usage: SOURCE_DATE_EPOCH \"-5\" is not a non-negative number of seconds\n",
		},
		"missing CA bundle": {
			args: []string{"--output", out, "--ca-bundle", "/nonexistent/ca.pem"}, wantCode: 1,
			wantStderr: "image: reading --ca-bundle: open /nonexistent/ca.pem: no such file or directory\n",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			stdout, stderr, code := runTool(t, tc.env, tc.args...)
			if code != tc.wantCode {
				t.Errorf("exit code = %d, want %d", code, tc.wantCode)
			}
			if stdout != "" {
				t.Errorf("stdout = %q, want nothing", stdout)
			}
			got := stderr
			if strings.HasPrefix(tc.wantStderr, "image: invalid usage: flag") {
				// The flag package prints the usage first; the verdict is last.
				lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
				got = lines[len(lines)-1] + "\n"
			}
			if diff := cmp.Diff(tc.wantStderr, got); diff != "" {
				t.Errorf("stderr (-want +got):\n%s", diff)
			}
			if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a failed run left %s behind (stat: %v)", out, err)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	stdout, stderr, code := runTool(t, nil, "--help")
	if code != 0 {
		t.Errorf("exit code = %d, want 0", code)
	}
	if stdout != "" {
		t.Errorf("stdout = %q, want nothing (flag usage goes to stderr)", stdout)
	}
	for _, flag := range []string{"-output", "-tag", "-arch", "-version", "-revision", "-ca-bundle"} {
		if !strings.Contains(stderr, flag) {
			t.Errorf("usage does not mention %s:\n%s", flag, stderr)
		}
	}
}

// The Dockerfile is for people with a daemon; it cannot be built here, so it
// is held to the same contract as hack/image by reading it.
func TestDockerfileContract(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var froms []string
	var final []string // instructions after the last FROM
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "FROM ") {
			froms = append(froms, line)
			final = nil
			continue
		}
		final = append(final, line)
	}
	if len(froms) < 2 {
		t.Fatalf("want a multi-stage build, found FROM lines %q", froms)
	}
	if last := froms[len(froms)-1]; !strings.HasPrefix(last, "FROM gcr.io/distroless/static") && last != "FROM scratch" {
		t.Errorf("final stage %q is neither distroless/static nor scratch", last)
	}
	for _, want := range []string{"USER 65532:65532", `ENTRYPOINT ["/tiergate"]`} {
		found := false
		for _, l := range final {
			if l == want {
				found = true
			}
		}
		if !found {
			t.Errorf("the final stage lacks %q; it has %q", want, final)
		}
	}
	if !strings.Contains(string(data), "CGO_ENABLED=0") {
		t.Error("the build stage does not set CGO_ENABLED=0, so the binary may not be static")
	}
}
