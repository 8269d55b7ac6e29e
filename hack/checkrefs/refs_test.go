package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
)

// tree is a small repository: docs, a package, a script and a chart.
func tree() fstest.MapFS {
	return fstest.MapFS{
		"README.md":             {Data: []byte("See docs/architecture.md.\n")},
		"docs/architecture.md":  {Data: []byte("# Design\n")},
		"docs/fleet.md":         {Data: []byte("# Fleet\n")},
		"hack/tools.sh":         {Data: []byte("#!/usr/bin/env bash\n")},
		"dispatcher/queue/q.go": {Data: []byte("package queue\n")},
		"charts/c/values.yaml":  {Data: []byte("a: 1\n")},
	}
}

func TestCheck(t *testing.T) {
	tests := map[string]struct {
		file, src string
		want      []string
	}{
		"markdown words and links that resolve": {"docs/new.md", strings.Join([]string{
			"[the design](architecture.md), [fleet](./fleet.md#leases), [up](../README.md)",
			"[root](/hack/tools.sh) and [ref]: fleet.md",
			"docs/fleet.md, `hack/tools.sh`, dispatcher/queue's doc, fleet.md (beside this file)",
			"https://example.com/OLD-NOTES.md, <https://x.y/docs/gone.md>, [web](http://a/b.md), [top](#design), mailto:x@y.md",
			"patterns: docs/*.md, hack/{a,b}.sh, docs/<name>.md, $ROOT/docs/x.md, /tmp/docs/x.md",
			"prose: 3/4 of bin/k8s, ./hack/tools.sh., a word ending in \".md\"",
		}, "\n"), nil},
		"markdown misses": {"docs/new.md", strings.Join([]string{
			"[gone](gone.md) and [rooted](/docs/gone.md)",
			"OLD-NOTES.md section 4, hack/foo.sh, dispatcher/policy",
			"[ref]: ../nowhere/x.md",
			"[x](architecture.md \"title\") [y](<missing.md>)",
		}, "\n"), []string{
			"docs/new.md:1: reference to missing path gone.md",
			"docs/new.md:1: reference to missing path /docs/gone.md",
			"docs/new.md:2: reference to missing path OLD-NOTES.md",
			"docs/new.md:2: reference to missing path hack/foo.sh",
			"docs/new.md:2: reference to missing path dispatcher/policy",
			"docs/new.md:3: reference to missing path ../nowhere/x.md",
			"docs/new.md:4: reference to missing path missing.md",
		}},
		"go comments only": {"dispatcher/queue/x.go", strings.Join([]string{
			"// Package queue (OLD-NOTES.md section 5) is described in",
			"// docs/architecture.md and hack/tools.sh.",
			"package queue",
			"",
			`var s = "docs/gone.md hack/gone.sh" // but not hack/gone2.sh`,
			"/* a block comment",
			"   naming charts/c/values.yaml and charts/c/gone.yaml */",
			"var r = `OLD-NOTES.md`",
		}, "\n"), []string{
			"dispatcher/queue/x.go:1: reference to missing path OLD-NOTES.md",
			"dispatcher/queue/x.go:5: reference to missing path hack/gone2.sh",
			"dispatcher/queue/x.go:7: reference to missing path charts/c/gone.yaml",
		}},
		"hash comments": {"hack/x.sh", strings.Join([]string{
			"#!/usr/bin/env bash",
			"# Builds what hack/tools.sh and OLD-NOTES.md say.",
			`echo "$#" docs/gone.md # an inline comment is not judged: docs/gone2.md`,
			"  # indented: docs/gone3.md",
		}, "\n"), []string{
			"hack/x.sh:2: reference to missing path OLD-NOTES.md",
			"hack/x.sh:4: reference to missing path docs/gone3.md",
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fsys := tree()
			fsys[tc.file] = &fstest.MapFile{Data: []byte(tc.src)}
			missing, _, err := Check(fsys, []string{tc.file, "README.md", "docs/fleet.md", "hack/tools.sh", "dispatcher/queue/q.go", "charts/c/values.yaml"})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range missing {
				got = append(got, m.String())
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("missing (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("an unreadable file is an error", func(t *testing.T) {
		if _, _, err := Check(tree(), []string{"docs/absent.md"}); err == nil {
			t.Error("Check of a file that is not there succeeded")
		}
	})
}

// TestRun runs the command on a git repository: tracked files only, the
// exact report and the exit status.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git := func(args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	write("README.md", "Read docs/architecture.md.\n")
	write("docs/architecture.md", "# Design\n")
	write("hack/x.sh", "# see docs/architecture.md\n")
	git("init", "-q")
	git("add", "-A")
	// Untracked work in progress is not judged, nor a tracked file
	// deleted in the work tree.
	write("notes.md", "OLD-NOTES.md\n")
	write("old.md", "OLD-NOTES.md\n")
	git("add", "old.md")
	if err := os.Remove(filepath.Join(dir, "old.md")); err != nil {
		t.Fatal(err)
	}

	stdout, stderr, code := runCaptured(t, dir)
	if code != 0 || stderr != "" || stdout != "checkrefs: 2 references in 3 files resolve\n" {
		t.Errorf("clean tree: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}

	write("docs/architecture.md", "# Design\n\nOnce in [the brief](../OLD-NOTES.md); see hack/gone.sh.\n")
	stdout, stderr, code = runCaptured(t, dir)
	want := "docs/architecture.md:3: reference to missing path ../OLD-NOTES.md\n" +
		"docs/architecture.md:3: reference to missing path hack/gone.sh\n"
	if code != 1 || stdout != "" || stderr != want {
		t.Errorf("dangling references: exit %d, stdout %q, stderr %q, want exit 1 and stderr %q", code, stdout, stderr, want)
	}

	if _, stderr, code := runCaptured(t, t.TempDir()); code != 2 || !strings.HasPrefix(stderr, "checkrefs: git ls-files: ") {
		t.Errorf("outside a repository: exit %d, stderr %q, want 2 and a git ls-files error", code, stderr)
	}
}

// runCaptured is run(dir) with its stdout and stderr captured.
func runCaptured(t *testing.T, dir string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb strings.Builder
	code = run(dir, &out, &errb)
	return out.String(), errb.String(), code
}
