package integration

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// What a user sees: kubectl apply refuses a bad object with a message that
// names the field, and exits 1.
func TestKubectlApplyRefusesBadObjects(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	applySamples(t, ns)

	tests := map[string]struct {
		manifest   string
		wantStderr string
	}{
		"share above 1": {
			manifest: `apiVersion: tiergate.dev/v1alpha1
kind: ServiceTier
metadata:
  name: greedy
spec:
  poolRef: {name: llm}
  basePriority: 5
  tolerableWait: 10s
  tenantShare: "1.5"
`,
			wantStderr: `The ServiceTier "greedy" is invalid: spec.tenantShare: Invalid value: "1.5": tenantShare must be greater than 0 and at most 1` + "\n",
		},
		"both ageing fields": {
			manifest: strings.Replace(readSample(t, "tiergate_v1alpha1_modelpool.yaml"),
				"    starvationBound: 120s\n", "    starvationBound: 120s\n    rate: 6s\n", 1),
			wantStderr: `The ModelPool "llm" is invalid: spec.ageing: Invalid value: ageing must set exactly one of rate and starvationBound` + "\n",
		},
		"tierRef changed on an existing quota": {
			manifest: `apiVersion: tiergate.dev/v1alpha1
kind: TenantQuota
metadata:
  name: initech
spec:
  tenant: initech
  tierRef: {name: premium}
`,
			wantStderr: `The TenantQuota "initech" is invalid: spec.tierRef: Invalid value: tierRef is immutable` + "\n",
		},
		"misspelt field": {
			manifest: `apiVersion: tiergate.dev/v1alpha1
kind: TenantQuota
metadata:
  name: hooli
spec:
  tenant: hooli
  tierRef: {name: free}
  maxConcurency: 2
`,
			wantStderr: `Error from server (BadRequest): error when creating "STDIN": TenantQuota in version "v1alpha1" cannot be handled as a TenantQuota: strict decoding error: unknown field "spec.maxConcurency"` + "\n",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			stdout, stderr, err := kubectlWithInput(t, tc.manifest, "apply", "-n", ns, "-f", "-")
			var exitErr *exec.ExitError
			if !errors.As(err, &exitErr) || exitErr.ExitCode() != 1 {
				t.Fatalf("kubectl apply: err = %v, want exit status 1\nstdout: %s", err, stdout)
			}
			if diff := cmp.Diff(tc.wantStderr, stderr); diff != "" {
				t.Errorf("stderr (-want +got):\n%s", diff)
			}
			if stdout != "" {
				t.Errorf("stdout = %q, want nothing", stdout)
			}
		})
	}
}
