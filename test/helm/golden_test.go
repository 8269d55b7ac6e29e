package helm

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// tokenLine is the data line of the generated push token Secret.
var tokenLine = regexp.MustCompile(`(?m)^  token: "([^"]*)"$`)

const tokenPlaceholder = `  token: "<generated: 48 random alphanumerics, base64>"`

// normaliseToken checks the generated token of the default render and
// replaces it with a placeholder, so the golden is stable.
func normaliseToken(t *testing.T, out string) string {
	t.Helper()
	const marker = "# Source: tiergate/templates/push-token-secret.yaml\n"
	start := strings.Index(out, marker)
	if start < 0 {
		t.Fatal("the default render has no push token Secret")
	}
	end := strings.Index(out[start:], "\n---")
	if end < 0 {
		end = len(out) - start
	}
	doc := out[start : start+end]
	m := tokenLine.FindAllStringSubmatch(doc, -1)
	if len(m) != 1 {
		t.Fatalf("want one token line in the Secret, found %d:\n%s", len(m), doc)
	}
	raw, err := base64.StdEncoding.DecodeString(m[0][1])
	if err != nil {
		t.Fatalf("token is not base64: %v", err)
	}
	if !regexp.MustCompile(`^[A-Za-z0-9]{48}$`).Match(raw) {
		t.Fatalf("generated token %q is not 48 alphanumerics", raw)
	}
	return out[:start] + tokenLine.ReplaceAllString(doc, tokenPlaceholder) + out[start+end:]
}

func TestGolden(t *testing.T) {
	tests := map[string]struct {
		args      []string
		normalise bool
	}{
		"default":     {normalise: true},
		"all-options": {args: []string{"-f", filepath.Join("test", "helm", "testdata", "all-options.yaml")}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out := helm(t, templateArgs(tc.args...)...)
			if tc.normalise {
				out = normaliseToken(t, out)
			}
			golden := filepath.Join("testdata", name+".golden")
			if *update {
				if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if diff := cmp.Diff(string(want), out); diff != "" {
				t.Errorf("helm template differs from %s (-want +got); run with -update if the change is meant:\n%s", golden, diff)
			}
		})
	}
}

// The same values render the same bytes: nothing but the generated token
// may vary between runs.
func TestTemplateDeterministic(t *testing.T) {
	first := normaliseToken(t, helm(t, templateArgs()...))
	second := normaliseToken(t, helm(t, templateArgs()...))
	if diff := cmp.Diff(first, second); diff != "" {
		t.Errorf("two renders differ beyond the token (-first +second):\n%s", diff)
	}
	raw := func(s string) string { return tokenLine.FindStringSubmatch(s)[1] }
	a, b := raw(helm(t, templateArgs()...)), raw(helm(t, templateArgs()...))
	if a == b {
		t.Errorf("two renders without a cluster produced the same token %q: it is not random", a)
	}
}
