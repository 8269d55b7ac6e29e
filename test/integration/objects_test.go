package integration

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// sample returns the object of kind and name from config/samples, so the
// tests mutate exactly what users are told to apply.
func sample(t *testing.T, kind, name string) *unstructured.Unstructured {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot, "config", "samples", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range bytes.Split(data, []byte("\n---\n")) {
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			js, err := yaml.YAMLToJSON(doc)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			u := &unstructured.Unstructured{}
			if err := u.UnmarshalJSON(js); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if u.GetKind() == kind && u.GetName() == name {
				return u
			}
		}
	}
	t.Fatalf("no %s %q in config/samples", kind, name)
	return nil
}

// readSample returns a file of config/samples.
func readSample(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "config", "samples", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// mutation changes an object; set and del build them from dotted paths.
type mutation func(t *testing.T, u *unstructured.Unstructured)

func set(path string, value any) mutation {
	return func(t *testing.T, u *unstructured.Unstructured) {
		t.Helper()
		if err := unstructured.SetNestedField(u.Object, value, strings.Split(path, ".")...); err != nil {
			t.Fatalf("set %s: %v", path, err)
		}
	}
}

func del(path string) mutation {
	return func(_ *testing.T, u *unstructured.Unstructured) {
		unstructured.RemoveNestedField(u.Object, strings.Split(path, ".")...)
	}
}
