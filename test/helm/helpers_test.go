package helm

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
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
	helmBin    string
	kubectlBin string
	helmHome   string
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	repoRoot = root
	chartDir = filepath.Join(root, "charts", "tiergate")
	helmBin = filepath.Join(root, "bin", "helm")
	kubectlBin = filepath.Join(root, "bin", "k8s", "kubectl")
	for _, b := range []string{helmBin, kubectlBin} {
		if _, err := os.Stat(b); err != nil {
			fmt.Fprintf(os.Stderr, "%s is missing: run `make tools` first (%v)\n", b, err)
			return 1
		}
	}
	// Helm keeps caches and repositories under its homes: keep them out of
	// the user's.
	helmHome, err = os.MkdirTemp("", "tiergate-helm-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(helmHome)
	code := m.Run()
	if err := stopControlPlane(); err != nil {
		fmt.Fprintf(os.Stderr, "stopping the control plane: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// result is one finished command.
type result struct {
	stdout, stderr string
	err            error
}

func (r result) String() string {
	return fmt.Sprintf("err: %v\nstdout:\n%s\nstderr:\n%s", r.err, r.stdout, r.stderr)
}

// run runs a binary with a bounded time and Helm's homes isolated.
func run(t *testing.T, env []string, bin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(helmHome, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(helmHome, "config"),
		"HELM_DATA_HOME="+filepath.Join(helmHome, "data"),
	)
	cmd.Env = append(cmd.Env, env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %s: timed out after %v", filepath.Base(bin), strings.Join(args, " "), commandTimeout)
	}
	return result{stdout: out.String(), stderr: errOut.String(), err: err}
}

// helm runs bin/helm and fails the test if it fails.
func helm(t *testing.T, args ...string) string {
	t.Helper()
	r := run(t, nil, helmBin, args...)
	if r.err != nil {
		t.Fatalf("helm %s:\n%s", strings.Join(args, " "), r)
	}
	return r.stdout
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

// exitErr reports whether err is a process that exited non-zero.
func exitErr(err error) bool {
	var e *exec.ExitError
	return errors.As(err, &e)
}
