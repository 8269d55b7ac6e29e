package testutil

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestToolRun(t *testing.T) {
	dir := t.TempDir()
	sh := Tool{Bin: "/bin/sh", Args: []string{"-c"}, Env: []string{"TESTUTIL_TOOL=from-env"}, Dir: dir}
	tests := map[string]struct {
		tool     Tool
		stdin    string
		args     []string
		want     Result
		wantCode int
	}{
		"leading args, env, dir and stdin": {
			tool: sh, stdin: "in\n", args: []string{`read x; echo "$x $TESTUTIL_TOOL $(pwd)"; echo oops >&2`},
			want: Result{Stdout: "in from-env " + dir + "\n", Stderr: "oops\n"},
		},
		"With adds leading args": {
			tool: Tool{Bin: "/bin/echo"}.With("a").With("b"), args: []string{"c"},
			want: Result{Stdout: "a b c\n"},
		},
		"exit status": {
			tool: sh, args: []string{"echo out; exit 3"},
			want: Result{Stdout: "out\n"}, wantCode: 3,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := tc.tool.RunInput(tc.stdin, tc.args...)
			if code, ok := ExitCode(got.Err); !ok || code != tc.wantCode {
				t.Errorf("exit %v, want status %d", got.Err, tc.wantCode)
			}
			tc.want.Line = strings.Join(append([]string{filepath.Base(tc.tool.Bin)}, tc.args...), " ")
			got.Err = nil
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	t.Run("the With copy leaves the original alone", func(t *testing.T) {
		base := Tool{Bin: "/bin/echo", Args: make([]string, 1, 4)}
		a, b := base.With("a"), base.With("b")
		if diff := cmp.Diff([][]string{{"", "a"}, {"", "b"}, {""}}, [][]string{a.Args, b.Args, base.Args}); diff != "" {
			t.Errorf("args (-want +got):\n%s", diff)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		start := time.Now()
		r := Tool{Bin: "/bin/sleep", Timeout: 100 * time.Millisecond}.Run("30")
		if !errors.Is(r.Err, ErrTimeout) || !strings.HasPrefix(r.Err.Error(), "timed out after 100ms (") {
			t.Errorf("Err = %v, want ErrTimeout", r.Err)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("the run took %s", took)
		}
	})
	t.Run("a missing program", func(t *testing.T) {
		r := Tool{Bin: "/nonexistent/testutil-tool"}.Run()
		if _, ok := ExitCode(r.Err); ok || !errors.Is(r.Err, os.ErrNotExist) {
			t.Errorf("Err = %v, want the start failure", r.Err)
		}
	})
}

func TestToolMust(t *testing.T) {
	sh := Tool{Bin: "/bin/sh", Args: []string{"-c"}}
	if got := sh.Must(t, "echo fine"); got != "fine\n" {
		t.Errorf("Must = %q", got)
	}
	if got := sh.MustInput(t, "piped", "cat"); got != "piped" {
		t.Errorf("MustInput = %q", got)
	}
	r := &recorder{TB: t}
	r.do(func() { sh.Must(r, "echo half; echo why >&2; exit 1") })
	want := "sh echo half; echo why >&2; exit 1: exit status 1\nstdout:\nhalf\n\nstderr:\nwhy\n"
	if diff := cmp.Diff([]string{want}, r.errs); diff != "" || !r.fatal {
		t.Errorf("failures (-want +got):\n%s", diff)
	}
}

// bin is root/bin/name, the tool `make tools` installs.
func bin(t *testing.T, name string) string {
	t.Helper()
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(root, "bin", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is missing: run `make tools` first (%v)", p, err)
	}
	return p
}

// The real helm keeps its homes where Helm says.
func TestHelmHomes(t *testing.T) {
	home := t.TempDir()
	out := Helm(bin(t, "helm"), home).Must(t, "env")
	for _, v := range []string{"CACHE", "CONFIG", "DATA"} {
		want := "HELM_" + v + "_HOME=\"" + filepath.Join(home, strings.ToLower(v)) + "\""
		if !strings.Contains(out, want+"\n") {
			t.Errorf("helm env lacks %s:\n%s", want, out)
		}
	}
}

// The real kubectl reads the kubeconfig Kubectl names.
func TestKubectlKubeconfig(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	const config = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: here, context: {cluster: c, user: u}}]
current-context: here
`
	if err := os.WriteFile(kc, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	k := Kubectl(bin(t, filepath.Join("k8s", "kubectl")), kc)
	if got := k.Must(t, "config", "current-context"); got != "here\n" {
		t.Errorf("current context %q, want here", got)
	}
	r := k.Run("get", "pods", "--request-timeout=2s")
	if r.Err == nil || !strings.Contains(r.Stderr, "127.0.0.1:1") {
		t.Errorf("kubectl get against nothing: %v", r)
	}
}
