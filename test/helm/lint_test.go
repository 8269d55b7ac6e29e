package helm

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestLint(t *testing.T) {
	allOptions := filepath.Join("test", "helm", "testdata", "all-options.yaml")
	tests := map[string][]string{
		"default":             nil,
		"default strict":      {"--strict"},
		"all options strict":  {"--strict", "-f", allOptions},
		"redis without TLS":   {"--strict", "--set", "redis.enabled=true,redis.address=redis:6379"},
		"second dispatch set": {"--strict", "--set", "controller.enabled=false,pushToken.existingSecret=tiergate-push-token,networkPolicy.controllerPeer.podSelector.matchLabels.app=x"},
	}
	for name, extra := range tests {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"lint", chartDir, "--kube-version", kubeVersion}, extra...)
			out := helm(t, args...)
			if !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
				t.Errorf("helm lint did not pass cleanly:\n%s", out)
			}
			if strings.Contains(out, "[WARNING]") || strings.Contains(out, "[ERROR]") {
				t.Errorf("helm lint reported problems:\n%s", out)
			}
		})
	}
}

// Lint must also fail: a value the schema refuses is an error.
func TestLintRefusesBadValues(t *testing.T) {
	r := helmCmd.Run("lint", chartDir, "--kube-version", kubeVersion, "--set", "controller.replicas=3")
	if !exitedNonZero(r) {
		t.Fatalf("helm lint with controller.replicas=3 passed:\n%s", r)
	}
	if want := "at '/controller/replicas': maximum: got 3, want 2"; !strings.Contains(r.Stdout+r.Stderr, want) {
		t.Errorf("helm lint output lacks %q:\n%s", want, r)
	}
}
