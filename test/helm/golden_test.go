package helm

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestGolden(t *testing.T) {
	tests := map[string]struct {
		args []string
	}{
		"default":     {},
		"all-options": {args: []string{"-f", filepath.Join("test", "helm", "testdata", "all-options.yaml")}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out := helm(t, templateArgs(tc.args...)...)
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

// The same values render the same bytes, token included: with the
// defaults the render holds no token at all (the controller creates the
// Secret), so applying two renders cannot change it.
func TestTemplateDeterministic(t *testing.T) {
	first, second := helm(t, templateArgs()...), helm(t, templateArgs()...)
	if diff := cmp.Diff(first, second); diff != "" {
		t.Errorf("two renders differ (-first +second):\n%s", diff)
	}
	for _, o := range parseDocs(t, first) {
		if o.GetKind() == "Secret" {
			t.Errorf("the default render holds Secret %s", o.GetName())
		}
	}
}
