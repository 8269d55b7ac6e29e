package integration

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/discovery"

	"github.com/tiergate/tiergate/internal/testutil"
)

// script runs a file of hack/ (or any command) from the module root, or
// from dir when it is set.
func script(t *testing.T, dir string, argv ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = repoRoot
	if dir != "" {
		cmd.Dir = dir
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code, ok := testutil.ExitCode(err)
	if !ok {
		t.Fatalf("%s: %v", strings.Join(argv, " "), err)
	}
	return out.String(), errb.String(), code
}

func TestControlPlaneIsVersionStamped(t *testing.T) {
	t.Parallel()
	dc, err := discovery.NewDiscoveryClientForConfig(testEnv.Config)
	if err != nil {
		t.Fatal(err)
	}
	v, err := dc.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	got := []string{v.GitVersion, v.Major, v.Minor}
	if diff := cmp.Diff([]string{"v1.37.2", "1", "37"}, got); diff != "" {
		t.Errorf("kube-apiserver version (-want +got):\n%s", diff)
	}
	stdout, stderr, err := kubectl(t, "version", "--client")
	if err != nil {
		t.Fatalf("kubectl version: %v\n%s", err, stderr)
	}
	if first := strings.SplitN(stdout, "\n", 2)[0]; first != "Client Version: v1.37.2" {
		t.Errorf("kubectl version --client: first line %q, want %q", first, "Client Version: v1.37.2")
	}
}

func TestCheckImports(t *testing.T) {
	t.Parallel()
	const pkg = "github.com/tiergate/tiergate/test/integration/testdata/importcheck/"
	tests := map[string]struct {
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		"direct net/http import": {
			args:       []string{"./test/integration/testdata/importcheck/leaky"},
			wantCode:   1,
			wantStderr: "check-imports: ./test/integration/testdata/importcheck/leaky depends on forbidden packages (pure); the way in:\n  " + pkg + "leaky imports net/http\n",
		},
		"net/http through another package": {
			args:       []string{"./test/integration/testdata/importcheck/indirect"},
			wantCode:   1,
			wantStderr: "check-imports: ./test/integration/testdata/importcheck/indirect depends on forbidden packages (pure); the way in:\n  " + pkg + "leaky imports net/http\n",
		},
		"apimachinery": {
			args:       []string{"./api/policy/v1", "./api/v1alpha1"},
			wantCode:   1,
			wantStdout: "check-imports: ./api/policy/v1 ok (pure)\n",
			wantStderr: "check-imports: ./api/v1alpha1 depends on forbidden packages (pure); the way in:\n" +
				"  golang.org/x/net/internal/httpcommon imports net/http/httptrace\n" +
				"  golang.org/x/net/http2 imports net/http\n" +
				"  golang.org/x/net/http2 imports net/http/httptrace\n" +
				"  github.com/tiergate/tiergate/api/v1alpha1 imports k8s.io/apimachinery/pkg/api/resource\n" +
				"  github.com/tiergate/tiergate/api/v1alpha1 imports k8s.io/apimachinery/pkg/apis/meta/v1\n" +
				"  github.com/tiergate/tiergate/api/v1alpha1 imports k8s.io/apimachinery/pkg/runtime\n" +
				"  github.com/tiergate/tiergate/api/v1alpha1 imports k8s.io/apimachinery/pkg/runtime/schema\n",
		},
		"clock and yaml are allowed": {
			args:       []string{"./test/integration/testdata/importcheck/clean"},
			wantStdout: "check-imports: ./test/integration/testdata/importcheck/clean ok (pure)\n",
		},
		"no-client: a client reached through controller-runtime": {
			args:     []string{"--rule", "no-client", "./test/integration/testdata/importcheck/kubeclient"},
			wantCode: 1,
			wantStderr: "check-imports: ./test/integration/testdata/importcheck/kubeclient depends on forbidden packages (no-client); the way in:\n  " +
				pkg + "kubeclient imports sigs.k8s.io/controller-runtime/pkg/client\n",
		},
		"no-client: API types and apimachinery are allowed": {
			args:       []string{"--rule=no-client", "./api/v1alpha1", "./test/integration/testdata/importcheck/leaky"},
			wantStdout: "check-imports: ./api/v1alpha1 ok (no-client)\ncheck-imports: ./test/integration/testdata/importcheck/leaky ok (no-client)\n",
		},
		"no-dispatcher: a dispatcher package beside the wire type": {
			args:     []string{"--rule", "no-dispatcher", "./test/integration/testdata/importcheck/dispatcherside"},
			wantCode: 1,
			wantStderr: "check-imports: ./test/integration/testdata/importcheck/dispatcherside depends on forbidden packages (no-dispatcher); the way in:\n  " +
				pkg + "dispatcherside imports github.com/tiergate/tiergate/dispatcher/queue\n",
		},
		"no-dispatcher: the wire type, API types and clients are allowed": {
			args: []string{"--rule=no-dispatcher", "./api/policy/v1", "./test/integration/testdata/importcheck/kubeclient"},
			wantStdout: "check-imports: ./api/policy/v1 ok (no-dispatcher)\n" +
				"check-imports: ./test/integration/testdata/importcheck/kubeclient ok (no-dispatcher)\n",
		},
		"an unknown rule": {
			args:       []string{"--rule", "strict", "./capacity"},
			wantCode:   2,
			wantStderr: "usage: hack/check-imports.sh [--rule pure|no-client|no-dispatcher] [PACKAGE...]\n",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := script(t, "", append([]string{"hack/check-imports.sh"}, tc.args...)...)
			if diff := cmp.Diff([]any{tc.wantCode, tc.wantStdout, tc.wantStderr}, []any{code, stdout, stderr}); diff != "" {
				t.Errorf("exit code, stdout, stderr (-want +got):\n%s", diff)
			}
		})
	}

	// The real boundaries: the tree passes them all.
	stdout, stderr, code := script(t, "", "hack/check-imports.sh")
	want := treePure + treeNoClient + "check-imports: ./capacity ok (no-dispatcher)\ncheck-imports: ./controllers ok (no-dispatcher)\n"
	if diff := cmp.Diff([]any{0, want, ""}, []any{code, stdout, stderr}); diff != "" {
		t.Errorf("hack/check-imports.sh on the tree: exit code, stdout, stderr (-want +got):\n%s", diff)
	}
}

// What the default run prints for the pure and no-client checks of an
// unbroken tree.
const (
	treePure     = "check-imports: ./dispatcher/queue ok (pure)\ncheck-imports: ./api/policy/v1 ok (pure)\ncheck-imports: ./dispatcher/balancer ok (pure)\ncheck-imports: ./dispatcher/tokens ok (pure)\n"
	treeNoClient = "check-imports: ./capacity ok (no-client)\ncheck-imports: ./simulate ok (no-client)\n"
)

// TestCheckImportsKeepsControllerSideOffDispatcher adds a dispatcher import
// to a copy of the tree, once in capacity (which controllers imports) and
// once in controllers itself: the default run must name both ways in, since
// the controller side shares only api/policy/v1 with the dispatcher.
func TestCheckImportsKeepsControllerSideOffDispatcher(t *testing.T) {
	t.Parallel()
	dir := copyTree(t)
	const mod = "github.com/tiergate/tiergate/"
	for file, imp := range map[string]string{
		"capacity/leak.go":    mod + "dispatcher/queue",
		"controllers/leak.go": mod + "dispatcher/admin",
	} {
		pkg := filepath.Base(filepath.Dir(file))
		src := "package " + pkg + "\n\nimport _ \"" + imp + "\"\n"
		if err := os.WriteFile(filepath.Join(dir, file), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stdout, stderr, code := script(t, dir, "hack/check-imports.sh")
	want := []any{1, treePure + treeNoClient,
		"check-imports: ./capacity depends on forbidden packages (no-dispatcher); the way in:\n" +
			"  " + mod + "capacity imports " + mod + "dispatcher/queue\n" +
			"check-imports: ./controllers depends on forbidden packages (no-dispatcher); the way in:\n" +
			"  " + mod + "capacity imports " + mod + "dispatcher/queue\n" +
			"  " + mod + "controllers imports " + mod + "dispatcher/admin\n"}
	if diff := cmp.Diff(want, []any{code, stdout, stderr}); diff != "" {
		t.Errorf("exit code, stdout, stderr (-want +got):\n%s", diff)
	}
}

// TestCheckImportsGuardsCapacityAndSimulate adds a Kubernetes client to a
// copy of the tree, once in capacity (which simulate imports) and once in
// simulate itself: the default run, the one `make lint` makes, must name
// both ways in.
func TestCheckImportsGuardsCapacityAndSimulate(t *testing.T) {
	t.Parallel()
	dir := copyTree(t)
	for file, imp := range map[string]string{
		"capacity/leak.go": "sigs.k8s.io/controller-runtime/pkg/client",
		"simulate/leak.go": "k8s.io/client-go/rest",
	} {
		pkg := filepath.Base(filepath.Dir(file))
		src := "package " + pkg + "\n\nimport _ \"" + imp + "\"\n"
		if err := os.WriteFile(filepath.Join(dir, file), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stdout, stderr, code := script(t, dir, "hack/check-imports.sh")
	const mod = "github.com/tiergate/tiergate/"
	want := []any{1,
		treePure + "check-imports: ./capacity ok (no-dispatcher)\ncheck-imports: ./controllers ok (no-dispatcher)\n",
		"check-imports: ./capacity depends on forbidden packages (no-client); the way in:\n" +
			"  " + mod + "capacity imports sigs.k8s.io/controller-runtime/pkg/client\n" +
			"check-imports: ./simulate depends on forbidden packages (no-client); the way in:\n" +
			"  " + mod + "capacity imports sigs.k8s.io/controller-runtime/pkg/client\n" +
			"  " + mod + "simulate imports k8s.io/client-go/rest\n"}
	if diff := cmp.Diff(want, []any{code, stdout, stderr}); diff != "" {
		t.Errorf("exit code, stdout, stderr (-want +got):\n%s", diff)
	}
}

func TestEnsureDeb(t *testing.T) {
	t.Parallel()
	const missing = "tiergate-no-such-package"
	// Without root the script must refuse; as root, drop to nobody.
	asUser := []string{}
	if os.Geteuid() == 0 {
		asUser = []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"}
	}
	ensure := filepath.Join(repoRoot, "hack", "ensure-deb.sh")
	tests := map[string]struct {
		argv       []string
		wantCode   int
		wantStderr string
	}{
		"installed package":          {argv: []string{ensure, "bash"}},
		"installed package, no root": {argv: append(append([]string{}, asUser...), ensure, "bash")},
		"missing package, no root": {
			argv:     append(append([]string{}, asUser...), ensure, "bash", missing),
			wantCode: 1,
			wantStderr: "ensure-deb: missing Debian package(s): " + missing + "\n" +
				"ensure-deb: installing needs root; run: sudo apt-get install -y " + missing + "\n",
		},
		"no package named": {argv: []string{ensure}, wantCode: 2, wantStderr: "usage: " + ensure + " PACKAGE...\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := script(t, "", tc.argv...)
			if diff := cmp.Diff([]any{tc.wantCode, "", tc.wantStderr}, []any{code, stdout, stderr}); diff != "" {
				t.Errorf("exit code, stdout, stderr (-want +got):\n%s", diff)
			}
		})
	}
}

// copyTree copies the module's tracked files (as they are in the work tree)
// into a fresh git repository, with bin/ linked to the real one.
func copyTree(t *testing.T) string {
	t.Helper()
	dst := t.TempDir()
	out, _, code := script(t, "", "git", "ls-files", "-z")
	if code != 0 {
		t.Fatal("git ls-files failed")
	}
	for _, f := range strings.Split(strings.TrimRight(out, "\x00"), "\x00") {
		src := filepath.Join(repoRoot, f)
		fi, err := os.Lstat(src)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the work tree
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dst, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, f), data, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(repoRoot, "bin"), filepath.Join(dst, "bin")); err != nil {
		t.Fatal(err)
	}
	for _, argv := range [][]string{{"git", "init", "-q"}, {"git", "add", "-A"}} {
		if _, stderr, code := script(t, dst, argv...); code != 0 {
			t.Fatalf("%v: %s", argv, stderr)
		}
	}
	return dst
}

// edit replaces old with new in a file of dir, failing when old is absent.
func edit(t *testing.T, dir, file, old, new string) {
	t.Helper()
	p := filepath.Join(dir, file)
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte(old)) {
		t.Fatalf("%s does not contain %q", file, old)
	}
	if err := os.WriteFile(p, bytes.Replace(data, []byte(old), []byte(new), 1), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyFailsOnStaleGeneratedFiles(t *testing.T) {
	t.Parallel()
	dir := copyTree(t)

	stdout, stderr, code := script(t, dir, "hack/verify.sh")
	if code != 0 {
		t.Fatalf("verify on an unchanged copy of the tree: exit %d\n%s%s", code, stdout, stderr)
	}

	// A changed marker leaves both CRD copies stale; a hand-edited deepcopy
	// file, an unformatted Go file and a dangling reference are caught too.
	edit(t, dir, "api/v1alpha1/servicetier_types.go", `message="tenantShare must be greater than 0 and at most 1"`, `message="tenantShare must be in (0, 1]"`)
	edit(t, dir, "api/v1alpha1/zz_generated.deepcopy.go", "package v1alpha1\n", "package v1alpha1\n\n// edited by hand\n")
	edit(t, dir, "api/v1alpha1/common_types.go", "package v1alpha1\n", "package v1alpha1\nvar  unformatted = 1\n")
	// And a doc naming a file the tree does not have.
	edit(t, dir, "docs/fleet.md", "(Redis)\n\n", "(Redis)\n\nSee hack/gone.sh and [the old design](../OLD-NOTES.md).\n")

	_, stderr, code = script(t, dir, "hack/verify.sh")
	if code != 1 {
		t.Fatalf("verify on stale files: exit %d, want 1\n%s", code, stderr)
	}
	for _, want := range []string{
		"verify: config/crd/bases is stale; run 'make manifests generate' and commit the result\n",
		"verify: charts/tiergate/crds is stale; run 'make manifests generate' and commit the result\n",
		"verify: api/v1alpha1/zz_generated.deepcopy.go is stale; run 'make manifests generate' and commit the result\n",
		"verify: not gofmt-ed (run 'make fmt'):\napi/v1alpha1/common_types.go\n",
		"docs/fleet.md:3: reference to missing path ../OLD-NOTES.md\n" +
			"docs/fleet.md:3: reference to missing path hack/gone.sh\n" +
			"verify: dangling references (fix the path or the reference)\n",
		"-" + strings.Repeat(" ", 16) + "- message: tenantShare must be greater than 0 and at most 1\n",
		"+" + strings.Repeat(" ", 16) + "- message: tenantShare must be in (0, 1]\n",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("verify's stderr lacks %q:\n%s", want, stderr)
		}
	}
}
