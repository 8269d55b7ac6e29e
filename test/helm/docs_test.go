package helm

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// leaves lists the value paths of values.yaml. It descends into a map only
// where the schema describes its properties; maps the schema leaves free
// (labels, resources, security contexts) are one value.
func leaves(prefix string, values map[string]any, schema map[string]any, out *[]string) {
	props, _ := schema["properties"].(map[string]any)
	for k, v := range values {
		path := k
		if prefix != "" {
			path = prefix + "." + k
		}
		sub, _ := props[k].(map[string]any)
		if m, ok := v.(map[string]any); ok && sub != nil && sub["properties"] != nil {
			leaves(path, m, sub, out)
			continue
		}
		*out = append(*out, path)
	}
}

// schemaLeaves lists the property paths of the schema the same way.
func schemaLeaves(prefix string, schema map[string]any, out *[]string) {
	props, _ := schema["properties"].(map[string]any)
	for k, v := range props {
		path := k
		if prefix != "" {
			path = prefix + "." + k
		}
		sub := v.(map[string]any)
		if sub["properties"] != nil {
			schemaLeaves(path, sub, out)
			continue
		}
		*out = append(*out, path)
	}
}

func loadValuesAndSchema(t *testing.T) (map[string]any, map[string]any) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	raw, err = os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	return values, schema
}

var readmeRow = regexp.MustCompile("(?m)^\\| `([a-zA-Z0-9_.]+)` \\|")

func TestEveryValueDocumented(t *testing.T) {
	values, schema := loadValuesAndSchema(t)
	var fromValues, fromSchema []string
	leaves("", values, schema, &fromValues)
	schemaLeaves("", schema, &fromSchema)
	sort.Strings(fromValues)
	sort.Strings(fromSchema)

	// The schema describes every value and nothing else; "global" is
	// Helm's, accepted for use as a subchart.
	withGlobal := append([]string{"global"}, fromValues...)
	sort.Strings(withGlobal)
	if diff := cmp.Diff(withGlobal, fromSchema); diff != "" {
		t.Errorf("values.schema.json properties vs values.yaml (-values +schema):\n%s", diff)
	}

	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := bytes.Cut(readme, []byte("## Values\n"))
	if !ok {
		t.Fatal("README.md has no ## Values section")
	}
	var documented []string
	for _, m := range readmeRow.FindAllSubmatch(table, -1) {
		documented = append(documented, string(m[1]))
	}
	sort.Strings(documented)
	if diff := cmp.Diff(withGlobal, documented); diff != "" {
		t.Errorf("README values table vs values.yaml (-values +readme):\n%s", diff)
	}
}

// The chart's crds/ are copies of the generated CRDs.
func TestCRDsAreTheGeneratedOnes(t *testing.T) {
	generated, err := filepath.Glob(filepath.Join(repoRoot, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(generated) == 0 {
		t.Fatalf("no generated CRDs in config/crd/bases (%v)", err)
	}
	chart, err := filepath.Glob(filepath.Join(chartDir, "crds", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	base := func(paths []string) []string {
		var out []string
		for _, p := range paths {
			out = append(out, filepath.Base(p))
		}
		return out
	}
	if diff := cmp.Diff(base(generated), base(chart)); diff != "" {
		t.Fatalf("CRD files (-config/crd/bases +charts/tiergate/crds):\n%s", diff)
	}
	for _, g := range generated {
		want, err := os.ReadFile(g)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(chartDir, "crds", filepath.Base(g)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(want, got) {
			t.Errorf("charts/tiergate/crds/%s differs from config/crd/bases: run `make manifests`", filepath.Base(g))
		}
	}
}

// grants expands RBAC rules into "group resource verb" triples.
func grants(t *testing.T, rules []any) []string {
	t.Helper()
	set := map[string]bool{}
	for _, r := range rules {
		rule := r.(map[string]any)
		for _, g := range rule["apiGroups"].([]any) {
			for _, res := range rule["resources"].([]any) {
				for _, v := range rule["verbs"].([]any) {
					set[g.(string)+" "+res.(string)+" "+v.(string)] = true
				}
			}
		}
	}
	var out []string
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// The chart's ClusterRole grants what controller-gen derived from the
// controller's +kubebuilder:rbac markers, no more and no less.
func TestClusterRoleMatchesGenerated(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatalf("config/rbac/role.yaml (make manifests generates it): %v", err)
	}
	docs := parseDocs(t, string(raw))
	if len(docs) != 1 || docs[0].GetKind() != "ClusterRole" {
		t.Fatalf("config/rbac/role.yaml holds %v, want one ClusterRole", names(docs))
	}
	want := grants(t, field[[]any](t, docs[0], "rules"))
	got := grants(t, field[[]any](t, find(t, render(t), "ClusterRole", "tiergate-controller"), "rules"))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("chart ClusterRole grants (-config/rbac/role.yaml +chart):\n%s", diff)
	}
}
