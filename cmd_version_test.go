package main

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestVersion(t *testing.T) {
	old := version
	t.Cleanup(func() { version = old })
	version = "v1.2.3-test"
	var stdout, stderr bytes.Buffer
	code := dispatch([]string{"version"}, &stdout, &stderr)
	want := "tiergate v1.2.3-test (" + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"
	if diff := cmp.Diff([]any{0, want, ""}, []any{code, stdout.String(), stderr.String()}); diff != "" {
		t.Errorf("code, stdout, stderr (-want +got):\n%s", diff)
	}
	stdout.Reset()
	stderr.Reset()
	code = dispatch([]string{"version", "extra"}, &stdout, &stderr)
	if diff := cmp.Diff([]any{2, "", "tiergate version: unexpected arguments [\"extra\"]\n"}, []any{code, stdout.String(), stderr.String()}); diff != "" {
		t.Errorf("stray argument: code, stdout, stderr (-want +got):\n%s", diff)
	}
}
