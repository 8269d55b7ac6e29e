package helm

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/tiergate/tiergate/internal/testutil"
	"github.com/tiergate/tiergate/internal/testutil/controlplane"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current chart")

const (
	// kubeVersion pins the capabilities helm template and lint assume, so
	// the output does not depend on how bin/helm was built.
	kubeVersion = "v1.37.2"
	// The release and namespace of the template tests.
	release   = "tiergate"
	namespace = "tiergate-system"
	// commandTimeout bounds every helm and kubectl run.
	commandTimeout = 2 * time.Minute
)

var (
	repoRoot   string
	chartDir   string
	k8sAssets  string // kube-apiserver, etcd and kubectl
	kubectlBin string
	helmHome   string
	// helmCmd is bin/helm with its homes under helmHome, run from the
	// repository root.
	helmCmd testutil.Tool
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	root, err := testutil.ModuleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	repoRoot = root
	chartDir = filepath.Join(root, "charts", "tiergate")
	if k8sAssets, err = controlplane.Assets(root); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	kubectlBin = filepath.Join(k8sAssets, "kubectl")
	helmBin := filepath.Join(root, "bin", "helm")
	if _, err := os.Stat(helmBin); err != nil {
		fmt.Fprintf(os.Stderr, "%s is missing: run `make tools` first (%v)\n", helmBin, err)
		return 1
	}
	// Helm keeps caches and repositories under its homes: keep them out of
	// the user's.
	helmHome, err = os.MkdirTemp("", "tiergate-helm-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(helmHome)
	helmCmd = command(testutil.Helm(helmBin, helmHome))
	code := m.Run()
	if err := stopControlPlane(); err != nil {
		fmt.Fprintf(os.Stderr, "stopping the control plane: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// command is c run from the repository root, each run bounded by
// commandTimeout.
func command(c testutil.Tool) testutil.Tool {
	c.Dir, c.Timeout = repoRoot, commandTimeout
	return c
}

// helm runs bin/helm and fails the test if it fails.
func helm(t *testing.T, args ...string) string {
	t.Helper()
	return helmCmd.Must(t, args...)
}

// templateArgs renders the chart as release "tiergate" in tiergate-system.
func templateArgs(extra ...string) []string {
	return append([]string{"template", release, chartDir, "--namespace", namespace, "--kube-version", kubeVersion}, extra...)
}

// render runs helm template and parses every document.
func render(t *testing.T, extra ...string) []*unstructured.Unstructured {
	t.Helper()
	return parseDocs(t, helm(t, templateArgs(extra...)...))
}

// parseDocs splits a multi-document YAML stream into objects.
func parseDocs(t *testing.T, stream string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(stream, "\n---") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("parsing rendered YAML: %v\n%s", err, doc)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs
}

// find returns the one object of a kind and name, failing when it is not
// rendered.
func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %q rendered; have %v", kind, name, names(objs))
	return nil
}

// names lists "Kind/name" of objects, for messages and comparisons.
func names(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind()+"/"+o.GetName())
	}
	return out
}

// field reads a nested field or fails.
func field[T any](t *testing.T, o *unstructured.Unstructured, path ...string) T {
	t.Helper()
	v, ok, err := unstructured.NestedFieldNoCopy(o.Object, path...)
	if err != nil || !ok {
		t.Fatalf("%s/%s has no field %s (err %v)", o.GetKind(), o.GetName(), strings.Join(path, "."), err)
	}
	typed, ok := v.(T)
	if !ok {
		t.Fatalf("%s/%s field %s is %T, not %T", o.GetKind(), o.GetName(), strings.Join(path, "."), v, typed)
	}
	return typed
}

// container returns the pod template's only container of a Deployment.
func container(t *testing.T, deploy *unstructured.Unstructured) map[string]any {
	t.Helper()
	cs := field[[]any](t, deploy, "spec", "template", "spec", "containers")
	if len(cs) != 1 {
		t.Fatalf("%s has %d containers, want 1", deploy.GetName(), len(cs))
	}
	return cs[0].(map[string]any)
}

// toYAMLValue converts a typed value to what sigs.k8s.io/yaml gives back, so
// cmp.Diff can compare wanted literals with parsed objects.
func toYAMLValue(t *testing.T, v any) any {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := yaml.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// exitedNonZero reports whether r is a run that exited with a status
// other than 0 (not one that was cut off or did not start).
func exitedNonZero(r testutil.Result) bool {
	code, ok := testutil.ExitCode(r.Err)
	return ok && code != 0
}
